//! Owned pointers to the managed structs: the deleter runs exactly once, on drop,
//! unless the pointer is handed off.

use std::ptr::NonNull;

use super::*;

/// An owned `DLManagedTensorVersioned*`: its deleter runs exactly once, when this drops
/// (unless handed off with [`ManagedTensorVersioned::into_raw`]).
#[derive(Debug)]
pub struct ManagedTensorVersioned {
    pub(super) ptr: NonNull<DLManagedTensorVersioned>,
}

/// An owned legacy `DLManagedTensor*`: its deleter runs exactly once, when this drops
/// (unless handed off with [`ManagedTensorLegacy::into_raw`]).
#[derive(Debug)]
pub struct ManagedTensorLegacy {
    pub(super) ptr: NonNull<DLManagedTensor>,
}

// SAFETY: exports of this module own only `Send` data (`Owner` is asserted `Send`
// below), and `from_raw` requires of foreign tensors that their deleter may run on any
// thread (the DLPack Python spec asks this of producers: deleters take the GIL
// themselves). The struct is only read through `&self`, and freed once, by `Drop`.
unsafe impl Send for ManagedTensorVersioned {}
// SAFETY: as for `ManagedTensorVersioned`.
unsafe impl Send for ManagedTensorLegacy {}

impl ManagedTensorVersioned {
    /// Takes ownership of a managed tensor: its deleter will be called once, when the
    /// returned value drops. `None` for a null pointer.
    ///
    /// # Safety
    /// `ptr` is null or points to a `DLManagedTensorVersioned` that nobody else will
    /// delete, valid until its deleter runs, whose deleter may be called from any thread.
    /// If `version.major == 1`, its `dl_tensor` is valid until then too: `shape` and
    /// `strides` (when not NULL) point to `ndim` integers, and `data` is memory of the
    /// named device covering every byte the view reaches.
    pub unsafe fn from_raw(ptr: *mut DLManagedTensorVersioned) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr })
    }

    /// Gives up ownership without calling the deleter: whoever receives the pointer must
    /// call it once.
    pub fn into_raw(self) -> *mut DLManagedTensorVersioned {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The pointer, still owned by `self`.
    pub fn as_ptr(&self) -> *mut DLManagedTensorVersioned {
        self.ptr.as_ptr()
    }

    /// The producer's version (always readable).
    pub fn version(&self) -> DLPackVersion {
        // SAFETY: valid until the deleter runs (`from_raw`, or built by this module), which
        // only `Drop` calls; `version` is ABI-stable across DLPack versions.
        unsafe { self.ptr.as_ref() }.version
    }

    /// The struct, if its major version is 1 (otherwise DLPack allows reading nothing
    /// but the version and the deleter).
    pub fn get(&self) -> Option<&DLManagedTensorVersioned> {
        // SAFETY: as in `version`; the borrow is tied to `&self`, and the struct is freed
        // only by `Drop`.
        let m = unsafe { self.ptr.as_ref() };
        (m.version.major == DLPACK_VERSION.major).then_some(m)
    }
}

impl Drop for ManagedTensorVersioned {
    fn drop(&mut self) {
        // SAFETY: valid until its deleter runs, which happens only here; `deleter` is an
        // ABI-stable field in every version.
        let deleter = unsafe { self.ptr.as_ref() }.deleter;
        if let Some(deleter) = deleter {
            // SAFETY: the DLPack contract: the owner calls the deleter once, with the
            // struct's own address. Ours never unwinds; a C one cannot.
            unsafe { deleter(self.ptr.as_ptr()) };
        }
    }
}

impl ManagedTensorLegacy {
    /// Takes ownership of a legacy managed tensor: its deleter will be called once, when
    /// the returned value drops. `None` for a null pointer.
    ///
    /// # Safety
    /// As [`ManagedTensorVersioned::from_raw`] (a legacy struct has no version).
    pub unsafe fn from_raw(ptr: *mut DLManagedTensor) -> Option<Self> {
        NonNull::new(ptr).map(|ptr| Self { ptr })
    }

    /// Gives up ownership without calling the deleter.
    pub fn into_raw(self) -> *mut DLManagedTensor {
        let p = self.ptr.as_ptr();
        std::mem::forget(self);
        p
    }

    /// The pointer, still owned by `self`.
    pub fn as_ptr(&self) -> *mut DLManagedTensor {
        self.ptr.as_ptr()
    }

    /// The struct.
    pub fn get(&self) -> &DLManagedTensor {
        // SAFETY: valid until the deleter runs, which only `Drop` calls; the borrow is
        // tied to `&self`.
        unsafe { self.ptr.as_ref() }
    }
}

impl Drop for ManagedTensorLegacy {
    fn drop(&mut self) {
        if let Some(deleter) = self.get().deleter {
            // SAFETY: the DLPack contract: the owner calls the deleter once, with the
            // struct's own address.
            unsafe { deleter(self.ptr.as_ptr()) };
        }
    }
}
