// zenoh-cuda-shm for C++: a header-only layer over the C ABI (zenoh_cuda_shm.h).
//
// Owners are move-only and end their object in their destructor (which never throws).
// Errors are thrown as zcs::Error, carrying the C result code and the library's
// message: the convention of zenoh-cpp, whose users this header is for. A call that
// waits and may find nothing (Subscriber::recv) returns std::optional instead.
//
//   zcs::Session session(R"({mode: "peer"})", R"({device: "auto"})");
//   zcs::Publisher pub(session, "camera/front");
//   zcs::Loan loan = pub.loan(size);       // write loan.host_data() or loan.device_ptr()
//   uint64_t seq = pub.put(std::move(loan));
//   zcs::Subscriber sub(session, "camera/front");
//   if (auto s = sub.recv(std::chrono::milliseconds(100))) { s->seq(); s->host_data(); }
//
// Tensors travel with their description (zcs::TensorDesc, DLPack's fields):
//   pub.put_tensor(loan, zcs::TensorDesc{zcs::DType::f32(), {480, 640, 3}});
//   if (auto t = s->tensor()) { t->shape; }      // or s->to_dlpack(stream) for a framework
#ifndef ZENOH_CUDA_SHM_HPP
#define ZENOH_CUDA_SHM_HPP

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "zenoh_cuda_shm.h"

namespace zcs {

// A failed call: its result code and message.
class Error : public std::runtime_error {
   public:
    Error(zcs_result_t code, const std::string &what)
        : std::runtime_error(what + ": " + zcs_last_error() + " (" + zcs_result_name(code) + ")"), code_(code) {}
    zcs_result_t code() const noexcept { return code_; }

   private:
    zcs_result_t code_;
};

namespace detail {
inline void check(zcs_result_t r, const char *what) {
    if (r != ZCS_OK) throw Error(r, what);
}

// A move-only owner of a handle `H`, ended by `Drop` (its error, if any, ignored: a
// destructor does not throw).
template <typename H, zcs_result_t (*Drop)(H *)>
class Owner {
   public:
    Owner() noexcept : h_{} {}
    explicit Owner(H h) noexcept : h_(h) {}
    Owner(const Owner &) = delete;
    Owner &operator=(const Owner &) = delete;
    Owner(Owner &&o) noexcept : h_(std::exchange(o.h_, H{})) {}
    Owner &operator=(Owner &&o) noexcept {
        if (this != &o) {
            reset();
            h_ = std::exchange(o.h_, H{});
        }
        return *this;
    }
    ~Owner() { reset(); }
    void reset() noexcept {
        if (h_.id != 0) (void)Drop(&h_);
    }
    H handle() const noexcept { return h_; }
    H *handle_ptr() noexcept { return &h_; }
    explicit operator bool() const noexcept { return h_.id != 0; }

   private:
    H h_;
};
}  // namespace detail

// An element type: DLPack's (code, bits, lanes).
struct DType {
    uint8_t code = 0;
    uint8_t bits = 0;
    uint16_t lanes = 1;
    static constexpr DType i8() { return {0, 8, 1}; }
    static constexpr DType i32() { return {0, 32, 1}; }
    static constexpr DType i64() { return {0, 64, 1}; }
    static constexpr DType u8() { return {1, 8, 1}; }
    static constexpr DType u16() { return {1, 16, 1}; }
    static constexpr DType f16() { return {2, 16, 1}; }
    static constexpr DType f32() { return {2, 32, 1}; }
    static constexpr DType f64() { return {2, 64, 1}; }
    static constexpr DType bf16() { return {4, 16, 1}; }
    bool operator==(const DType &o) const { return code == o.code && bits == o.bits && lanes == o.lanes; }
};

// A tensor's description: DLPack's DLTensor without the data pointer. Strides are in
// elements (empty: compact row-major). device_type 0 when publishing means "the
// publisher's memory"; received descriptions name it (1: kDLCPU, 2: kDLCUDA).
struct TensorDesc {
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<int64_t> strides;
    uint64_t byte_offset = 0;
    int32_t device_type = 0;
    int32_t device_id = 0;

    TensorDesc() = default;
    TensorDesc(DType dt, std::vector<int64_t> shp, std::vector<int64_t> str = {}, uint64_t offset = 0)
        : dtype(dt), shape(std::move(shp)), strides(std::move(str)), byte_offset(offset) {}

    // The C view of this description, valid while it lives unchanged.
    zcs_tensor_t c() const noexcept {
        zcs_tensor_t t{};
        t.dtype_code = dtype.code;
        t.dtype_bits = dtype.bits;
        t.dtype_lanes = dtype.lanes;
        t.device_type = device_type;
        t.device_id = device_id;
        t.ndim = static_cast<int32_t>(shape.size());
        t.shape = shape.data();
        t.strides = strides.empty() ? nullptr : strides.data();
        t.byte_offset = byte_offset;
        return t;
    }
};

// An exported DLPack tensor; its deleter runs when this is destroyed, unless
// release() handed it on (to at::fromDLPack, a Python capsule, …).
using DLPack = std::unique_ptr<DLManagedTensorVersioned, decltype(&zcs_dlpack_free)>;

// A sample read in device memory on a stream: the device address, valid for work
// enqueued on that stream; ended (a fence recorded there) when destroyed or by end().
// Enqueue the work that reads it first.
class Read : public detail::Owner<zcs_read_t, zcs_read_end> {
   public:
    Read(zcs_read_t h, uint64_t device_ptr) noexcept : Owner(h), ptr_(device_ptr) {}
    uint64_t device_ptr() const noexcept { return ptr_; }
    // Ends the read now, and says so if recording its fence fails.
    void end() { detail::check(zcs_read_end(handle_ptr()), "zcs_read_end"); }

   private:
    uint64_t ptr_;
};

// A received message. Its bytes stay valid while it lives; dropping it gives a block
// back to its publisher.
class Sample : public detail::Owner<zcs_sample_t, zcs_sample_drop> {
   public:
    // Reads it in device memory on `stream` (a CUstream of the session's device;
    // nullptr: the legacy default stream), without a host wait (a CUDA session only).
    Read read(void *stream) const {
        zcs_read_t r{};
        uint64_t p = 0;
        detail::check(zcs_sample_read(handle(), stream, &r, &p), "zcs_sample_read");
        return Read(r, p);
    }
    explicit Sample(zcs_sample_t h) noexcept : Owner(h) {}
    uint64_t seq() const {
        uint64_t v = 0;
        detail::check(zcs_sample_seq(handle(), &v), "zcs_sample_seq");
        return v;
    }
    size_t size() const {
        size_t v = 0;
        detail::check(zcs_sample_len(handle(), &v), "zcs_sample_len");
        return v;
    }
    // Publication time, ns since the Unix epoch (CLOCK_REALTIME); 0 when unknown.
    uint64_t timestamp_ns() const {
        uint64_t v = 0;
        detail::check(zcs_sample_timestamp_ns(handle(), &v), "zcs_sample_timestamp_ns");
        return v;
    }
    // How it came: "zero-copy", "cpu-bytes", "inline", "host-block", …
    std::string path() const {
        const char *p = nullptr;
        detail::check(zcs_sample_path(handle(), &p), "zcs_sample_path");
        return p;
    }
    // Its bytes in host memory, read in place; nullopt for a block in device memory.
    std::optional<std::pair<const uint8_t *, size_t>> host_data() const {
        const uint8_t *d = nullptr;
        size_t n = 0;
        zcs_result_t r = zcs_sample_host_data(handle(), &d, &n);
        if (r == ZCS_ERR_MEMORY) return std::nullopt;
        detail::check(r, "zcs_sample_host_data");
        return std::make_pair(d, n);
    }
    // A host copy of its bytes (device→host for a block on the GPU).
    std::vector<uint8_t> to_vector() const {
        std::vector<uint8_t> v(size());
        detail::check(zcs_sample_copy_to_host(handle(), v.data(), v.size()), "zcs_sample_copy_to_host");
        return v;
    }
    // Its tensor description; nullopt for a sample published as plain bytes.
    std::optional<TensorDesc> tensor() const {
        zcs_tensor_t t{};
        zcs_result_t r = zcs_sample_tensor(handle(), &t);
        if (r == ZCS_ERR_NO_TENSOR) return std::nullopt;
        detail::check(r, "zcs_sample_tensor");
        TensorDesc d;
        d.dtype = DType{t.dtype_code, t.dtype_bits, t.dtype_lanes};
        d.shape.assign(t.shape, t.shape + t.ndim);
        d.strides.assign(t.strides, t.strides + t.ndim);
        d.byte_offset = t.byte_offset;
        d.device_type = t.device_type;
        d.device_id = t.device_id;
        return d;
    }
    // Exports it as DLPack for work on `stream` (flags: ZCS_DLPACK_*); in place where
    // it can be.
    DLPack to_dlpack(void *stream, uint32_t flags = 0) const {
        DLManagedTensorVersioned *m = nullptr;
        detail::check(zcs_sample_to_dlpack(handle(), stream, flags, &m), "zcs_sample_to_dlpack");
        return DLPack(m, &zcs_dlpack_free);
    }
};

class Session : public detail::Owner<zcs_session_t, zcs_session_close> {
   public:
    // Zenoh's configuration and ours as JSON5 text; nullptr: defaults.
    explicit Session(const char *zenoh_json5 = nullptr, const char *zcs_json5 = nullptr) {
        detail::check(zcs_session_open(zenoh_json5, zcs_json5, handle_ptr()), "zcs_session_open");
    }
    // Makes the session's CUDA context current on this thread (a CUDA session only).
    void bind_gpu() const { detail::check(zcs_session_bind_gpu(handle()), "zcs_session_bind_gpu"); }
    // "cuda" or "host".
    std::string backend() const {
        const char *b = nullptr;
        detail::check(zcs_session_backend(handle(), &b), "zcs_session_backend");
        return b;
    }
    // The keys of this library's publishers the session sees now (sorted), waiting up to
    // `timeout` for answers; with `other_than`, those that key expression does not match
    // (where to look when a subscriber hears nothing). Plain Zenoh publishers are not listed.
    std::vector<std::string> publisher_keys(std::chrono::milliseconds timeout = std::chrono::milliseconds(500),
                                            const char *other_than = nullptr) const {
        struct Keys {
            std::vector<std::string> list;
            bool failed = false;
        } keys;
        auto add = [](const char *key, void *context) noexcept {
            auto *k = static_cast<Keys *>(context);
            try {
                k->list.emplace_back(key);
            } catch (...) {
                k->failed = true;
            }
        };
        detail::check(zcs_session_publisher_keys(handle(), other_than, static_cast<uint64_t>(timeout.count()), add,
                                                 &keys),
                      "zcs_session_publisher_keys");
        if (keys.failed) throw std::bad_alloc();
        return keys.list;
    }
};

// A block loaned from a publisher: write it, then Publisher::put it.
class Loan : public detail::Owner<zcs_loan_t, zcs_loan_drop> {
   public:
    explicit Loan(zcs_loan_t h) noexcept : Owner(h) {}
    size_t size() const {
        size_t v = 0;
        detail::check(zcs_loan_len(handle(), &v), "zcs_loan_len");
        return v;
    }
    // Host memory to write, or nullptr when the loan is in device memory.
    uint8_t *host_data() const {
        uint8_t *p = nullptr;
        zcs_result_t r = zcs_loan_host_ptr(handle(), &p);
        if (r == ZCS_ERR_MEMORY) return nullptr;
        detail::check(r, "zcs_loan_host_ptr");
        return p;
    }
    // The device address and the CUstream to write it on (device memory only).
    std::pair<uint64_t, void *> device_ptr() const {
        uint64_t p = 0;
        void *s = nullptr;
        detail::check(zcs_loan_device_ptr(handle(), &p, &s), "zcs_loan_device_ptr");
        return {p, s};
    }
};

class Publisher : public detail::Owner<zcs_publisher_t, zcs_publisher_drop> {
   public:
    Publisher(const Session &s, const std::string &key) {
        detail::check(zcs_publisher_declare(s.handle(), key.c_str(), handle_ptr()), "zcs_publisher_declare");
    }
    Loan loan(size_t size) const {
        zcs_loan_t l{};
        detail::check(zcs_publisher_loan(handle(), size, &l), "zcs_publisher_loan");
        return Loan(l);
    }
    // Publishes the loan (which is consumed either way); the message's sequence number.
    uint64_t put(Loan &&loan) const {
        Loan l = std::move(loan);
        uint64_t seq = 0;
        detail::check(zcs_publisher_put(handle(), l.handle_ptr(), &seq), "zcs_publisher_put");
        return seq;
    }
    uint64_t put_bytes(const void *data, size_t size) const {
        uint64_t seq = 0;
        detail::check(zcs_publisher_put_bytes(handle(), static_cast<const uint8_t *>(data), size, &seq),
                      "zcs_publisher_put_bytes");
        return seq;
    }
    // Publishes the loan as the tensor `t` describes. On success the loan is consumed;
    // a description that does not fit throws and leaves the loan with the caller.
    uint64_t put_tensor(Loan &loan, const TensorDesc &t) const {
        zcs_tensor_t c = t.c();
        uint64_t seq = 0;
        // The call zeroes the loan's handle when it takes the loan, not when it refuses it.
        detail::check(zcs_publisher_put_tensor(handle(), loan.handle_ptr(), &c, &seq), "zcs_publisher_put_tensor");
        return seq;
    }
    uint64_t put_tensor_host(const void *data, size_t size, const TensorDesc &t) const {
        zcs_tensor_t c = t.c();
        uint64_t seq = 0;
        detail::check(zcs_publisher_put_tensor_host(handle(), static_cast<const uint8_t *>(data), size, &c, &seq),
                      "zcs_publisher_put_tensor_host");
        return seq;
    }
    // Copies `size` bytes of device memory at `src` on `stream` into a block and
    // publishes it as `t` describes, without waiting for the stream.
    uint64_t put_tensor_device(uint64_t src, size_t size, const TensorDesc &t, void *stream) const {
        zcs_tensor_t c = t.c();
        uint64_t seq = 0;
        detail::check(zcs_publisher_put_tensor_device(handle(), src, size, &c, stream, &seq),
                      "zcs_publisher_put_tensor_device");
        return seq;
    }
    // Copies `size` bytes of device memory at `src` on `stream` into a block and
    // publishes them, without waiting for the stream.
    uint64_t put_device(uint64_t src, size_t size, void *stream) const {
        uint64_t seq = 0;
        detail::check(zcs_publisher_put_device(handle(), src, size, stream, &seq), "zcs_publisher_put_device");
        return seq;
    }
    // GPU-aware subscribers known, and whether a plain Zenoh subscriber listens.
    std::pair<size_t, bool> subscribers() const {
        size_t aware = 0;
        bool plain = false;
        detail::check(zcs_publisher_subscribers(handle(), &aware, &plain), "zcs_publisher_subscribers");
        return {aware, plain};
    }
    // Subscribers served in place now (on a zero-copy path).
    size_t zero_copy_subscribers() const {
        size_t n = 0;
        detail::check(zcs_publisher_zero_copy_subscribers(handle(), &n), "zcs_publisher_zero_copy_subscribers");
        return n;
    }
    // Blocks loaned or held by subscribers now (0: every message given back).
    size_t blocks_in_use() const {
        size_t n = 0;
        detail::check(zcs_publisher_blocks_in_use(handle(), &n), "zcs_publisher_blocks_in_use");
        return n;
    }
};

class Subscriber : public detail::Owner<zcs_subscriber_t, zcs_subscriber_drop> {
   public:
    Subscriber(const Session &s, const std::string &key) {
        detail::check(zcs_subscriber_declare(s.handle(), key.c_str(), handle_ptr()), "zcs_subscriber_declare");
    }
    // The next sample, or nullopt if none came within `timeout`; throws once the
    // session is closed (ZCS_ERR_CLOSED).
    std::optional<Sample> recv(std::chrono::milliseconds timeout) const {
        zcs_sample_t s{};
        zcs_result_t r = zcs_subscriber_recv(handle(), static_cast<uint64_t>(timeout.count()), &s);
        if (r == ZCS_ERR_TIMEOUT) return std::nullopt;
        detail::check(r, "zcs_subscriber_recv");
        return Sample(s);
    }
    // Its counters: what came by each path, lost, duplicates, dropped by the full queue.
    zcs_subscriber_stats_t stats() const {
        zcs_subscriber_stats_t st{};
        detail::check(zcs_subscriber_stats(handle(), &st), "zcs_subscriber_stats");
        return st;
    }
};

// ROS 2 over rmw_zenoh (the zcs_ros_* functions): a node, and publishers and
// subscriptions of sensor_msgs/msg/Image and tensor_msgs/msg/ExperimentalTensor.
//
//   zcs::ros::Node node(session, "camera_driver");
//   zcs::ros::ImagePublisher pub(node, "/camera/image", zcs::ros::QoS(10));
//   zcs::Loan loan = pub.loan(fields.step * fields.height);   // write it, then
//   pub.publish(fields, loan);
//   zcs::ros::ImageSubscriber sub(node, "/camera/image");
//   if (auto m = sub.recv(std::chrono::milliseconds(100))) { m->fields().width; m->host_data(); }
namespace ros {

// A QoS profile, set as rclcpp's QoS is: QoS(depth) is reliable, volatile, keep last
// `depth`; the setters change one policy each.
struct QoS {
    zcs_ros_qos_t c;

    explicit QoS(uint32_t depth = 10) {
        detail::check(zcs_ros_qos_default(&c), "zcs_ros_qos_default");
        c.depth = depth;
    }
    // rclcpp's SensorDataQoS: best effort, volatile, keep last 5.
    static QoS sensor_data() {
        QoS q;
        detail::check(zcs_ros_qos_sensor_data(&q.c), "zcs_ros_qos_sensor_data");
        return q;
    }
    QoS &reliable() { return set(c.reliability, ZCS_ROS_RELIABILITY_RELIABLE); }
    QoS &best_effort() { return set(c.reliability, ZCS_ROS_RELIABILITY_BEST_EFFORT); }
    QoS &durability_volatile() { return set(c.durability, ZCS_ROS_DURABILITY_VOLATILE); }
    QoS &transient_local() { return set(c.durability, ZCS_ROS_DURABILITY_TRANSIENT_LOCAL); }
    QoS &keep_last(uint32_t depth) {
        c.depth = depth;
        return set(c.history, ZCS_ROS_HISTORY_KEEP_LAST);
    }
    QoS &keep_all() { return set(c.history, ZCS_ROS_HISTORY_KEEP_ALL); }

   private:
    QoS &set(uint32_t &field, uint32_t value) {
        field = value;
        return *this;
    }
};

// The fields of a sensor_msgs/msg/Image but its data.
struct ImageFields {
    int32_t stamp_sec = 0;
    uint32_t stamp_nanosec = 0;
    std::string frame_id;
    uint32_t height = 0;
    uint32_t width = 0;
    std::string encoding;
    uint8_t is_bigendian = 0;
    uint32_t step = 0;

    // The C view of these fields, valid while they live unchanged.
    zcs_ros_image_t c() const noexcept {
        zcs_ros_image_t m{};
        m.stamp_sec = stamp_sec;
        m.stamp_nanosec = stamp_nanosec;
        m.frame_id = frame_id.c_str();
        m.height = height;
        m.width = width;
        m.encoding = encoding.c_str();
        m.is_bigendian = is_bigendian;
        m.step = step;
        return m;
    }
};

// A ROS node of a session, in the domain's graph while it (or an endpoint made from
// it) lives.
class Node : public detail::Owner<zcs_ros_node_t, zcs_ros_node_drop> {
   public:
    Node(const Session &s, const std::string &name, const std::string &ns = "/",
         uint32_t domain = ZCS_ROS_DOMAIN_FROM_ENV) {
        detail::check(zcs_ros_node_create(s.handle(), name.c_str(), ns.c_str(), domain, handle_ptr()),
                      "zcs_ros_node_create");
    }
    uint32_t domain() const {
        uint32_t d = 0;
        detail::check(zcs_ros_node_domain(handle(), &d), "zcs_ros_node_domain");
        return d;
    }
};

// What publishers of both types share.
class PublisherBase : public detail::Owner<zcs_ros_publisher_t, zcs_ros_publisher_drop> {
   public:
    // A block for one message's data: write it, then publish it.
    Loan loan(size_t size) const {
        zcs_loan_t l{};
        detail::check(zcs_ros_publisher_loan(handle(), size, &l), "zcs_ros_publisher_loan");
        return Loan(l);
    }
    // The topic as resolved.
    std::string topic() const {
        const char *t = nullptr;
        detail::check(zcs_ros_publisher_topic(handle(), &t), "zcs_ros_publisher_topic");
        return t;
    }
    // The topic's subscriptions now: ours (our channel) and ordinary ROS ones (CDR).
    std::pair<size_t, size_t> subscriptions() const {
        size_t ours = 0, ordinary = 0;
        detail::check(zcs_ros_publisher_subscriptions(handle(), &ours, &ordinary), "zcs_ros_publisher_subscriptions");
        return {ours, ordinary};
    }
};

class ImagePublisher : public PublisherBase {
   public:
    ImagePublisher(const Node &n, const std::string &topic, const QoS &qos = QoS()) {
        detail::check(zcs_ros_publisher_declare_image(n.handle(), topic.c_str(), &qos.c, handle_ptr()),
                      "zcs_ros_publisher_declare_image");
    }
    // Publishes `fields` with the loan as data (step * height bytes); the message's
    // ROS sequence number. Refused fields throw and leave the loan with the caller;
    // otherwise the loan is consumed.
    int64_t publish(const ImageFields &fields, Loan &loan) const {
        zcs_ros_image_t m = fields.c();
        int64_t seq = 0;
        detail::check(zcs_ros_publisher_publish_image(handle(), &m, loan.handle_ptr(), &seq),
                      "zcs_ros_publisher_publish_image");
        return seq;
    }
    // Publishes `fields` with `size` bytes at `data` (copied) as data.
    int64_t publish_host(const ImageFields &fields, const void *data, size_t size) const {
        zcs_ros_image_t m = fields.c();
        int64_t seq = 0;
        detail::check(zcs_ros_publisher_publish_image_host(handle(), &m, static_cast<const uint8_t *>(data), size, &seq),
                      "zcs_ros_publisher_publish_image_host");
        return seq;
    }
};

class TensorPublisher : public PublisherBase {
   public:
    TensorPublisher(const Node &n, const std::string &topic, const QoS &qos = QoS()) {
        detail::check(zcs_ros_publisher_declare_tensor(n.handle(), topic.c_str(), &qos.c, handle_ptr()),
                      "zcs_ros_publisher_declare_tensor");
    }
    // Publishes the loan as the tensor `t` describes; as ImagePublisher::publish.
    int64_t publish(const TensorDesc &t, Loan &loan) const {
        zcs_tensor_t c = t.c();
        int64_t seq = 0;
        detail::check(zcs_ros_publisher_publish_tensor(handle(), &c, loan.handle_ptr(), &seq),
                      "zcs_ros_publisher_publish_tensor");
        return seq;
    }
    int64_t publish_host(const TensorDesc &t, const void *data, size_t size) const {
        zcs_tensor_t c = t.c();
        int64_t seq = 0;
        detail::check(zcs_ros_publisher_publish_tensor_host(handle(), &c, static_cast<const uint8_t *>(data), size, &seq),
                      "zcs_ros_publisher_publish_tensor_host");
        return seq;
    }
};

// What received messages of both types share: the attachment and the data.
class SampleBase : public detail::Owner<zcs_ros_sample_t, zcs_ros_sample_drop> {
   public:
    explicit SampleBase(zcs_ros_sample_t h) noexcept : Owner(h) {}
    // The ROS sequence number (from 1, per publisher).
    int64_t seq() const {
        int64_t v = 0;
        detail::check(zcs_ros_sample_attachment(handle(), &v, nullptr, nullptr), "zcs_ros_sample_attachment");
        return v;
    }
    // The source timestamp, ns since the Unix epoch.
    int64_t timestamp_ns() const {
        int64_t v = 0;
        detail::check(zcs_ros_sample_attachment(handle(), nullptr, &v, nullptr), "zcs_ros_sample_attachment");
        return v;
    }
    // The publisher's GID.
    std::array<uint8_t, 16> gid() const {
        std::array<uint8_t, 16> g{};
        detail::check(zcs_ros_sample_attachment(handle(), nullptr, nullptr, g.data()), "zcs_ros_sample_attachment");
        return g;
    }
    // How the data came: "zero-copy", "cpu-bytes", …, or "plain" (an ordinary publisher's CDR).
    std::string path() const {
        const char *p = nullptr;
        detail::check(zcs_ros_sample_path(handle(), &p), "zcs_ros_sample_path");
        return p;
    }
    size_t data_size() const {
        size_t n = 0;
        detail::check(zcs_ros_sample_data_len(handle(), &n), "zcs_ros_sample_data_len");
        return n;
    }
    // The data in host memory, read in place; nullopt when it is in device memory.
    std::optional<std::pair<const uint8_t *, size_t>> host_data() const {
        const uint8_t *d = nullptr;
        size_t n = 0;
        zcs_result_t r = zcs_ros_sample_host_data(handle(), &d, &n);
        if (r == ZCS_ERR_MEMORY) return std::nullopt;
        detail::check(r, "zcs_ros_sample_host_data");
        return std::make_pair(d, n);
    }
    // A host copy of the data (device→host for a block on the GPU).
    std::vector<uint8_t> to_vector() const {
        std::vector<uint8_t> v(data_size());
        detail::check(zcs_ros_sample_copy_to_host(handle(), v.data(), v.size()), "zcs_ros_sample_copy_to_host");
        return v;
    }
    // The data as a sample of our channel (Sample::read on a stream, in place); nullopt
    // for a message of an ordinary ROS publisher, whose data is host bytes.
    std::optional<Sample> gpu_sample() const {
        zcs_sample_t s{};
        zcs_result_t r = zcs_ros_sample_gpu_sample(handle(), &s);
        if (r == ZCS_ERR_MEMORY) return std::nullopt;
        detail::check(r, "zcs_ros_sample_gpu_sample");
        return Sample(s);
    }
};

class ImageSample : public SampleBase {
   public:
    explicit ImageSample(zcs_ros_sample_t h) noexcept : SampleBase(h) {}
    ImageFields fields() const {
        zcs_ros_image_t m{};
        detail::check(zcs_ros_sample_image(handle(), &m), "zcs_ros_sample_image");
        ImageFields f;
        f.stamp_sec = m.stamp_sec;
        f.stamp_nanosec = m.stamp_nanosec;
        f.frame_id = m.frame_id;
        f.height = m.height;
        f.width = m.width;
        f.encoding = m.encoding;
        f.is_bigendian = m.is_bigendian;
        f.step = m.step;
        return f;
    }
};

class TensorSample : public SampleBase {
   public:
    explicit TensorSample(zcs_ros_sample_t h) noexcept : SampleBase(h) {}
    // The message's description; device_type says where the data is now.
    TensorDesc tensor() const {
        zcs_tensor_t t{};
        detail::check(zcs_ros_sample_tensor(handle(), &t), "zcs_ros_sample_tensor");
        TensorDesc d;
        d.dtype = DType{t.dtype_code, t.dtype_bits, t.dtype_lanes};
        d.shape.assign(t.shape, t.shape + t.ndim);
        d.strides.assign(t.strides, t.strides + t.ndim);
        d.byte_offset = t.byte_offset;
        d.device_type = t.device_type;
        d.device_id = t.device_id;
        return d;
    }
};

// A subscription receiving messages of type `S` (ImageSample or TensorSample).
template <typename S>
class SubscriberOf : public detail::Owner<zcs_ros_subscriber_t, zcs_ros_subscriber_drop> {
   public:
    // The next message, or nullopt if none came within `timeout`; throws once the
    // session is closed (ZCS_ERR_CLOSED).
    std::optional<S> recv(std::chrono::milliseconds timeout) const {
        zcs_ros_sample_t s{};
        zcs_result_t r = zcs_ros_subscriber_recv(handle(), static_cast<uint64_t>(timeout.count()), &s);
        if (r == ZCS_ERR_TIMEOUT) return std::nullopt;
        detail::check(r, "zcs_ros_subscriber_recv");
        return S(s);
    }
    // The topic as resolved.
    std::string topic() const {
        const char *t = nullptr;
        detail::check(zcs_ros_subscriber_topic(handle(), &t), "zcs_ros_subscriber_topic");
        return t;
    }
};

class ImageSubscriber : public SubscriberOf<ImageSample> {
   public:
    ImageSubscriber(const Node &n, const std::string &topic, const QoS &qos = QoS()) {
        detail::check(zcs_ros_subscriber_declare_image(n.handle(), topic.c_str(), &qos.c, handle_ptr()),
                      "zcs_ros_subscriber_declare_image");
    }
};

class TensorSubscriber : public SubscriberOf<TensorSample> {
   public:
    TensorSubscriber(const Node &n, const std::string &topic, const QoS &qos = QoS()) {
        detail::check(zcs_ros_subscriber_declare_tensor(n.handle(), topic.c_str(), &qos.c, handle_ptr()),
                      "zcs_ros_subscriber_declare_tensor");
    }
};

}  // namespace ros

}  // namespace zcs

#endif
