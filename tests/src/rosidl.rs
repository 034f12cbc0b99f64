//! A block as a publisher of ROS 2's CUDA buffer backend serves it (`cuda_buffer`
//! 0.1.2, docs/cuda-buffer-backend.md): a VMM allocation exported as a POSIX FD, served
//! on `/tmp/cuda_vmm_<pid>_<block>.sock` (one byte and the FD per connection), and its
//! 24 shared bytes at `/dev/shm/cuda_vmm_<pid>_<block>`. For the peers of the GPU tests
//! and of `zcs_rosidl_bench`, written from the backend's sources.

use std::os::fd::AsFd;
use std::path::PathBuf;

use zcs_wire::rosidl_cuda::{BlockMeta, serve_block_fd};
use zenoh_cuda_shm::cuda::{DeviceBlock, Gpu};
use zenoh_cuda_shm::tensor_codec::cdr::{CudaBufferDescriptor, CudaDescriptorLayout};

/// One served block; its files are removed when it is dropped (the socket's thread
/// ends with the process).
pub struct ServedBlock {
    /// The allocation.
    pub block: DeviceBlock,
    /// Its shared count and reuse id.
    pub meta: BlockMeta,
    /// Its socket.
    pub socket: PathBuf,
    /// Its number in this process.
    pub id: u32,
}

impl ServedBlock {
    /// Allocates block `id` of this process with room for `len` bytes and serves it.
    ///
    /// # Panics
    /// When the allocation, the shared file or the socket cannot be made.
    pub fn new(gpu: &Gpu, id: u32, len: usize) -> Self {
        let pid = std::process::id() as i32;
        let block = DeviceBlock::allocate(gpu, len).expect("a block");
        let path = BlockMeta::path_of(pid, id);
        let _ = std::fs::remove_file(&path);
        let meta = BlockMeta::create_at(&path).expect("the block's shared bytes");
        let socket = PathBuf::from(format!("/tmp/cuda_vmm_{pid}_{id}.sock"));
        let _ = std::fs::remove_file(&socket);
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("the block's socket");
        let fd = block.fd().try_clone_to_owned().expect("dup the block's FD");
        std::thread::spawn(move || while serve_block_fd(&listener, fd.as_fd()).is_ok() {});
        Self { block, meta, socket, id }
    }

    /// The descriptor of its first `len` bytes under reuse id `uid` (0.1.2 layout), with
    /// the writer's event handle.
    pub fn descriptor(&self, gpu: &Gpu, len: usize, uid: u64, event_handle: [u8; 64]) -> CudaBufferDescriptor {
        CudaBufferDescriptor {
            size: len as u64,
            element_type_name: "h".into(),
            device_id: gpu.ordinal() as i32,
            use_ipc: true,
            vmm_pid: std::process::id() as i32,
            vmm_block_id: self.id,
            vmm_block_size: self.block.size() as u64,
            vmm_socket_path: self.socket.display().to_string(),
            ipc_uid: uid,
            ipc_event_handle: event_handle,
            layout: CudaDescriptorLayout::V0_1_2,
        }
    }
}

impl Drop for ServedBlock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(BlockMeta::path_of(std::process::id() as i32, self.id));
        let _ = std::fs::remove_file(&self.socket);
    }
}
