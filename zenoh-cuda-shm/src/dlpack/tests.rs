//! The DLPack layer's unit tests: layouts, exports and imports on host memory.

use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, Ordering};

use tensor_codec::{DType, Device, MetaError};

use super::*;

static DELETED: AtomicU32 = AtomicU32::new(0);

/// A foreign producer: a heap struct over `data`, whose deleter counts its calls.
struct Foreign {
    managed: DLManagedTensorVersioned,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

unsafe extern "C" fn foreign_deleter(p: *mut DLManagedTensorVersioned) {
    DELETED.fetch_add(1, Ordering::SeqCst);
    // SAFETY: `p` is the first field of a leaked `Foreign` (repr(Rust) but `managed`
    // is recovered through `manager_ctx`, which holds the box pointer).
    let ctx = unsafe { (*p).manager_ctx };
    // SAFETY: `manager_ctx` is `Box::into_raw` of the `Foreign`, deleted once.
    drop(unsafe { Box::from_raw(ctx.cast::<Foreign>()) });
}

fn foreign(data: *mut c_void, dtype: DType, shape: &[i64], strides: Option<&[i64]>, major: u32) -> DlpackTensor {
    let mut f = Box::new(Foreign {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion { major, minor: 0 },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(foreign_deleter),
            flags: 0,
            dl_tensor: DLTensor {
                data,
                device: Device::CPU.into(),
                ndim: shape.len() as i32,
                dtype: dtype.to_dl(),
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape: shape.to_vec(),
        strides: strides.map(<[i64]>::to_vec).unwrap_or_default(),
    });
    f.managed.dl_tensor.shape = f.shape.as_mut_ptr();
    if strides.is_some() {
        f.managed.dl_tensor.strides = f.strides.as_mut_ptr();
    }
    let raw = Box::into_raw(f);
    // SAFETY: `raw` is a live, uniquely owned box.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    // SAFETY: `raw` points to its first field's struct, valid until the deleter, which
    // only the returned owner calls.
    let p = unsafe { std::ptr::addr_of_mut!((*raw).managed) };
    // SAFETY: as above: a valid struct whose deleter frees it, callable from any thread.
    DlpackTensor::Versioned(unsafe { ManagedTensorVersioned::from_raw(p) }.unwrap())
}

#[test]
fn import_validation_names_the_field_and_deletes_once() {
    let mut buf = [0u64; 8];
    let data = buf.as_mut_ptr().cast::<c_void>();
    let before = DELETED.load(Ordering::SeqCst);
    let t = foreign(data, DType::F32, &[2, 3], None, 1);
    let meta = t.tensor_meta().unwrap();
    assert_eq!((meta.shape.as_slice(), meta.strides.as_slice()), (&[2i64, 3][..], &[][..]));
    drop(t);
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 1);

    let t = foreign(data, DType::F32, &[2, 3], None, 2);
    assert!(matches!(t.tensor_meta(), Err(ImportError::UnsupportedVersion { major: 2, minor: 0 })));
    drop(t);
    let t = foreign(data, DType::F32, &[2, -3], None, 1);
    assert!(matches!(t.tensor_meta(), Err(ImportError::Meta(MetaError::InvalidShape { dim: 1, value: -3 }))));
    drop(t);
    let t = foreign(data, DType::F32, &[2, 3], Some(&[1, -1]), 1);
    assert!(matches!(t.tensor_meta(), Err(ImportError::Meta(MetaError::NegativeStride { dim: 1, value: -1 }))));
    drop(t);
    let t = foreign(std::ptr::null_mut(), DType::F32, &[2], None, 1);
    assert!(matches!(t.tensor_meta(), Err(ImportError::NullData { bytes: 8 })));
    drop(t);
    // A zero-size tensor may have NULL data.
    let t = foreign(std::ptr::null_mut(), DType::F32, &[0, 4], None, 1);
    assert_eq!(t.tensor_meta().unwrap().numel().unwrap(), 0);
    drop(t);
    // SAFETY: one byte into a live buffer: a misaligned but valid address.
    let odd = unsafe { data.cast::<u8>().add(2) }.cast::<c_void>();
    let t = foreign(odd, DType::F32, &[1], None, 1);
    assert!(matches!(t.tensor_meta(), Err(ImportError::MisalignedData { itemsize: 4, .. })));
    drop(t);
    assert_eq!(DELETED.load(Ordering::SeqCst), before + 7);
}

#[test]
fn consumer_stream_values() {
    // SAFETY: only non-pointer values.
    unsafe {
        assert!(matches!(ConsumerStream::from_dlpack(0), Err(ExportError::InvalidStream { value: 0 })));
    }
    // SAFETY: as above.
    let s = unsafe { ConsumerStream::from_dlpack(-2) };
    assert!(matches!(s, Err(ExportError::InvalidStream { value: -2 })));
    // SAFETY: as above.
    let s = unsafe { ConsumerStream::from_dlpack(-1) }.unwrap();
    assert!(matches!(s.0, StreamKind::NoSync));
    // SAFETY: as above.
    let s = unsafe { ConsumerStream::from_dlpack(1) }.unwrap();
    assert!(matches!(s.0, StreamKind::LegacyDefault));
    // SAFETY: as above.
    let s = unsafe { ConsumerStream::from_dlpack(2) }.unwrap();
    assert!(matches!(s.0, StreamKind::PerThreadDefault));
}
