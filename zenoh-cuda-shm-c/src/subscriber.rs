//! Subscribers: a queue to receive from with a timeout, or a callback with a context
//! pointer.

use std::ffi::{c_char, c_void};
use std::time::Duration;

use zenoh_cuda_shm::cuda::Gpu;
use zenoh_cuda_shm::{GpuSample, GpuSubscriber, RecvError};

use crate::error::{
    Error, ZCS_ERR_CLOSED, ZCS_ERR_TIMEOUT, declare_failed, guard, non_null, set_out, str_arg, zcs_result_t,
};
use crate::handle::{Registry, end};
use crate::sample::register;
use crate::session::{SESSIONS, zcs_session_t};

/// A subscriber on a key expression.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_subscriber_t {
    /// The handle (0: null).
    pub id: u64,
}

/// A timeout that never ends, for `zcs_subscriber_recv`.
pub const ZCS_TIMEOUT_INFINITE: u64 = u64::MAX;

/// Called with each sample, on a thread of the library: the callback owns the sample
/// and must drop it (`zcs_sample_drop`), now or later from any thread. `context` is the
/// pointer given at declaration.
pub type zcs_sample_callback_t =
    Option<unsafe extern "C" fn(sample: crate::sample::zcs_sample_t, context: *mut c_void)>;

enum Sub {
    Queue {
        sub: GpuSubscriber<flume::Receiver<GpuSample>>,
        gpu: Option<Gpu>,
    },
    /// Held for its callback (and its counters); dropping it undeclares.
    Callback {
        held: GpuSubscriber<()>,
    },
}

static SUBSCRIBERS: Registry<Sub> = Registry::new("subscriber");

/// Declares a subscriber on `key` (a key expression) that queues its samples for
/// `zcs_subscriber_recv`.
///
/// # Safety
/// `key` is NULL or NUL-terminated; `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_subscriber_declare(
    session: zcs_session_t,
    key: *const c_char,
    out: *mut zcs_subscriber_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let key = unsafe { str_arg(key, "key") }?;
        let s = SESSIONS.get(session.id)?;
        let sub = s.declare_subscriber(key).wait().map_err(|e| declare_failed(key, &e))?;
        let id = SUBSCRIBERS.insert(Sub::Queue { sub, gpu: s.gpu().cloned() });
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_subscriber_t { id }) };
        Ok(())
    })
}

/// The context pointer of a callback, handed to the library's threads.
struct Context(*mut c_void);
// SAFETY: the caller of `zcs_subscriber_declare_callback` promises that the context may
// be used from any thread (the declaration's contract); we only pass it back.
unsafe impl Send for Context {}
// SAFETY: as for Send: only copied out and passed back.
unsafe impl Sync for Context {}

/// Declares a subscriber on `key` that calls `callback(sample, context)` for each
/// sample, on threads of the library; calls may overlap (samples of different
/// publishers arrive on different threads). The callback may drop its own subscriber;
/// no call starts after the drop.
///
/// # Safety
/// `key` is NULL or NUL-terminated; `callback` is NULL or a function that does not
/// unwind; `context` may be used from any thread until the subscriber is dropped;
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_subscriber_declare_callback(
    session: zcs_session_t,
    key: *const c_char,
    callback: zcs_sample_callback_t,
    context: *mut c_void,
    out: *mut zcs_subscriber_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let Some(callback) = callback else { return Err(Error::new(crate::error::ZCS_ERR_NULL, "callback is null")) };
        // SAFETY: NULL or NUL-terminated (the caller's contract).
        let key = unsafe { str_arg(key, "key") }?;
        let s = SESSIONS.get(session.id)?;
        let context = Context(context);
        let gpu = s.gpu().cloned();
        let sub = s
            .declare_subscriber(key)
            .callback(move |sample| {
                let context = &context;
                let h = register(sample, gpu.clone());
                // SAFETY: a function that does not unwind, given a live sample handle it
                // now owns and the context its declaration was given (the contract).
                unsafe { callback(h, context.0) };
            })
            .wait()
            .map_err(|e| declare_failed(key, &e))?;
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, zcs_subscriber_t { id: SUBSCRIBERS.insert(Sub::Callback { held: sub }) }) };
        Ok(())
    })
}

/// Receives the next sample of a queueing subscriber, waiting up to `timeout_ms`
/// (0: only what is there; `ZCS_TIMEOUT_INFINITE`: until one comes):
/// `ZCS_ERR_TIMEOUT` if none came, `ZCS_ERR_CLOSED` once none can come.
///
/// # Safety
/// `out` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_subscriber_recv(
    subscriber: zcs_subscriber_t,
    timeout_ms: u64,
    out: *mut crate::sample::zcs_sample_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SUBSCRIBERS.get(subscriber.id)?;
        let Sub::Queue { sub, gpu } = &*s else {
            return Err(Error::new(
                crate::error::ZCS_ERR_INVALID,
                "a callback subscriber has no queue to receive from",
            ));
        };
        let got = match timeout_ms {
            0 => sub.try_recv().ok_or(RecvError::Timeout),
            ZCS_TIMEOUT_INFINITE => sub.recv(),
            ms => sub.recv_timeout(Duration::from_millis(ms)),
        };
        let sample = match got {
            Ok(s) => s,
            Err(RecvError::Timeout) => return Err(Error::new(ZCS_ERR_TIMEOUT, "no sample within the timeout")),
            Err(e) => return Err(Error::new(ZCS_ERR_CLOSED, format!("no more samples: {e}"))),
        };
        // SAFETY: not null (checked above); the caller passes a writable handle.
        unsafe { set_out(out, register(sample, gpu.clone())) };
        Ok(())
    })
}

/// A subscriber's counters (all monotonic). The samples received add up to
/// `zero_copy + peer_copy + host_block + inline_samples + cpu_bytes + plain`; of those,
/// a queueing subscriber's application has taken some with `zcs_subscriber_recv`, its
/// full queue dropped `dropped_queue_full` (oldest first), and the rest wait queued.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct zcs_subscriber_stats_t {
    /// Samples read in place (the zero-copy path).
    pub zero_copy: u64,
    /// Samples of a publisher on another GPU, copied onto this subscriber's GPU.
    pub peer_copy: u64,
    /// Samples read in place from shared host blocks (a GPU publisher's copy).
    pub host_block: u64,
    /// Samples carried whole over the control connection (small messages).
    pub inline_samples: u64,
    /// Samples that came as bytes copied out of a block.
    pub cpu_bytes: u64,
    /// Samples of plain Zenoh publishers.
    pub plain: u64,
    /// Messages of a publisher that never came (gaps, and a tail its end notice shows).
    pub lost: u64,
    /// Second copies of a message, dropped.
    pub duplicates: u64,
    /// Samples a full queue dropped, oldest first (the application read slower than
    /// they came).
    pub dropped_queue_full: u64,
}

/// The counters of a subscriber (queueing or callback).
///
/// # Safety
/// `out` is NULL or points to a `zcs_subscriber_stats_t`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_subscriber_stats(
    subscriber: zcs_subscriber_t,
    out: *mut zcs_subscriber_stats_t,
) -> zcs_result_t {
    guard(|| {
        non_null(out, "out")?;
        let s = SUBSCRIBERS.get(subscriber.id)?;
        let st = match &*s {
            Sub::Queue { sub, .. } => sub.stats(),
            Sub::Callback { held } => held.stats(),
        };
        let stats = zcs_subscriber_stats_t {
            zero_copy: st.zero_copy,
            peer_copy: st.peer_copy,
            host_block: st.host_block,
            inline_samples: st.inline,
            cpu_bytes: st.cpu_bytes,
            plain: st.plain,
            lost: st.lost,
            duplicates: st.duplicates,
            dropped_queue_full: st.dropped_queue_full,
        };
        // SAFETY: not null (checked above); the caller passes a writable struct.
        unsafe { set_out(out, stats) };
        Ok(())
    })
}

/// Undeclares a subscriber and zeroes its handle. Samples received from it stay valid
/// until dropped. A callback subscriber's callback may still be running when this
/// returns on another thread.
///
/// # Safety
/// `subscriber` is NULL or points to a handle.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn zcs_subscriber_drop(subscriber: *mut zcs_subscriber_t) -> zcs_result_t {
    // SAFETY: `subscriber` is null or points to a handle (the caller's contract).
    guard(|| unsafe { end(&SUBSCRIBERS, subscriber, "subscriber") })
}
