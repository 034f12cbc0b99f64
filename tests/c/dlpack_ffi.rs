//! Rust declarations of `tests/c/consume_dlpack.c` (compiled by `tests/build.rs`), shared
//! by the tensor tests through `#[path]`: a C consumer that reads DLPack structs field by
//! field and calls their deleters, and a C producer of DLPack tensors whose deleter counts
//! its calls.

use zenoh_cuda_shm::dlpack::{DLManagedTensor, DLManagedTensorVersioned, ManagedTensorLegacy, ManagedTensorVersioned};

/// Dimensions the C side copies into [`Summary`].
pub const MAX_DIMS: usize = 8;

/// What the C consumer read (mirrors `zcs_dl_summary`).
#[repr(C)]
#[derive(Debug, Default, Clone)]
pub struct Summary {
    /// 1 for a versioned struct.
    pub versioned: i32,
    /// `version.major` (versioned only).
    pub version_major: u32,
    /// `version.minor` (versioned only).
    pub version_minor: u32,
    /// Whether `deleter` is set.
    pub has_deleter: i32,
    /// `flags` (versioned only).
    pub flags: u64,
    /// `manager_ctx` as an address.
    pub manager_ctx: u64,
    /// `dl_tensor.data` as an address.
    pub data: u64,
    /// `dl_tensor.device.device_type`.
    pub device_type: i32,
    /// `dl_tensor.device.device_id`.
    pub device_id: i32,
    /// `dl_tensor.ndim`.
    pub ndim: i32,
    /// `dl_tensor.dtype.code`.
    pub code: u8,
    /// `dl_tensor.dtype.bits`.
    pub bits: u8,
    /// `dl_tensor.dtype.lanes`.
    pub lanes: u16,
    /// Whether `dl_tensor.shape` is NULL.
    pub shape_null: i32,
    /// Whether `dl_tensor.strides` is NULL.
    pub strides_null: i32,
    /// The first `ndim` dimensions.
    pub shape: [i64; MAX_DIMS],
    /// The first `ndim` strides.
    pub strides: [i64; MAX_DIMS],
    /// `dl_tensor.byte_offset`.
    pub byte_offset: u64,
    /// Bytes the C side copied from a `kDLCPU` tensor's first element.
    pub host_copied: u64,
}

impl Summary {
    /// The dimensions read.
    pub fn shape(&self) -> &[i64] {
        &self.shape[..self.ndim.clamp(0, MAX_DIMS as i32) as usize]
    }

    /// The strides read.
    pub fn strides(&self) -> &[i64] {
        &self.strides[..self.ndim.clamp(0, MAX_DIMS as i32) as usize]
    }
}

unsafe extern "C" {
    fn zcs_dlpack_inspect_versioned(
        m: *const DLManagedTensorVersioned,
        out: *mut Summary,
        host_copy: *mut u8,
        copy_len: u64,
    ) -> i32;
    fn zcs_dlpack_inspect_legacy(
        m: *const DLManagedTensor,
        out: *mut Summary,
        host_copy: *mut u8,
        copy_len: u64,
    ) -> i32;
    fn zcs_dlpack_delete_versioned(m: *mut DLManagedTensorVersioned);
    fn zcs_dlpack_delete_legacy(m: *mut DLManagedTensor);
    fn zcs_dlpack_layout(out: *mut u64);
    /// Wraps `data` in a heap `DLManagedTensorVersioned` whose deleter frees it and
    /// increments `*deleted`.
    pub fn zcs_dlpack_make_versioned(
        data: *mut std::ffi::c_void,
        device_type: i32,
        device_id: i32,
        ndim: i32,
        shape: *const i64,
        strides: *const i64,
        code: u8,
        bits: u8,
        lanes: u16,
        byte_offset: u64,
        major: u32,
        flags: u64,
        deleted: *mut i32,
    ) -> *mut DLManagedTensorVersioned;
    /// As `zcs_dlpack_make_versioned`, legacy struct.
    pub fn zcs_dlpack_make_legacy(
        data: *mut std::ffi::c_void,
        device_type: i32,
        device_id: i32,
        ndim: i32,
        shape: *const i64,
        strides: *const i64,
        code: u8,
        bits: u8,
        lanes: u16,
        byte_offset: u64,
        deleted: *mut i32,
    ) -> *mut DLManagedTensor;
}

/// The C consumer reads `m` field by field, and `copy_len` bytes from its first element
/// if it is a `kDLCPU` tensor.
pub fn inspect_versioned(m: &ManagedTensorVersioned, copy_len: usize) -> (Summary, Vec<u8>) {
    let mut out = Summary::default();
    let mut copy = vec![0u8; copy_len];
    // SAFETY: `m` owns a live struct (its deleter has not run); `out` and `copy` are
    // writable for their sizes; the C side reads `copy_len` bytes only of kDLCPU data,
    // which the export keeps alive while `m` is.
    let rc = unsafe { zcs_dlpack_inspect_versioned(m.as_ptr(), &mut out, copy.as_mut_ptr(), copy_len as u64) };
    assert_eq!(rc, 0, "the C consumer refused the versioned struct");
    (out, copy)
}

/// As [`inspect_versioned`], for the legacy struct.
pub fn inspect_legacy(m: &ManagedTensorLegacy, copy_len: usize) -> (Summary, Vec<u8>) {
    let mut out = Summary::default();
    let mut copy = vec![0u8; copy_len];
    // SAFETY: as in `inspect_versioned`.
    let rc = unsafe { zcs_dlpack_inspect_legacy(m.as_ptr(), &mut out, copy.as_mut_ptr(), copy_len as u64) };
    assert_eq!(rc, 0, "the C consumer refused the legacy struct");
    (out, copy)
}

/// Hands `m` to the C consumer, which calls its deleter.
pub fn delete_versioned_in_c(m: ManagedTensorVersioned) {
    // SAFETY: `into_raw` gives up ownership; the C side calls the deleter exactly once.
    unsafe { zcs_dlpack_delete_versioned(m.into_raw()) }
}

/// Hands `m` to the C consumer, which calls its deleter.
pub fn delete_legacy_in_c(m: ManagedTensorLegacy) {
    // SAFETY: as in `delete_versioned_in_c`.
    unsafe { zcs_dlpack_delete_legacy(m.into_raw()) }
}

/// Sizes and offsets of the DLPack structs as the C compiler lays them out:
/// `[sizeof DLTensor, sizeof DLManagedTensor, sizeof DLManagedTensorVersioned,
/// offsetof(V, manager_ctx), offsetof(V, deleter), offsetof(V, flags),
/// offsetof(V, dl_tensor), offsetof(DLManagedTensor, deleter), offsetof(DLTensor, dtype),
/// offsetof(DLTensor, byte_offset)]`.
pub fn c_layout() -> [u64; 10] {
    let mut out = [0u64; 10];
    // SAFETY: the C function writes exactly 10 values.
    unsafe { zcs_dlpack_layout(out.as_mut_ptr()) };
    out
}

/// The same, as Rust lays out `zenoh_cuda_shm::dlpack`'s structs.
pub fn rust_layout() -> [u64; 10] {
    use std::mem::{offset_of, size_of};
    use zenoh_cuda_shm::dlpack::DLTensor;
    type V = DLManagedTensorVersioned;
    [
        size_of::<DLTensor>(),
        size_of::<DLManagedTensor>(),
        size_of::<V>(),
        offset_of!(V, manager_ctx),
        offset_of!(V, deleter),
        offset_of!(V, flags),
        offset_of!(V, dl_tensor),
        offset_of!(DLManagedTensor, deleter),
        offset_of!(DLTensor, dtype),
        offset_of!(DLTensor, byte_offset),
    ]
    .map(|v| v as u64)
}
