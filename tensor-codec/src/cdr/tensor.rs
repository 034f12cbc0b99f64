//! `tensor_msgs/msg/ExperimentalTensor` and its conversions to and from [`TensorMeta`].

use super::{BufferData, CdrDecodeError, CdrEncodeError, CudaBufferDescriptor, Reader, Writer};
use crate::meta::{MAX_RANK, check_layout};
use crate::{DType, Device, MetaError, TensorMeta};

/// `tensor_msgs/msg/ExperimentalTensor` (the DLPack-aligned message of
/// `rosidl_buffer_backends`), generic over the `data` field: `Vec<u8>` when owned, `&[u8]`
/// when borrowed from the input by [`ExperimentalTensor::decode_cdr_borrowed`].
///
/// The CDR codec carries the fields as they are; [`ExperimentalTensor::meta`] validates
/// them. The message has no device field: the device comes from the transport.
///
/// ```
/// use tensor_codec::cdr::ExperimentalTensor;
/// use tensor_codec::{DType, Device, TensorMeta};
///
/// let meta = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::CPU);
/// let msg = meta.to_experimental_tensor(vec![0u8; 24])?;
/// let bytes = msg.encode_cdr()?;
/// assert_eq!(bytes.len(), 72);
/// let view = ExperimentalTensor::decode_cdr_borrowed(&bytes)?;
/// assert_eq!(view.meta(Device::CPU)?, meta);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ExperimentalTensor<D = Vec<u8>> {
    /// `uint8 dtype_code`: DLPack `DLDataTypeCode`.
    pub dtype_code: u8,
    /// `uint8 dtype_bits`.
    pub dtype_bits: u8,
    /// `uint16 dtype_lanes`.
    pub dtype_lanes: u16,
    /// `int64[] shape`.
    pub shape: Vec<i64>,
    /// `int64[] strides`, in elements; empty means compact row-major.
    pub strides: Vec<i64>,
    /// `uint64 byte_offset`: offset of the first element in `data`.
    pub byte_offset: u64,
    /// `uint8[] data`. May be longer than the view needs.
    pub data: D,
}

impl<D> ExperimentalTensor<D> {
    /// Replaces the `data` field through `f`, keeping every other field.
    pub fn map_data<E>(self, f: impl FnOnce(D) -> E) -> ExperimentalTensor<E> {
        ExperimentalTensor {
            dtype_code: self.dtype_code,
            dtype_bits: self.dtype_bits,
            dtype_lanes: self.dtype_lanes,
            shape: self.shape,
            strides: self.strides,
            byte_offset: self.byte_offset,
            data: f(self.data),
        }
    }

    /// The element type, if the `(dtype_code, dtype_bits, dtype_lanes)` triple is
    /// supported.
    ///
    /// # Errors
    /// [`MetaError::UnsupportedDType`].
    pub fn dtype(&self) -> Result<DType, MetaError> {
        DType::new(self.dtype_code, self.dtype_bits, self.dtype_lanes)
    }

    /// Encodes every field before the data bytes, ending with the `data` length field set
    /// to `data_len`. The complete message is this prefix followed by exactly `data_len`
    /// data bytes.
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a sequence or `data_len` exceeds `u32`.
    pub fn encode_cdr_prefix(&self, data_len: usize) -> Result<Vec<u8>, CdrEncodeError> {
        let mut w = Writer::with_capacity(self.prefix_capacity());
        self.write_prefix(&mut w, data_len)?;
        Ok(w.into_inner())
    }

    fn prefix_capacity(&self) -> usize {
        (self.shape.len().saturating_add(self.strides.len())).saturating_mul(8).saturating_add(48)
    }

    /// Encodes the message with a CUDA buffer descriptor in place of the data bytes
    /// (the descriptor form of a `rosidl::Buffer` field, layout as `d.layout` says).
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a sequence exceeds `u32` in length.
    pub fn encode_cdr_cuda(&self, d: &CudaBufferDescriptor) -> Result<Vec<u8>, CdrEncodeError> {
        let mut w = Writer::with_capacity(self.prefix_capacity().saturating_add(200 + d.vmm_socket_path.len()));
        self.write_fields(&mut w)?;
        w.cuda_descriptor(d)?;
        Ok(w.into_inner())
    }

    fn write_prefix(&self, w: &mut Writer, data_len: usize) -> Result<(), CdrEncodeError> {
        self.write_fields(w)?;
        w.seq_len(data_len, "data")
    }

    /// Every field before `data`.
    fn write_fields(&self, w: &mut Writer) -> Result<(), CdrEncodeError> {
        w.u8(self.dtype_code);
        w.u8(self.dtype_bits);
        w.u16(self.dtype_lanes);
        w.i64_seq(&self.shape, "shape")?;
        w.i64_seq(&self.strides, "strides")?;
        w.u64(self.byte_offset);
        Ok(())
    }
}

impl<D: AsRef<[u8]>> ExperimentalTensor<D> {
    /// Encodes the message: `00 01 00 00` followed by the little-endian CDR body.
    ///
    /// # Errors
    /// [`CdrEncodeError::TooLong`] if a sequence exceeds `u32` in length.
    pub fn encode_cdr(&self) -> Result<Vec<u8>, CdrEncodeError> {
        let data = self.data.as_ref();
        let mut w = Writer::with_capacity(self.prefix_capacity().saturating_add(data.len()));
        self.write_prefix(&mut w, data.len())?;
        w.extend(data);
        Ok(w.into_inner())
    }

    /// A copy with owned `data`.
    pub fn to_owned_data(&self) -> ExperimentalTensor<Vec<u8>> {
        ExperimentalTensor {
            dtype_code: self.dtype_code,
            dtype_bits: self.dtype_bits,
            dtype_lanes: self.dtype_lanes,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            byte_offset: self.byte_offset,
            data: self.data.as_ref().to_vec(),
        }
    }

    /// The validated [`TensorMeta`] of this message, with `device` supplied by the caller
    /// (the message has none). Strides are kept as they are (empty stays empty, meaning
    /// row-major). Validates against `data.len()`; see [`TensorMeta::validate`].
    ///
    /// # Errors
    /// The [`MetaError`] of the first rule that fails.
    pub fn meta(&self, device: Device) -> Result<TensorMeta, MetaError> {
        TensorMeta::from_experimental_tensor(self, device)
    }
}

impl<'a> ExperimentalTensor<&'a [u8]> {
    /// Decodes a CDR message (little- or big-endian) without copying `data`, which
    /// borrows from `bytes`.
    ///
    /// # Errors
    /// A [`CdrDecodeError`] naming the field that could not be read.
    /// A buffer descriptor in place of the data is refused with
    /// [`CdrDecodeError::BufferDescriptor`]: see [`ExperimentalTensor::decode_cdr_buffer`].
    pub fn decode_cdr_borrowed(bytes: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let mut r = Reader::new(bytes)?;
        let fields = ExperimentalTensor::read_fields(&mut r)?;
        r.descriptor_ahead("data")?;
        let data = r.bytes("data")?;
        r.finish()?;
        Ok(fields.map_data(|()| data))
    }

    /// Copies `data` into an owned message.
    pub fn into_owned(self) -> ExperimentalTensor<Vec<u8>> {
        self.map_data(<[u8]>::to_vec)
    }
}

impl<'a> ExperimentalTensor<BufferData<'a>> {
    /// Decodes a CDR message whose data is in either form of a `rosidl::Buffer` field:
    /// the bytes (borrowed from `bytes`) or the CUDA backend's descriptor.
    ///
    /// # Errors
    /// A [`CdrDecodeError`] naming the field that could not be read;
    /// [`CdrDecodeError::UnknownBufferBackend`] for another backend's descriptor.
    pub fn decode_cdr_buffer(bytes: &'a [u8]) -> Result<Self, CdrDecodeError> {
        let mut r = Reader::new(bytes)?;
        let fields = ExperimentalTensor::read_fields(&mut r)?;
        let data = r.last_buffer("data")?;
        r.finish()?;
        Ok(fields.map_data(|()| data))
    }
}

impl ExperimentalTensor<()> {
    /// Every field before `data`.
    fn read_fields(r: &mut Reader<'_>) -> Result<Self, CdrDecodeError> {
        let dtype_code = r.u8("dtype_code")?;
        let dtype_bits = r.u8("dtype_bits")?;
        let dtype_lanes = r.u16("dtype_lanes")?;
        let shape = r.i64_seq("shape")?;
        let strides = r.i64_seq("strides")?;
        let byte_offset = r.u64("byte_offset")?;
        Ok(ExperimentalTensor { dtype_code, dtype_bits, dtype_lanes, shape, strides, byte_offset, data: () })
    }
}

impl ExperimentalTensor<Vec<u8>> {
    /// Decodes a CDR message (little- or big-endian), copying `data`.
    ///
    /// # Errors
    /// As [`ExperimentalTensor::decode_cdr_borrowed`].
    pub fn decode_cdr(bytes: &[u8]) -> Result<Self, CdrDecodeError> {
        ExperimentalTensor::decode_cdr_borrowed(bytes).map(ExperimentalTensor::into_owned)
    }
}

impl TensorMeta {
    /// Builds and validates the metadata of an `ExperimentalTensor` message, whose data
    /// lives on `device` (the message has no device field). Validates against
    /// `msg.data.len()`; the rank is checked before anything is copied.
    ///
    /// # Errors
    /// The [`MetaError`] of the first rule that fails (see [`TensorMeta::validate`]).
    pub fn from_experimental_tensor<D: AsRef<[u8]>>(
        msg: &ExperimentalTensor<D>,
        device: Device,
    ) -> Result<TensorMeta, MetaError> {
        let dtype = msg.dtype()?;
        if device.device_id < 0 {
            return Err(MetaError::InvalidDeviceId { value: device.device_id });
        }
        if msg.shape.len() > MAX_RANK {
            return Err(MetaError::RankTooLarge { rank: msg.shape.len(), max: MAX_RANK });
        }
        let payload_len = msg.data.as_ref().len() as u64;
        check_layout(dtype, &msg.shape, &msg.strides, msg.byte_offset, payload_len)?;
        Ok(TensorMeta {
            dtype,
            shape: msg.shape.clone(),
            strides: msg.strides.clone(),
            byte_offset: msg.byte_offset,
            device,
        })
    }

    /// The `ExperimentalTensor` message for this view over `data`, after validating
    /// against `data.len()`. The device is dropped (the message has no field for it);
    /// strides are copied as they are (empty stays empty).
    ///
    /// # Errors
    /// The [`MetaError`] of the first rule that fails.
    pub fn to_experimental_tensor<D: AsRef<[u8]>>(&self, data: D) -> Result<ExperimentalTensor<D>, MetaError> {
        self.validate(data.as_ref().len() as u64)?;
        let dl = self.dtype.to_dl();
        Ok(ExperimentalTensor {
            dtype_code: dl.code,
            dtype_bits: dl.bits,
            dtype_lanes: dl.lanes,
            shape: self.shape.clone(),
            strides: self.strides.clone(),
            byte_offset: self.byte_offset,
            data,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn example() -> ExperimentalTensor<Vec<u8>> {
        ExperimentalTensor {
            dtype_code: 2,
            dtype_bits: 32,
            dtype_lanes: 1,
            shape: vec![2, 3],
            strides: vec![],
            byte_offset: 0,
            data: (0..24).collect(),
        }
    }

    /// The shape [2,3] float32 layout of research/rmw_zenoh.md §3 (72 bytes; the int64
    /// elements of `shape` start at body offset 8, already aligned, so no padding
    /// precedes them; `byte_offset` is padded from 28 to 32).
    #[test]
    fn documented_layout() {
        let bytes = example().encode_cdr().unwrap();
        let mut expected = vec![0x00, 0x01, 0x00, 0x00];
        expected.extend_from_slice(&[2, 32, 1, 0]); // code, bits, lanes
        expected.extend_from_slice(&[2, 0, 0, 0]); // shape count
        expected.extend_from_slice(&2i64.to_le_bytes());
        expected.extend_from_slice(&3i64.to_le_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0]); // strides count
        expected.extend_from_slice(&[0, 0, 0, 0]); // pad to 8
        expected.extend_from_slice(&0u64.to_le_bytes());
        expected.extend_from_slice(&[24, 0, 0, 0]);
        expected.extend(0..24u8);
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), 72);
        assert_eq!(example().encode_cdr_prefix(24).unwrap(), bytes[..48]);
    }

    #[test]
    fn padding_when_strides_present() {
        // One shape entry: count at 4, element at 8; strides count at 16, element at 24.
        let m = ExperimentalTensor {
            dtype_code: 1,
            dtype_bits: 8,
            dtype_lanes: 1,
            shape: vec![-1],
            strides: vec![i64::MIN],
            byte_offset: u64::MAX,
            data: vec![9u8],
        };
        let bytes = m.encode_cdr().unwrap();
        assert_eq!(bytes.len(), 4 + 4 + 4 + 8 + 4 + 4 + 8 + 8 + 4 + 1);
        let back = ExperimentalTensor::decode_cdr(&bytes).unwrap();
        assert_eq!(back, m);
        // Borrowed decode points into the input.
        let view = ExperimentalTensor::decode_cdr_borrowed(&bytes).unwrap();
        assert_eq!(view.data.as_ptr(), bytes[bytes.len() - 1..].as_ptr());
        assert_eq!(view.to_owned_data(), m);
    }

    #[test]
    fn big_endian_input() {
        let mut be = vec![0x00, 0x00, 0x00, 0x00];
        be.extend_from_slice(&[2, 16, 0, 1]); // code, bits, lanes (BE)
        be.extend_from_slice(&[0, 0, 0, 1]); // shape count
        be.extend_from_slice(&3i64.to_be_bytes());
        be.extend_from_slice(&[0, 0, 0, 1]); // strides count
        be.extend_from_slice(&[0, 0, 0, 0]); // pad
        be.extend_from_slice(&1i64.to_be_bytes());
        be.extend_from_slice(&2u64.to_be_bytes());
        be.extend_from_slice(&[0, 0, 0, 8]);
        be.extend_from_slice(&[0; 8]);
        let m = ExperimentalTensor::decode_cdr(&be).unwrap();
        assert_eq!((m.dtype_code, m.dtype_bits, m.dtype_lanes), (2, 16, 1));
        assert_eq!((m.shape.as_slice(), m.strides.as_slice(), m.byte_offset), (&[3][..], &[1][..], 2));
        assert_eq!(m.meta(Device::CPU).unwrap().dtype, DType::F16);
    }

    #[test]
    fn every_truncation_names_a_field() {
        let mut m = example();
        m.strides = vec![3, 1];
        let bytes = m.encode_cdr().unwrap();
        let fields =
            ["encapsulation", "dtype_code", "dtype_bits", "dtype_lanes", "shape", "strides", "byte_offset", "data"];
        for cut in 0..bytes.len() {
            match ExperimentalTensor::decode_cdr_borrowed(&bytes[..cut]) {
                Err(CdrDecodeError::Truncated { field, .. }) => {
                    assert!(fields.contains(&field), "cut {cut}: {field}")
                }
                other => panic!("cut {cut}: {other:?}"),
            }
        }
        let mut lying = bytes.clone();
        lying[8..12].copy_from_slice(&0x2000_0000u32.to_le_bytes()); // shape count 2^29
        assert_eq!(
            ExperimentalTensor::decode_cdr_borrowed(&lying).unwrap_err(),
            CdrDecodeError::Truncated { field: "shape", needed: 1 << 32, available: bytes.len() - 12 }
        );
    }

    #[test]
    fn meta_conversions() {
        let msg = example();
        let meta = msg.meta(Device::cuda(2)).unwrap();
        assert_eq!(meta, TensorMeta::contiguous(DType::F32, vec![2, 3], Device::cuda(2)));
        let back = meta.to_experimental_tensor(msg.data.clone()).unwrap();
        assert_eq!(back, msg);
        // Views keep strides and offset.
        let view = meta.clone().with_strides(vec![1, 2]).with_byte_offset(0);
        let msg = view.to_experimental_tensor(&msg.data[..]).unwrap();
        assert_eq!(msg.strides, vec![1, 2]);
        assert_eq!(msg.meta(Device::cuda(2)).unwrap(), view);
    }

    #[test]
    fn meta_rejections() {
        let mut m = example();
        m.dtype_code = 3;
        assert_eq!(m.meta(Device::CPU), Err(MetaError::UnsupportedDType { code: 3, bits: 32, lanes: 1 }));
        let mut m = example();
        m.data.truncate(23);
        assert_eq!(m.meta(Device::CPU), Err(MetaError::SpanOutOfBounds { needed: 24, available: 23 }));
        let m = example();
        assert_eq!(m.meta(Device::cuda(-1)), Err(MetaError::InvalidDeviceId { value: -1 }));
        let mut m = example();
        m.shape = vec![1; 65];
        assert_eq!(m.meta(Device::CPU), Err(MetaError::RankTooLarge { rank: 65, max: 64 }));
        let mut m = example();
        m.strides = vec![1];
        assert_eq!(m.meta(Device::CPU), Err(MetaError::StridesLenMismatch { strides: 1, rank: 2 }));
        let meta = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::CPU);
        assert_eq!(
            meta.to_experimental_tensor(vec![0u8; 8]),
            Err(MetaError::SpanOutOfBounds { needed: 24, available: 8 })
        );
    }
}
