//! A `uint8[]` field as ROS 2's `rosidl::Buffer` writes it: the bytes (CPU form), or a
//! buffer backend's descriptor in their place (descriptor form). Only the CUDA backend's
//! descriptor is decoded; `docs/cuda-buffer-backend.md` gives every fact used here with
//! its source file and version.
//!
//! # The descriptor form
//!
//! - Two `u32` words, `0xFFFF_FFFF` then `0x524F_5332`, where the CPU form has its
//!   sequence length (rosidl_typesupport_fastrtps 3.9.5, `buffer_serialization.hpp`).
//!   A reader takes the descriptor form only when both match, and reads the second word
//!   only when the first does. An earlier, unreleased form with one marker word is not
//!   recognised: it decodes as a sequence too long for its message.
//! - The backend's name as a CDR string (`"cuda"`).
//! - The backend's descriptor message, serialized in the same stream: no second
//!   encapsulation header, alignment still counted from the enclosing message's start.
//!
//! # The CUDA descriptor (`cuda_buffer_backend_msgs/msg/CudaBufferDescriptor`)
//!
//! Ten fields in 0.1.2 (`CudaBufferDescriptor.msg` lines 15-28); 0.1.1 has an eleventh,
//! `uint8[] serialized_data`, always empty. The message has no version field: the two
//! are told apart by what follows the event handle, which this module can do only for a
//! buffer field that ends its message (`data` in `sensor_msgs/msg/Image` and
//! `tensor_msgs/msg/ExperimentalTensor`).

use super::{CdrDecodeError, CdrEncodeError, Reader, Writer};

/// The first word of a buffer field in descriptor form.
pub const DESCRIPTOR_MARKER_1: u32 = 0xFFFF_FFFF;
/// The second word of a buffer field in descriptor form (`"ROS2"` read as a big-endian
/// `u32`).
pub const DESCRIPTOR_MARKER_2: u32 = 0x524F_5332;
/// The backend name the CUDA backend writes.
pub const CUDA_BACKEND: &str = "cuda";
/// The element type name the CUDA backend writes for `uint8_t` (GCC's and Clang's
/// `typeid` name), and the only one its receiver accepts.
pub const CUDA_ELEMENT_TYPE_U8: &str = "h";
/// Longest Unix socket path `connect` takes (`sizeof(sun_path)` less its NUL).
const MAX_SOCKET_PATH: usize = 107;

/// Which release's layout a CUDA descriptor has.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CudaDescriptorLayout {
    /// `cuda_buffer_backend` 0.1.1: the ten fields and an empty `serialized_data`.
    V0_1_1,
    /// `cuda_buffer_backend` 0.1.2: the ten fields.
    #[default]
    V0_1_2,
}

/// The CUDA backend's descriptor of one GPU buffer: where its memory is (a block of
/// the publisher's VMM pool, whose FD its socket hands out) and the IPC event that
/// orders reads after the writer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CudaBufferDescriptor {
    /// The buffer's length in bytes (from offset 0 of the block).
    pub size: u64,
    /// The element type's C++ `typeid` name: `"h"` for `uint8_t`.
    pub element_type_name: String,
    /// The CUDA device ordinal of the publisher's pool (an ordinal, not a UUID).
    pub device_id: i32,
    /// Whether the IPC fields are valid; always true when sent.
    pub use_ipc: bool,
    /// The publisher's process id.
    pub vmm_pid: i32,
    /// The block's number in the publisher's pool.
    pub vmm_block_id: u32,
    /// The whole VMM allocation's size: what an importer maps.
    pub vmm_block_size: u64,
    /// The Unix socket that serves the block's FD.
    pub vmm_socket_path: String,
    /// The block's current reuse id: a stale descriptor names an older one.
    pub ipc_uid: u64,
    /// A `cudaIpcEventHandle_t`; all zero means no event.
    pub ipc_event_handle: [u8; 64],
    /// The layout it came in (or is to be written in).
    pub layout: CudaDescriptorLayout,
}

/// Why a CUDA descriptor that decoded cannot describe a buffer we may map.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CudaDescriptorError {
    /// The element type is not `uint8_t`'s (`"h"`): the backend's own receiver refuses it.
    #[error("element type {0:?} (only \"h\", uint8_t, is defined)")]
    ElementType(String),
    /// `use_ipc` is false: the descriptor names no memory another process can open.
    #[error("use_ipc is false: no memory another process can open")]
    NoIpc,
    /// The buffer is longer than the block it claims to lie in (the backend itself
    /// never compares the two).
    #[error("a {size}-byte buffer in a {block_size}-byte block")]
    SizeBeyondBlock {
        /// `size`.
        size: u64,
        /// `vmm_block_size`.
        block_size: u64,
    },
    /// The block size is zero.
    #[error("an empty block")]
    EmptyBlock,
    /// The publisher's process id is not a process id.
    #[error("process id {0} is not a process")]
    Pid(i32),
    /// The device ordinal is negative.
    #[error("device ordinal {0} is negative")]
    Device(i32),
    /// The socket path is not an absolute path a Unix socket can have.
    #[error("socket path {0:?} is not an absolute path of at most 107 bytes without NUL")]
    SocketPath(String),
}

impl CudaBufferDescriptor {
    /// Whether the publisher attached an IPC event (a non-zero handle).
    pub fn has_event(&self) -> bool {
        self.ipc_event_handle.iter().any(|&b| b != 0)
    }

    /// Checks what an importer relies on before it connects anywhere or maps anything.
    /// It says nothing about whether the socket, the process or the block exist.
    ///
    /// # Errors
    /// The first [`CudaDescriptorError`] found.
    pub fn check(&self) -> Result<(), CudaDescriptorError> {
        if self.element_type_name != CUDA_ELEMENT_TYPE_U8 {
            return Err(CudaDescriptorError::ElementType(self.element_type_name.clone()));
        }
        if !self.use_ipc {
            return Err(CudaDescriptorError::NoIpc);
        }
        if self.vmm_block_size == 0 {
            return Err(CudaDescriptorError::EmptyBlock);
        }
        if self.size > self.vmm_block_size {
            return Err(CudaDescriptorError::SizeBeyondBlock { size: self.size, block_size: self.vmm_block_size });
        }
        if self.vmm_pid <= 0 {
            return Err(CudaDescriptorError::Pid(self.vmm_pid));
        }
        if self.device_id < 0 {
            return Err(CudaDescriptorError::Device(self.device_id));
        }
        let p = &self.vmm_socket_path;
        if !p.starts_with('/') || p.len() > MAX_SOCKET_PATH || p.contains('\0') {
            return Err(CudaDescriptorError::SocketPath(p.clone()));
        }
        Ok(())
    }
}

/// A `uint8[]` buffer field as received.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BufferData<'a> {
    /// The CPU form: the bytes, borrowed from the input.
    Bytes(&'a [u8]),
    /// The CUDA backend's descriptor in their place.
    Cuda(CudaBufferDescriptor),
}

impl<'a> Reader<'a> {
    /// Whether the next two aligned `u32` words are the descriptor markers. Reads
    /// nothing; the second word is looked at only when the first matches.
    fn at_descriptor(&self) -> bool {
        let word = |at: usize| {
            let b = self.buf.get(at..at + 4)?;
            let raw = [b[0], b[1], b[2], b[3]];
            Some(if self.big_endian { u32::from_be_bytes(raw) } else { u32::from_le_bytes(raw) })
        };
        let at = self.pos + self.padding(4);
        word(at) == Some(DESCRIPTOR_MARKER_1) && word(at + 4) == Some(DESCRIPTOR_MARKER_2)
    }

    /// The backend named by a buffer field in descriptor form, if `field` is one: for
    /// decoders that take only the CPU form, to say why they refuse it.
    pub(crate) fn descriptor_ahead(&self, field: &'static str) -> Result<(), CdrDecodeError> {
        if !self.at_descriptor() {
            return Ok(());
        }
        let mut peek = Reader { buf: self.buf, pos: self.pos, big_endian: self.big_endian };
        peek.u32(field)?;
        peek.u32(field)?;
        let backend = peek.string(field)?;
        Err(CdrDecodeError::BufferDescriptor { field, backend })
    }

    /// A buffer field that ends its message, in either form.
    pub(crate) fn last_buffer(&mut self, field: &'static str) -> Result<BufferData<'a>, CdrDecodeError> {
        if !self.at_descriptor() {
            return self.bytes(field).map(BufferData::Bytes);
        }
        self.u32(field)?;
        self.u32(field)?;
        let backend = self.string(field)?;
        if backend != CUDA_BACKEND {
            return Err(CdrDecodeError::UnknownBufferBackend { field, backend });
        }
        let size = self.u64("cuda descriptor size")?;
        let element_type_name = self.string("cuda descriptor element_type_name")?;
        let device_id = self.i32("cuda descriptor device_id")?;
        let use_ipc = match self.u8("cuda descriptor use_ipc")? {
            0 => false,
            1 => true,
            value => return Err(CdrDecodeError::InvalidBool { field: "cuda descriptor use_ipc", value }),
        };
        let vmm_pid = self.i32("cuda descriptor vmm_pid")?;
        let vmm_block_id = self.u32("cuda descriptor vmm_block_id")?;
        let vmm_block_size = self.u64("cuda descriptor vmm_block_size")?;
        let vmm_socket_path = self.string("cuda descriptor vmm_socket_path")?;
        let ipc_uid = self.u64("cuda descriptor ipc_uid")?;
        let mut ipc_event_handle = [0u8; 64];
        ipc_event_handle.copy_from_slice(self.take_padded(0, 64, "cuda descriptor ipc_event_handle")?);
        // 0.1.1's `serialized_data`: a whole sequence after the handle (anything shorter
        // than its length word is trailing padding).
        let layout = if self.remaining() >= 4 {
            self.bytes("cuda descriptor serialized_data")?;
            CudaDescriptorLayout::V0_1_1
        } else {
            CudaDescriptorLayout::V0_1_2
        };
        Ok(BufferData::Cuda(CudaBufferDescriptor {
            size,
            element_type_name,
            device_id,
            use_ipc,
            vmm_pid,
            vmm_block_id,
            vmm_block_size,
            vmm_socket_path,
            ipc_uid,
            ipc_event_handle,
            layout,
        }))
    }
}

impl Writer {
    /// A buffer field in descriptor form, holding `d`.
    pub(crate) fn cuda_descriptor(&mut self, d: &CudaBufferDescriptor) -> Result<(), CdrEncodeError> {
        self.u32(DESCRIPTOR_MARKER_1);
        self.u32(DESCRIPTOR_MARKER_2);
        self.string(CUDA_BACKEND, "backend")?;
        self.u64(d.size);
        self.string(&d.element_type_name, "cuda descriptor element_type_name")?;
        self.i32(d.device_id);
        self.u8(u8::from(d.use_ipc));
        self.i32(d.vmm_pid);
        self.u32(d.vmm_block_id);
        self.u64(d.vmm_block_size);
        self.string(&d.vmm_socket_path, "cuda descriptor vmm_socket_path")?;
        self.u64(d.ipc_uid);
        self.extend(&d.ipc_event_handle);
        if d.layout == CudaDescriptorLayout::V0_1_1 {
            self.u32(0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn descriptor() -> CudaBufferDescriptor {
        CudaBufferDescriptor {
            size: 33_177_600,
            element_type_name: "h".into(),
            device_id: 0,
            use_ipc: true,
            vmm_pid: 12345,
            vmm_block_id: 3,
            vmm_block_size: 32 << 20,
            vmm_socket_path: "/tmp/cuda_vmm_12345_3.sock".into(),
            ipc_uid: 7,
            ipc_event_handle: [0xab; 64],
            layout: CudaDescriptorLayout::V0_1_2,
        }
    }

    #[test]
    fn checks_refuse_what_an_importer_must_not_trust() {
        assert_eq!(descriptor().check(), Ok(()));
        let bad = |f: fn(&mut CudaBufferDescriptor)| {
            let mut d = descriptor();
            f(&mut d);
            d.check().unwrap_err()
        };
        assert_eq!(bad(|d| d.element_type_name = "f".into()), CudaDescriptorError::ElementType("f".into()));
        assert_eq!(bad(|d| d.use_ipc = false), CudaDescriptorError::NoIpc);
        assert_eq!(bad(|d| d.vmm_block_size = 0), CudaDescriptorError::EmptyBlock);
        assert_eq!(
            bad(|d| d.size = (32 << 20) + 1),
            CudaDescriptorError::SizeBeyondBlock { size: (32 << 20) + 1, block_size: 32 << 20 }
        );
        assert_eq!(bad(|d| d.vmm_pid = 0), CudaDescriptorError::Pid(0));
        assert_eq!(bad(|d| d.device_id = -1), CudaDescriptorError::Device(-1));
        for path in ["relative.sock", "", "/a\0b"] {
            let mut d = descriptor();
            d.vmm_socket_path = path.into();
            assert_eq!(d.check(), Err(CudaDescriptorError::SocketPath(path.into())), "{path:?}");
        }
        let mut d = descriptor();
        d.vmm_socket_path = format!("/{}", "s".repeat(107));
        assert!(matches!(d.check(), Err(CudaDescriptorError::SocketPath(_))));
        d.vmm_socket_path.pop();
        assert_eq!(d.check(), Ok(()));
        let mut d = descriptor();
        assert!(d.has_event());
        d.ipc_event_handle = [0; 64];
        assert!(!d.has_event());
    }
}
