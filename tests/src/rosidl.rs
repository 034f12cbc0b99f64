//! A block as a publisher of ROS 2's CUDA buffer backend serves it (`cuda_buffer`
//! 0.1.2, docs/cuda-buffer-backend.md): a VMM allocation exported as a POSIX FD, served
//! on `/tmp/cuda_vmm_<pid>_<block>.sock` (one byte and the FD per connection), and its
//! 24 shared bytes at `/dev/shm/cuda_vmm_<pid>_<block>`. For the peers of the GPU tests
//! and of `zcs_rosidl_bench`, written from the backend's sources.

use std::os::fd::AsFd;
use std::path::PathBuf;

use zcs_wire::rosidl_cuda::{BlockMeta, serve_block_fd};
use zenoh_cuda_shm::cuda::{DeviceBlock, Gpu};
use zenoh_cuda_shm::tensor_codec::cdr::{CudaBufferDescriptor, CudaDescriptorLayout, Header, Image, Time};

/// The fields of a `w`×`h` rgba8 Image of frame `camera`, its data left out.
pub fn rgba_frame(w: u32, h: u32) -> Image<()> {
    Image {
        header: Header { stamp: Time { sec: 1, nanosec: 2 }, frame_id: "camera".into() },
        height: h,
        width: w,
        encoding: "rgba8".into(),
        is_bigendian: 0,
        step: w * 4,
        data: (),
    }
}

/// A session on this host's GPU, listening on or connecting to a loopback port.
///
/// # Panics
/// When the session cannot be opened.
pub fn cuda_session(listen: Option<u16>, connect: Option<u16>) -> zenoh_cuda_shm::GpuSession {
    use zenoh_cuda_shm::config::DeviceChoice;
    use zenoh_cuda_shm::{GpuSession, ZcsConfig};
    GpuSession::open(
        crate::loopback_zenoh_config(listen, connect, None),
        ZcsConfig { device: DeviceChoice::Cuda, ..ZcsConfig::default() },
    )
    .wait()
    .expect("a session on the GPU")
}

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

static NEXT_EID: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(10);

/// Where a peer subscription puts itself in the host endpoint registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registered {
    /// With its device ordinal and uid: CUDA publishers send it descriptors.
    SameDevice,
    /// With another ordinal (a subscription on another GPU): they send it CDR.
    OtherDevice,
}

/// A subscription of rmw_zenoh 0.12.0 accepting the `cuda` backend, as its sources
/// describe it (docs/cuda-buffer-backend.md): its registry entry written before its
/// token (`cuda_buffer_backend_plugin.cpp:66-80`, `rmw_subscription_data.cpp:280`), its
/// `MS` token ending in `backends:cuda:` (`rmw_subscription_data.cpp:127-218`), and
/// listening on the data key and on `<data key>/_buf/<its GID>`
/// (`rmw_subscription_data.cpp:442-476`). For the GPU tests and `zcs_rosidl_bench`.
pub struct TheirSubscription {
    /// Its GID (what publishers key `_buf/<GID>` by).
    pub gid: [u8; 16],
    /// The data key.
    pub key: String,
    /// Messages as they arrive: whether on `_buf/<GID>`, and the payload.
    pub rx: flume::Receiver<(bool, Vec<u8>)>,
    _subs: [zenoh::pubsub::Subscriber<()>; 2],
    _token: zenoh::liveliness::LivelinessToken,
    _registry: zcs_wire::rosidl_cuda::HostRegistry,
}

impl TheirSubscription {
    /// Declares a subscription of `Image` on `topic` in `domain`.
    ///
    /// # Panics
    /// When the registry, the token or a subscriber cannot be had.
    pub fn declare(z: &zenoh::Session, domain: u32, topic: &str, gpu: &Gpu, registered: Registered) -> Self {
        use zenoh::Wait;
        use zenoh_cuda_shm::tensor_codec::cdr::Image;
        use zenoh_cuda_shm_ros2::RosDataMessage;
        use zenoh_cuda_shm_ros2::names::{gid_hex, gid_of, mangle, topic_key};

        let dds = <Image<()> as RosDataMessage>::DDS_TYPE_NAME;
        let hash = <Image<()> as RosDataMessage>::type_hash().to_string();
        let key = topic_key(domain, topic, dds, &hash);
        let qos = zenoh_cuda_shm_ros2::Qos::reliable(10).to_keyexpr();
        let token = format!(
            "@ros2_lv/{domain}/{}/0/{}/MS/%/%/their_sub/{}/{dds}/{hash}/{qos}/backends:cuda:",
            z.zid(),
            NEXT_EID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            mangle(topic)
        );
        let gid = gid_of(&token);
        let registry = zcs_wire::rosidl_cuda::HostRegistry::open(0).expect("the host registry");
        let ordinal = gpu.ordinal() as i32 + i32::from(registered == Registered::OtherDevice);
        registry
            .register(gid, zcs_wire::rosidl_cuda::EndpointKind::Subscription, ordinal, true, "sensor_msgs/msg/Image")
            .expect("our registry entry");
        let (tx, rx) = flume::unbounded();
        let on = |buf: bool| {
            let tx = tx.clone();
            move |s: zenoh::sample::Sample| {
                let _ = tx.send((buf, s.payload().to_bytes().into_owned()));
            }
        };
        let data = z.declare_subscriber(key.clone()).callback(on(false)).wait().expect("the data key");
        let buf =
            z.declare_subscriber(format!("{key}/_buf/{}", gid_hex(&gid))).callback(on(true)).wait().expect("_buf key");
        let token = z.liveliness().declare_token(token).wait().expect("the MS token");
        Self { gid, key, rx, _subs: [data, buf], _token: token, _registry: registry }
    }
}
