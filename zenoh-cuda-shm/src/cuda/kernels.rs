//! A few small device kernels the examples, tests and benchmarks run: fill a buffer
//! with a pattern that depends on every byte's offset and a seed, count the bytes that
//! differ from it, and spin for a given time (to make a stream's work measurably slow).
//!
//! They ship as PTX text, JIT-compiled by the driver at load (`cuModuleLoadData`): no
//! nvcc or NVRTC is needed anywhere. [`pattern_byte`] is the same function on the CPU,
//! written independently, so a CPU check of bytes a kernel wrote checks the kernel too.

use std::ffi::{CStr, c_void};

use cudarc::driver::CudaStream;
use cudarc::driver::sys::{CUfunction, CUmodule};

use super::Gpu;
use super::sys::{self as cu, CudaError};

/// The pattern byte at offset `i` for `seed`; equal to what [`Kernels::fill`] writes.
pub fn pattern_byte(i: u64, seed: u64) -> u8 {
    let x = (i as u32) ^ ((i >> 32) as u32).wrapping_mul(0x27d4_eb2f);
    let h = x.wrapping_mul(0x9e37_79b1).wrapping_add((seed as u32).wrapping_mul(0x85eb_ca77));
    ((h >> 24) ^ x) as u8
}

/// Fills `buf` (which starts at offset `start` of the pattern) on the CPU.
pub fn fill_pattern(buf: &mut [u8], start: u64, seed: u64) {
    for (k, b) in buf.iter_mut().enumerate() {
        *b = pattern_byte(start + k as u64, seed);
    }
}

/// The first offset in `buf` (which starts at pattern offset `start`) that differs
/// from the pattern, and how many bytes differ.
pub fn check_pattern(buf: &[u8], start: u64, seed: u64) -> Option<(u64, u64)> {
    let mut first = None;
    let mut bad = 0u64;
    for (k, &b) in buf.iter().enumerate() {
        if b != pattern_byte(start + k as u64, seed) {
            first.get_or_insert(start + k as u64);
            bad += 1;
        }
    }
    first.map(|f| (f, bad))
}

const PTX: &CStr = c"
.version 7.0
.target sm_70
.address_size 64

// dst[i] = pattern(i, seed) for i in [0, len), grid-stride loop.
.visible .entry zcs_fill(.param .u64 p_dst, .param .u64 p_len, .param .u64 p_seed)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_len];
    ld.param.u64 %rd3, [p_seed];
    cvta.to.global.u64 %rd1, %rd1;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    cvt.u32.u64 %r5, %rd3;
    mul.lo.u32 %r5, %r5, 0x85ebca77;
FILL_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra FILL_DONE;
    cvt.u32.u64 %r6, %rd4;
    shr.u64 %rd7, %rd4, 32;
    cvt.u32.u64 %r7, %rd7;
    mul.lo.u32 %r7, %r7, 0x27d4eb2f;
    xor.b32 %r6, %r6, %r7;
    mul.lo.u32 %r8, %r6, 0x9e3779b1;
    add.u32 %r8, %r8, %r5;
    shr.u32 %r8, %r8, 24;
    xor.b32 %r8, %r8, %r6;
    add.u64 %rd8, %rd1, %rd4;
    st.global.u8 [%rd8], %r8;
    add.u64 %rd4, %rd4, %rd6;
    bra FILL_LOOP;
FILL_DONE:
    ret;
}

// *errors += number of i in [0, len) with src[i] != pattern(i, seed).
.visible .entry zcs_check(.param .u64 p_src, .param .u64 p_len, .param .u64 p_seed, .param .u64 p_err)
{
    .reg .pred %p<3>;
    .reg .b32 %r<14>;
    .reg .b64 %rd<12>;
    ld.param.u64 %rd1, [p_src];
    ld.param.u64 %rd2, [p_len];
    ld.param.u64 %rd3, [p_seed];
    ld.param.u64 %rd9, [p_err];
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd9, %rd9;
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mov.u32 %r4, %nctaid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd4, %rd4, %rd5;
    mul.wide.u32 %rd6, %r4, %r2;
    cvt.u32.u64 %r5, %rd3;
    mul.lo.u32 %r5, %r5, 0x85ebca77;
    mov.u32 %r10, 0;
CHECK_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra CHECK_DONE;
    cvt.u32.u64 %r6, %rd4;
    shr.u64 %rd7, %rd4, 32;
    cvt.u32.u64 %r7, %rd7;
    mul.lo.u32 %r7, %r7, 0x27d4eb2f;
    xor.b32 %r6, %r6, %r7;
    mul.lo.u32 %r8, %r6, 0x9e3779b1;
    add.u32 %r8, %r8, %r5;
    shr.u32 %r8, %r8, 24;
    xor.b32 %r8, %r8, %r6;
    and.b32 %r8, %r8, 255;
    add.u64 %rd8, %rd1, %rd4;
    ld.global.u8 %r9, [%rd8];
    setp.ne.u32 %p2, %r9, %r8;
    selp.u32 %r11, 1, 0, %p2;
    add.u32 %r10, %r10, %r11;
    add.u64 %rd4, %rd4, %rd6;
    bra CHECK_LOOP;
CHECK_DONE:
    setp.eq.u32 %p2, %r10, 0;
    @%p2 bra CHECK_RET;
    atom.global.add.u32 %r12, [%rd9], %r10;
CHECK_RET:
    ret;
}

// Busy-waits `ns` nanoseconds of GPU time (one thread suffices).
.visible .entry zcs_spin(.param .u64 p_ns)
{
    .reg .pred %p<2>;
    .reg .b64 %rd<6>;
    ld.param.u64 %rd1, [p_ns];
    mov.u64 %rd2, %globaltimer;
SPIN_LOOP:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p1, %rd4, %rd1;
    @%p1 bra SPIN_LOOP;
    ret;
}
";

/// The loaded kernels of this module (one `cuModuleLoadData` per instance).
#[derive(Debug)]
pub struct Kernels {
    module: CUmodule,
    fill: CUfunction,
    check: CUfunction,
    spin: CUfunction,
    gpu: Gpu,
}

// SAFETY: module and function handles are valid in any thread once the context is
// current; every method binds the context first. Launches are serialised per stream
// by the driver.
unsafe impl Send for Kernels {}
// SAFETY: as for Send; methods take `&self` and only launch.
unsafe impl Sync for Kernels {}

const BLOCK: u32 = 256;

fn grid_for(len: u64) -> u32 {
    // Enough blocks to cover the buffer in a few grid-stride steps, capped so launches
    // stay cheap; the loop in each kernel covers the rest.
    (len.div_ceil(BLOCK as u64 * 16)).clamp(1, 8192) as u32
}

impl Kernels {
    /// JIT-compiles the PTX and looks up the kernels.
    pub fn load(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current; the module is unloaded by `Drop`.
        let module = unsafe { cu::module_load_ptx(PTX) }?;
        // SAFETY: `module` is live (loaded above).
        let get = |name: &CStr| unsafe { cu::module_get_function(module, name) };
        let funcs = (|| Ok::<_, CudaError>((get(c"zcs_fill")?, get(c"zcs_check")?, get(c"zcs_spin")?)))();
        match funcs {
            Ok((fill, check, spin)) => Ok(Self { module, fill, check, spin, gpu: gpu.clone() }),
            Err(e) => {
                // SAFETY: the module was loaded above and nothing was launched from it.
                let _ = unsafe { cu::module_unload(module) };
                Err(e)
            }
        }
    }

    /// Enqueues a fill of `len` bytes at device address `dst` with the pattern.
    ///
    /// # Safety
    /// `dst..dst+len` is device memory mapped read-write on this device, and stays
    /// mapped until the stream has passed this launch.
    pub unsafe fn fill(&self, stream: &CudaStream, dst: u64, len: u64, seed: u64) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let (mut a, mut b, mut c) = (dst, len, seed);
        let mut params =
            [(&mut a as *mut u64).cast::<c_void>(), (&mut b as *mut u64).cast(), (&mut c as *mut u64).cast()];
        // SAFETY: zcs_fill takes (u64, u64, u64) and `params` points at three u64 locals
        // alive across the call (the driver copies them at launch); the range is the
        // caller's contract.
        unsafe { cu::launch_1d(self.fill, grid_for(len), BLOCK, stream.cu_stream(), &mut params) }
    }

    /// Enqueues a check of `len` bytes at `src` against the pattern, adding the number
    /// of differing bytes to the `u32` at device address `errors`.
    ///
    /// # Safety
    /// `src..src+len` is mapped on this device; `errors` is a mapped, 4-byte aligned
    /// `u32`; both stay mapped until the stream has passed this launch.
    pub unsafe fn check(
        &self,
        stream: &CudaStream,
        src: u64,
        len: u64,
        seed: u64,
        errors: u64,
    ) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let (mut a, mut b, mut c, mut d) = (src, len, seed, errors);
        let mut params = [
            (&mut a as *mut u64).cast::<c_void>(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
            (&mut d as *mut u64).cast(),
        ];
        // SAFETY: zcs_check takes four u64 parameters; see `fill`.
        unsafe { cu::launch_1d(self.check, grid_for(len), BLOCK, stream.cu_stream(), &mut params) }
    }

    /// Enqueues a kernel that busy-waits `ns` nanoseconds: later work on `stream`
    /// starts after it. Touches no memory.
    pub fn spin(&self, stream: &CudaStream, ns: u64) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let mut a = ns;
        let mut params = [(&mut a as *mut u64).cast::<c_void>()];
        // SAFETY: zcs_spin takes one u64 and accesses no memory.
        unsafe { cu::launch_1d(self.spin, 1, 1, stream.cu_stream(), &mut params) }
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if self.gpu.bind().is_err() {
            tracing::warn!("cannot bind CUDA context to unload the kernels module; leaking it");
            return;
        }
        // The driver documents no deferral for code still running, so wait for every
        // launch of this context first (these kernels serve tests and demos, where a
        // context-wide wait at teardown costs nothing that matters).
        if let Err(e) = self.gpu.context().synchronize() {
            tracing::warn!(error = %e, "context synchronize before cuModuleUnload failed");
        }
        // SAFETY: the module is owned by `self` and unloaded once; the context was
        // synchronised above, so none of its kernels is running.
        if let Err(e) = unsafe { cu::module_unload(self.module) } {
            tracing::warn!(error = %e, "cuModuleUnload failed in drop");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_depends_on_offset_and_seed() {
        let mut a = vec![0u8; 4096];
        fill_pattern(&mut a, 0, 1);
        assert_eq!(check_pattern(&a, 0, 1), None);
        // Shifted by one byte: nearly everything differs.
        let (first, bad) = check_pattern(&a[1..], 0, 1).unwrap();
        assert_eq!(first, 0);
        assert!(bad > 4000, "{bad}");
        // Another seed differs too.
        assert!(check_pattern(&a, 0, 2).unwrap().1 > 4000);
        // High offset bits matter.
        assert_ne!(
            (0..64).map(|i| pattern_byte(i, 3)).collect::<Vec<_>>(),
            (0..64).map(|i| pattern_byte(i + (1 << 32), 3)).collect::<Vec<_>>()
        );
    }
}
