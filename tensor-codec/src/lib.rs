//! Tensor metadata and ROS 2 messages for zenoh-cuda-shm, with no CUDA and no Zenoh.
//!
//! - [`dtype`]: every DLPack v1.3 type code, the `(code, bits, lanes)` triple and the
//!   whitelist ([`DType`], [`DTypeCode`], [`DLDataType`]).
//! - [`device`]: DLPack device types and ordinals ([`Device`], [`DeviceType`]).
//! - [`meta`]: [`TensorMeta`] (dtype, shape, strides in elements, byte offset, device) and
//!   its validator, which every decoder runs and producers call before sending.
//! - [`wire`]: the versioned postcard encoding of [`TensorMeta`].
//! - [`cdr`]: byte-exact XCDR1 for `sensor_msgs/msg/Image` and
//!   `tensor_msgs/msg/ExperimentalTensor`, with zero-copy decoding of `data`.
//! - [`type_hash`]: RIHS01 type hashes, computed from the type descriptions, and the type
//!   names rmw_zenoh uses in key expressions.
//!
//! Every decoder is written for hostile input: lengths are checked before allocating,
//! arithmetic is checked, and every rejection is a typed error naming the field. Nothing
//! in this crate panics on any input, and it contains no `unsafe`.
//!
//! ```
//! use tensor_codec::cdr::ExperimentalTensor;
//! use tensor_codec::type_hash::RosMessage;
//! use tensor_codec::{DType, Device, MetaError, TensorMeta};
//!
//! // A producer describes a 2x3 float32 tensor in a 24-byte CUDA buffer...
//! let meta = TensorMeta::contiguous(DType::F32, vec![2, 3], Device::cuda(0));
//! let wire = meta.encode(24)?; // validates, then writes the version byte + postcard
//!
//! // ...and a consumer decodes it against the payload it actually received.
//! assert_eq!(TensorMeta::decode(&wire, 24)?, meta);
//! assert!(TensorMeta::decode(&wire, 16).is_err()); // the view would overrun 16 bytes
//!
//! // The same view as a ROS 2 message, for plain rmw_zenoh subscribers.
//! let msg = meta.to_experimental_tensor(vec![0u8; 24])?;
//! let cdr = msg.encode_cdr()?;
//! assert_eq!(&cdr[..4], &[0x00, 0x01, 0x00, 0x00]);
//! let view = ExperimentalTensor::decode_cdr_borrowed(&cdr)?; // `data` borrows `cdr`
//! assert_eq!(view.meta(Device::cuda(0))?, meta);
//! assert_eq!(
//!     ExperimentalTensor::<Vec<u8>>::DDS_TYPE_NAME,
//!     "tensor_msgs::msg::dds_::ExperimentalTensor_"
//! );
//! assert!(ExperimentalTensor::<Vec<u8>>::type_hash().to_string().starts_with("RIHS01_"));
//!
//! // Rejections name the field.
//! let bad = TensorMeta::contiguous(DType::F32, vec![2, -3], Device::CPU);
//! assert_eq!(bad.validate(24), Err(MetaError::InvalidShape { dim: 1, value: -3 }));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

#![forbid(unsafe_code)]

pub mod cdr;
pub mod device;
pub mod dtype;
pub mod meta;
pub mod type_hash;
pub mod wire;

pub use device::{Device, DeviceType};
pub use dtype::{DLDataType, DType, DTypeCode};
pub use meta::{Extent, MAX_RANK, MetaError, TensorMeta, contiguous_strides};
pub use wire::{DecodeError, EncodeError, META_VERSION};
