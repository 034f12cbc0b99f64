//! The registries of live objects behind the handles C holds.
//!
//! A handle is a slot index and that slot's generation, packed in 64 bits (never 0, so
//! a zeroed handle is null). Removing an object bumps its slot's generation, so every
//! copy of the old handle is refused from then on, even after the slot is reused: a
//! double free, a use after close or a made-up handle is `ZCS_ERR_STALE`.

use std::sync::{Arc, Mutex};

use crate::error::{Error, ZCS_ERR_STALE};

/// Live objects of one type.
pub(crate) struct Registry<T> {
    what: &'static str,
    slots: Mutex<Slots<T>>,
}

struct Slots<T> {
    /// Per slot: its generation, and the object while it is live.
    entries: Vec<(u32, Option<Arc<T>>)>,
    free: Vec<u32>,
}

impl<T> Registry<T> {
    /// A registry of objects called `what` in messages.
    pub(crate) const fn new(what: &'static str) -> Self {
        Self { what, slots: Mutex::new(Slots { entries: Vec::new(), free: Vec::new() }) }
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, Slots<T>> {
        // A panic while the lock was held left the table consistent (every update is one
        // assignment): go on with it.
        self.slots.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers `value`; its handle.
    pub(crate) fn insert(&self, value: T) -> u64 {
        let mut s = self.slots();
        let index = match s.free.pop() {
            Some(i) => i,
            None => {
                s.entries.push((0, None));
                (s.entries.len() - 1) as u32
            }
        };
        let entry = &mut s.entries[index as usize];
        // Generations start at 1 and skip 0 on wrapping, so no handle is 0.
        entry.0 = entry.0.wrapping_add(1).max(1);
        entry.1 = Some(Arc::new(value));
        (u64::from(index) << 32) | u64::from(entry.0)
    }

    fn slot(&self, handle: u64) -> (usize, u32) {
        ((handle >> 32) as usize, handle as u32)
    }

    fn stale(&self, handle: u64) -> Error {
        let why = if handle == 0 { "null" } else { "closed, dropped or never valid" };
        Error::new(ZCS_ERR_STALE, format!("this {} handle is {why}", self.what))
    }

    /// The live object `handle` names.
    pub(crate) fn get(&self, handle: u64) -> Result<Arc<T>, Error> {
        let (index, generation) = self.slot(handle);
        let s = self.slots();
        match s.entries.get(index) {
            Some((g, Some(v))) if *g == generation && handle != 0 => Ok(Arc::clone(v)),
            _ => Err(self.stale(handle)),
        }
    }

    /// Unregisters the object `handle` names and returns it (it ends when the last
    /// call still using it returns).
    pub(crate) fn remove(&self, handle: u64) -> Result<Arc<T>, Error> {
        let (index, generation) = self.slot(handle);
        let mut s = self.slots();
        let taken = match s.entries.get_mut(index) {
            Some((g, v @ Some(_))) if *g == generation && handle != 0 => v.take(),
            _ => None,
        };
        match taken {
            Some(v) => {
                s.free.push(index as u32);
                Ok(v)
            }
            None => Err(self.stale(handle)),
        }
    }
}

/// Ends the object whose handle is at `handle` (a pointer to one of the ABI's handle
/// structs, a `#[repr(C)]` struct of one `u64`) and zeroes that handle.
///
/// # Safety
/// `handle` is null or points to a handle struct (its `id` field first and only).
pub(crate) unsafe fn end<T, H>(registry: &Registry<T>, handle: *mut H, name: &str) -> Result<(), Error> {
    crate::error::non_null(handle, name)?;
    // SAFETY: not null (checked); a handle struct is `#[repr(C)] { id: u64 }`, so it
    // starts with its id (the caller's contract).
    let id = unsafe { &mut *handle.cast::<u64>() };
    registry.remove(*id)?;
    *id = 0;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_handles_are_refused_even_after_their_slot_is_reused() {
        let r = Registry::<u32>::new("test");
        let a = r.insert(1);
        assert_eq!(*r.get(a).unwrap(), 1);
        assert_eq!(*r.remove(a).unwrap(), 1);
        assert_eq!(r.remove(a).unwrap_err().code, ZCS_ERR_STALE, "double free");
        let b = r.insert(2);
        assert_ne!(a, b, "the reused slot has a new generation");
        assert_eq!(r.get(a).unwrap_err().code, ZCS_ERR_STALE, "use after free");
        assert_eq!(*r.get(b).unwrap(), 2);
        assert_eq!(r.get(0).unwrap_err().code, ZCS_ERR_STALE, "null");
        assert_eq!(r.get(b ^ (7 << 32)).unwrap_err().code, ZCS_ERR_STALE, "made up");
        assert!(r.get(0).unwrap_err().message.contains("null"));
    }
}
