//! A few small device kernels the examples, tests and benchmarks run: fill a buffer
//! with a pattern that depends on every byte's offset and a seed, count the bytes that
//! differ from it, and spin for a given time (to make a stream's work measurably slow).
//! Fill and check move 16 bytes per thread and step with vector loads and stores where
//! the buffer is 16-byte aligned (so a check runs near memory bandwidth, as a real
//! consumer kernel would), and a byte at a time elsewhere.
//!
//! They ship as PTX text, JIT-compiled by the driver at load (`cuModuleLoadData`): no
//! nvcc or NVRTC is needed anywhere. [`pattern_byte`] is the same function on the CPU,
//! written independently, so a CPU check of bytes a kernel wrote checks the kernel too.

use std::ffi::{CStr, CString, c_void};

use cudarc::driver::sys::{CUfunction, CUmodule};

use super::sys::{self as cu, CudaError};
use super::{DeviceBlock, Gpu, copy};

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

/// The byte-wise kernels: fill and check, one byte per thread and step.
const PTX_BYTE_KERNELS: &str = "
.version 7.0
.target sm_70
.address_size 64

// dst[i] = pattern(start + i, seed) for i in [0, len), grid-stride loop, a byte per
// thread and step (unaligned buffers and tails).
.visible .entry zcs_fill(.param .u64 p_dst, .param .u64 p_len, .param .u64 p_seed, .param .u64 p_start)
{
    .reg .pred %p<2>;
    .reg .b32 %r<12>;
    .reg .b64 %rd<14>;
    ld.param.u64 %rd1, [p_dst];
    ld.param.u64 %rd2, [p_len];
    ld.param.u64 %rd3, [p_seed];
    ld.param.u64 %rd11, [p_start];
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
    add.u64 %rd10, %rd4, %rd11;
    cvt.u32.u64 %r6, %rd10;
    shr.u64 %rd7, %rd10, 32;
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

// *errors += number of i in [0, len) with src[i] != pattern(start + i, seed); a byte
// per thread and step.
.visible .entry zcs_check(.param .u64 p_src, .param .u64 p_len, .param .u64 p_seed, .param .u64 p_err,
    .param .u64 p_start)
{
    .reg .pred %p<3>;
    .reg .b32 %r<14>;
    .reg .b64 %rd<14>;
    ld.param.u64 %rd1, [p_src];
    ld.param.u64 %rd2, [p_len];
    ld.param.u64 %rd3, [p_seed];
    ld.param.u64 %rd9, [p_err];
    ld.param.u64 %rd11, [p_start];
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
    add.u64 %rd10, %rd4, %rd11;
    cvt.u32.u64 %r6, %rd10;
    shr.u64 %rd7, %rd10, 32;
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
";

/// The spin kernel.
const PTX_SPIN: &str = "
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

/// Prologue shared by the 16-byte kernels: parameters (the buffer named `ptr`), the
/// thread's first vector index (`%rd4`), the grid stride (`%rd6`) and the seed term
/// (`%r5`).
fn vector_prologue(ptr: &str) -> String {
    format!(
        "    ld.param.u64 %rd1, [{ptr}];
    ld.param.u64 %rd2, [p_n16];
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
    mul.lo.u32 %r5, %r5, 0x85ebca77;"
    )
}

/// Word `k` (`%r20 + k`) of a 16-byte vector at pattern offset `%rd7`: built from the
/// pattern (fill), or compared with it byte by byte, counting into `%r12` (check). PTX
/// has no register arrays, so the four words are four copies of this block.
fn vector_word(label: &str, k: usize, check: bool) -> String {
    let w = format!("%r{}", 20 + k);
    let mut out = String::new();
    if !check {
        out.push_str(&format!("    mov.u32 {w}, 0;\n"));
    }
    out.push_str(&format!(
        "    mov.u32 %r9, 0;
    add.u64 %rd8, %rd7, {off};
{label}_W{k}:
    cvt.u32.u64 %r6, %rd8;
    shr.u64 %rd9, %rd8, 32;
    cvt.u32.u64 %r7, %rd9;
    mul.lo.u32 %r7, %r7, 0x27d4eb2f;
    xor.b32 %r6, %r6, %r7;
    mul.lo.u32 %r8, %r6, 0x9e3779b1;
    add.u32 %r8, %r8, %r5;
    shr.u32 %r8, %r8, 24;
    xor.b32 %r8, %r8, %r6;
    and.b32 %r8, %r8, 255;
    shl.b32 %r10, %r9, 3;
",
        off = 4 * k
    ));
    if check {
        out.push_str(&format!(
            "    shr.u32 %r11, {w}, %r10;
    and.b32 %r11, %r11, 255;
    setp.ne.u32 %p3, %r11, %r8;
    selp.u32 %r13, 1, 0, %p3;
    add.u32 %r12, %r12, %r13;
"
        ));
    } else {
        out.push_str(&format!("    shl.b32 %r8, %r8, %r10;\n    or.b32 {w}, {w}, %r8;\n"));
    }
    out.push_str(&format!(
        "    add.u64 %rd8, %rd8, 1;
    add.u32 %r9, %r9, 1;
    setp.lt.u32 %p2, %r9, 4;
    @%p2 bra {label}_W{k};"
    ));
    out
}

/// The whole module: the byte kernels, the 16-byte fill and check (`zcs_fill16`,
/// `zcs_check16`: 16 bytes per thread and step with one vector store or load; the
/// buffer 16-byte aligned and `n16 * 16` bytes long; byte k of vector w is
/// pattern(16 w + k), little endian within each 32-bit word), and the spin kernel.
fn ptx() -> CString {
    let words = |label: &str, check: bool| (0..4).map(|k| vector_word(label, k, check)).collect::<Vec<_>>().join("\n");
    let fill16 = format!(
        "
// The same fill, 16 bytes per thread and step with one 16-byte store: dst is 16-byte
// aligned and holds n16 * 16 bytes. Byte k of the vector is pattern(16 w + k), little
// endian within each 32-bit word.
.visible .entry zcs_fill16(.param .u64 p_dst, .param .u64 p_n16, .param .u64 p_seed)
{{
    .reg .pred %p<3>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<12>;
{prologue}
F16_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra F16_DONE;
    shl.b64 %rd7, %rd4, 4;
{words}
    add.u64 %rd10, %rd1, %rd7;
    st.global.v4.u32 [%rd10], {{%r20, %r21, %r22, %r23}};
    add.u64 %rd4, %rd4, %rd6;
    bra F16_LOOP;
F16_DONE:
    ret;
}}
",
        prologue = vector_prologue("p_dst"),
        words = words("F16", false)
    );
    let check16 = format!(
        "
// The same check, 16 bytes per thread and step with one 16-byte load (src 16-byte
// aligned, n16 * 16 bytes).
.visible .entry zcs_check16(.param .u64 p_src, .param .u64 p_n16, .param .u64 p_seed, .param .u64 p_err)
{{
    .reg .pred %p<4>;
    .reg .b32 %r<24>;
    .reg .b64 %rd<14>;
    ld.param.u64 %rd11, [p_err];
    cvta.to.global.u64 %rd11, %rd11;
{prologue}
    mov.u32 %r12, 0;
C16_LOOP:
    setp.ge.u64 %p1, %rd4, %rd2;
    @%p1 bra C16_DONE;
    shl.b64 %rd7, %rd4, 4;
    add.u64 %rd10, %rd1, %rd7;
    ld.global.v4.u32 {{%r20, %r21, %r22, %r23}}, [%rd10];
{words}
    add.u64 %rd4, %rd4, %rd6;
    bra C16_LOOP;
C16_DONE:
    setp.eq.u32 %p1, %r12, 0;
    @%p1 bra C16_RET;
    atom.global.add.u32 %r14, [%rd11], %r12;
C16_RET:
    ret;
}}
",
        prologue = vector_prologue("p_src"),
        words = words("C16", true)
    );
    let text = [PTX_BYTE_KERNELS, &fill16, &check16, PTX_SPIN].concat();
    CString::new(text).expect("the PTX text has no NUL byte")
}

/// The loaded kernels of this module (one `cuModuleLoadData` per instance).
#[derive(Debug)]
pub struct Kernels {
    module: CUmodule,
    fill: CUfunction,
    check: CUfunction,
    fill16: CUfunction,
    check16: CUfunction,
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

fn grid_for(items: u64) -> u32 {
    // Enough blocks to cover the buffer in a few grid-stride steps, capped so launches
    // stay cheap; the loop in each kernel covers the rest.
    (items.div_ceil(BLOCK as u64 * 4)).clamp(1, 8192) as u32
}

/// How a range splits between the 16-bytes-per-thread kernel (16-byte aligned start,
/// whole vectors) and the byte kernel (the tail, or everything when unaligned):
/// `(vectors, tail bytes)`.
fn split16(ptr: u64, len: u64) -> (u64, u64) {
    if ptr.is_multiple_of(16) { (len / 16, len % 16) } else { (0, len) }
}

impl Kernels {
    /// JIT-compiles the PTX and looks up the kernels.
    pub fn load(gpu: &Gpu) -> Result<Self, CudaError> {
        gpu.bind()?;
        // SAFETY: the context is current; the module is unloaded by `Drop`.
        let module = unsafe { cu::module_load_ptx(&ptx()) }?;
        // SAFETY: `module` is live (loaded above).
        let get = |name: &CStr| unsafe { cu::module_get_function(module, name) };
        let funcs = (|| {
            Ok::<_, CudaError>((
                get(c"zcs_fill")?,
                get(c"zcs_check")?,
                get(c"zcs_fill16")?,
                get(c"zcs_check16")?,
                get(c"zcs_spin")?,
            ))
        })();
        match funcs {
            Ok((fill, check, fill16, check16, spin)) => {
                Ok(Self { module, fill, check, fill16, check16, spin, gpu: gpu.clone() })
            }
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
    pub unsafe fn fill(&self, stream: &super::Stream, dst: u64, len: u64, seed: u64) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let (vectors, tail) = split16(dst, len);
        if vectors > 0 {
            let (mut a, mut b, mut c) = (dst, vectors, seed);
            let mut params =
                [(&mut a as *mut u64).cast::<c_void>(), (&mut b as *mut u64).cast(), (&mut c as *mut u64).cast()];
            // SAFETY: zcs_fill16 takes (u64, u64, u64) and `params` points at three u64
            // locals alive across the call (the driver copies them at launch); `dst` is
            // 16-byte aligned (split16) and the `vectors * 16` bytes are inside the
            // caller's range.
            unsafe { cu::launch_1d(self.fill16, grid_for(vectors), BLOCK, stream.cu_stream(), &mut params) }?;
        }
        if tail > 0 {
            let start = vectors * 16;
            let (mut a, mut b, mut c, mut d) = (dst + start, tail, seed, start);
            let mut params = [
                (&mut a as *mut u64).cast::<c_void>(),
                (&mut b as *mut u64).cast(),
                (&mut c as *mut u64).cast(),
                (&mut d as *mut u64).cast(),
            ];
            // SAFETY: zcs_fill takes four u64 parameters, as above; the tail ends where
            // the caller's range ends.
            unsafe { cu::launch_1d(self.fill, grid_for(tail), BLOCK, stream.cu_stream(), &mut params) }?;
        }
        Ok(())
    }

    /// Enqueues a check of `len` bytes at `src` against the pattern, adding the number
    /// of differing bytes to the `u32` at device address `errors`.
    ///
    /// # Safety
    /// `src..src+len` is mapped on this device; `errors` is a mapped, 4-byte aligned
    /// `u32`; both stay mapped until the stream has passed this launch.
    pub unsafe fn check(
        &self,
        stream: &super::Stream,
        src: u64,
        len: u64,
        seed: u64,
        errors: u64,
    ) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let (vectors, tail) = split16(src, len);
        if vectors > 0 {
            let (mut a, mut b, mut c, mut d) = (src, vectors, seed, errors);
            let mut params = [
                (&mut a as *mut u64).cast::<c_void>(),
                (&mut b as *mut u64).cast(),
                (&mut c as *mut u64).cast(),
                (&mut d as *mut u64).cast(),
            ];
            // SAFETY: zcs_check16 takes four u64 parameters; see `fill`.
            unsafe { cu::launch_1d(self.check16, grid_for(vectors), BLOCK, stream.cu_stream(), &mut params) }?;
        }
        if tail > 0 {
            let start = vectors * 16;
            let (mut a, mut b, mut c, mut d, mut e) = (src + start, tail, seed, errors, start);
            let mut params = [
                (&mut a as *mut u64).cast::<c_void>(),
                (&mut b as *mut u64).cast(),
                (&mut c as *mut u64).cast(),
                (&mut d as *mut u64).cast(),
                (&mut e as *mut u64).cast(),
            ];
            // SAFETY: zcs_check takes five u64 parameters; see `fill`.
            unsafe { cu::launch_1d(self.check, grid_for(tail), BLOCK, stream.cu_stream(), &mut params) }?;
        }
        Ok(())
    }

    /// Counts the bytes of `src..src+len` that differ from the pattern: zeroes the
    /// counter at the start of `counter`, checks on `stream` after the work queued there,
    /// and waits for the result.
    ///
    /// # Safety
    /// `src..src+len` is mapped on this device until this call returns.
    pub unsafe fn count_mismatches(
        &self,
        stream: &super::Stream,
        src: u64,
        len: u64,
        seed: u64,
        counter: &DeviceBlock,
    ) -> Result<u32, CudaError> {
        let mut errors = [0u8; 4];
        let at = counter.device_ptr();
        // SAFETY: `counter` is a mapped block of at least one granule, borrowed past the
        // wait in `device_to_host` below.
        unsafe { copy::fill(stream, at, 0, errors.len()) }?;
        // SAFETY: the caller guarantees the source range; the counter as above.
        unsafe { self.check(stream, src, len, seed, at) }?;
        // SAFETY: the counter as above; this call returns after the copy has completed.
        unsafe { copy::device_to_host(stream, at, &mut errors) }?;
        Ok(u32::from_le_bytes(errors))
    }

    /// Enqueues a kernel that busy-waits `ns` nanoseconds: later work on `stream`
    /// starts after it. Touches no memory.
    pub fn spin(&self, stream: &super::Stream, ns: u64) -> Result<(), CudaError> {
        self.gpu.bind()?;
        let mut a = ns;
        let mut params = [(&mut a as *mut u64).cast::<c_void>()];
        // SAFETY: zcs_spin takes one u64 and accesses no memory.
        unsafe { cu::launch_1d(self.spin, 1, 1, stream.cu_stream(), &mut params) }
    }
}

impl Drop for Kernels {
    fn drop(&mut self) {
        if !self.gpu.bind_for_drop("kernels module") {
            return;
        }
        // The driver documents no deferral for code still running, so wait for every
        // launch of this context first (these kernels serve tests and demos, where a
        // context-wide wait at teardown costs nothing that matters).
        if let Err(e) = self.gpu.synchronize() {
            tracing::warn!(error = %crate::error::Chain(&e), "context synchronize before cuModuleUnload failed");
        }
        // SAFETY: the module is owned by `self` and unloaded once; the context was
        // synchronised above, so none of its kernels is running.
        if let Err(e) = unsafe { cu::module_unload(self.module) } {
            tracing::warn!(error = %crate::error::Chain(&e), "cuModuleUnload failed in drop");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ptx_has_each_kernel_once_and_unique_labels() {
        let ptx = ptx().into_string().unwrap();
        for name in ["zcs_fill", "zcs_check", "zcs_fill16", "zcs_check16", "zcs_spin"] {
            assert_eq!(ptx.matches(&format!(".entry {name}(")).count(), 1, "{name}");
        }
        let labels: Vec<&str> = ptx.lines().filter_map(|l| l.strip_suffix(':')).collect();
        let unique: std::collections::HashSet<_> = labels.iter().collect();
        assert_eq!(unique.len(), labels.len(), "duplicate labels in {labels:?}");
        assert_eq!(ptx.matches('{').count(), ptx.matches('}').count());
    }

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
