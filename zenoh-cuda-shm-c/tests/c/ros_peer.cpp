// A ROS 2 peer of tests/ros_abi.rs, through the C++ layer (zcs::ros) over the C ABI,
// on a host-memory session:
//
//   zcs_cpp_ros_peer pub ZENOH_JSON5 DOMAIN COUNT
//     node /zcs_test/c_peer publishes COUNT Images on c_abi/image and COUNT
//     ExperimentalTensors on c_abi/tensor (odd sequence numbers from loans, even ones
//     from host bytes) once a subscription of ours is there for each, then waits for
//     its standard input to close;
//   zcs_cpp_ros_peer sub ZENOH_JSON5 DOMAIN COUNT PLAIN
//     node /c_peer_sub receives COUNT + PLAIN Images on /r2c/image (PLAIN of them from
//     an ordinary ROS publisher, by the "plain" path) and COUNT ExperimentalTensors on
//     /r2c/tensor, and checks every field and byte.
//
// Message k (its ROS sequence number) is the same on both sides: image_fields(k),
// tensor_desc(k), data the test pattern seeded with k. Exits 1 at anything unexpected.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zenoh_cuda_shm.hpp>

extern "C" {
#include "common.h"
}

using namespace std::chrono_literals;

namespace {

int bad = 0;

void fail(const std::string &what) {
    std::fprintf(stderr, "[ros peer] %s\n", what.c_str());
    bad++;
}

zcs::ros::ImageFields image_fields(int64_t k) {
    zcs::ros::ImageFields f;
    bool big = k % 4 == 0;
    f.stamp_sec = static_cast<int32_t>(1000 + k);
    f.stamp_nanosec = static_cast<uint32_t>(k * 1000 + 7);
    f.frame_id = "camera_" + std::to_string(k);
    f.width = big ? 640 : static_cast<uint32_t>(3 + k);
    f.height = big ? 480 : static_cast<uint32_t>(2 + k % 3);
    f.encoding = k % 2 ? "rgb8" : "bgr8";
    f.is_bigendian = static_cast<uint8_t>(k % 2);
    f.step = f.width * 3 + static_cast<uint32_t>(k % 2);
    return f;
}

// The description and data length of tensor k.
std::pair<zcs::TensorDesc, size_t> tensor_desc(int64_t k) {
    if (k % 4 == 0) return {zcs::TensorDesc(zcs::DType::f32(), {256, 256}), 256 * 256 * 4};
    if (k % 2 == 1) return {zcs::TensorDesc(zcs::DType::f32(), {k, 3}), static_cast<size_t>(12 * k)};
    return {zcs::TensorDesc(zcs::DType::u16(), {2, k}, {1, 2}, 8), static_cast<size_t>(8 + 4 * k)};
}

std::vector<uint8_t> pattern(size_t len, int64_t k) {
    std::vector<uint8_t> v(len);
    for (size_t i = 0; i < len; i++) v[i] = zcs_pattern_byte(i, static_cast<uint64_t>(k));
    return v;
}

bool same(const zcs::ros::ImageFields &a, const zcs::ros::ImageFields &b) {
    return a.stamp_sec == b.stamp_sec && a.stamp_nanosec == b.stamp_nanosec && a.frame_id == b.frame_id &&
           a.height == b.height && a.width == b.width && a.encoding == b.encoding &&
           a.is_bigendian == b.is_bigendian && a.step == b.step;
}

// Waits up to 20 s for a subscription of ours to `p`.
void wait_ours(const zcs::ros::PublisherBase &p) {
    auto until = std::chrono::steady_clock::now() + 20s;
    while (p.subscriptions().first == 0) {
        if (std::chrono::steady_clock::now() > until) throw std::runtime_error("no subscription of ours on " + p.topic());
        std::this_thread::sleep_for(10ms);
    }
}

int publish(zcs::Session &session, uint32_t domain, int64_t count) {
    zcs::ros::Node node(session, "c_peer", "/zcs_test", domain);
    if (node.domain() != domain) fail("the node's domain");
    zcs::ros::ImagePublisher images(node, "c_abi/image", zcs::ros::QoS(10).keep_all());
    zcs::ros::TensorPublisher tensors(node, "c_abi/tensor", zcs::ros::QoS(10).keep_all());
    if (images.topic() != "/zcs_test/c_abi/image" || tensors.topic() != "/zcs_test/c_abi/tensor")
        fail("topics resolved as " + images.topic() + " and " + tensors.topic());
    wait_ours(images);
    wait_ours(tensors);
    for (int64_t k = 1; k <= count; k++) {
        zcs::ros::ImageFields f = image_fields(k);
        std::vector<uint8_t> data = pattern(size_t{f.step} * f.height, k);
        int64_t seq;
        if (k % 2 == 1) {
            zcs::Loan loan = images.loan(data.size());
            std::memcpy(loan.host_data(), data.data(), data.size());
            seq = images.publish(f, loan);
            if (loan) fail("a published loan is still held");
        } else {
            seq = images.publish_host(f, data.data(), data.size());
        }
        if (seq != k) fail("image " + std::to_string(k) + " went out as " + std::to_string(seq));

        auto [t, len] = tensor_desc(k);
        data = pattern(len, k);
        if (k % 2 == 1) {
            zcs::Loan loan = tensors.loan(len);
            std::memcpy(loan.host_data(), data.data(), len);
            seq = tensors.publish(t, loan);
        } else {
            seq = tensors.publish_host(t, data.data(), len);
        }
        if (seq != k) fail("tensor " + std::to_string(k) + " went out as " + std::to_string(seq));
    }
    std::printf("[ros pub] %lld images, %lld tensors\n", static_cast<long long>(count), static_cast<long long>(count));
    std::fflush(stdout);
    // The test reads everything, then closes our standard input.
    while (std::getchar() != EOF) {
    }
    return bad ? 1 : 0;
}

// Checks the data of a received message against the pattern of `k`: in place, as a
// copy, and (for our channel's messages) as a zcs::Sample.
void check_data(const zcs::ros::SampleBase &m, int64_t k, size_t len, const std::string &what) {
    std::vector<uint8_t> want = pattern(len, k);
    if (m.data_size() != len) fail(what + ": " + std::to_string(m.data_size()) + " bytes of data");
    auto host = m.host_data();
    if (!host || std::vector<uint8_t>(host->first, host->first + host->second) != want)
        fail(what + ": wrong bytes in place");
    if (m.to_vector() != want) fail(what + ": wrong bytes copied");
    auto raw = m.gpu_sample();
    if (m.path() == "plain") {
        if (raw) fail(what + ": an ordinary publisher's message as a sample of our channel");
    } else if (!raw || raw->size() != len || raw->to_vector() != want) {
        fail(what + ": its sample of our channel does not hold the data");
    }
}

int subscribe(zcs::Session &session, uint32_t domain, int64_t count, int64_t plain) {
    zcs::ros::Node node(session, "c_peer_sub", "/", domain);
    zcs::ros::ImageSubscriber images(node, "/r2c/image", zcs::ros::QoS(10).keep_all());
    zcs::ros::TensorSubscriber tensors(node, "/r2c/tensor", zcs::ros::QoS(10).keep_all());
    std::printf("[ros sub] ready\n");
    std::fflush(stdout);
    std::set<std::pair<std::vector<uint8_t>, int64_t>> seen;
    int64_t n_plain = 0, n_images = 0, n_tensors = 0;
    for (; n_images < count + plain; n_images++) {
        auto m = images.recv(20000ms);
        if (!m) throw std::runtime_error("image " + std::to_string(n_images + 1) + " never came");
        int64_t k = m->seq();
        auto g = m->gid();
        if (!seen.insert({std::vector<uint8_t>(g.begin(), g.end()), k}).second) fail("image delivered twice");
        if (m->timestamp_ns() <= 0) fail("an image without a timestamp");
        std::string what = "image " + std::to_string(k) + " (" + m->path() + ")";
        zcs::ros::ImageFields f = m->fields(), want = image_fields(k);
        if (!same(f, want)) fail(what + ": fields differ (frame_id " + f.frame_id + ")");
        check_data(*m, k, size_t{want.step} * want.height, what);
        n_plain += m->path() == "plain";
    }
    for (; n_tensors < count; n_tensors++) {
        auto m = tensors.recv(20000ms);
        if (!m) throw std::runtime_error("tensor " + std::to_string(n_tensors + 1) + " never came");
        int64_t k = m->seq();
        std::string what = "tensor " + std::to_string(k) + " (" + m->path() + ")";
        auto [want, len] = tensor_desc(k);
        zcs::TensorDesc t = m->tensor();
        // Received strides are always given: compact row-major where none were sent.
        std::vector<int64_t> strides = want.strides;
        if (strides.empty()) strides = {want.shape[1], 1};
        if (!(t.dtype == want.dtype) || t.shape != want.shape || t.strides != strides ||
            t.byte_offset != want.byte_offset || t.device_type != 1 || t.device_id != 0)
            fail(what + ": description differs");
        check_data(*m, k, len, what);
    }
    std::printf("[ros sub] images %lld (plain %lld), tensors %lld, bad %d\n", static_cast<long long>(n_images),
                static_cast<long long>(n_plain), static_cast<long long>(n_tensors), bad);
    if (n_plain != plain) fail("plain images: " + std::to_string(n_plain));
    return bad ? 1 : 0;
}

}  // namespace

int main(int argc, char **argv) try {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s pub|sub ZENOH_JSON5 DOMAIN COUNT [PLAIN]\n", argv[0]);
        return 2;
    }
    std::string mode = argv[1];
    uint32_t domain = static_cast<uint32_t>(std::strtoul(argv[3], nullptr, 10));
    int64_t count = std::strtoll(argv[4], nullptr, 10);
    zcs::Session session(argv[2], R"({device: "host"})");
    if (mode == "pub") return publish(session, domain, count);
    if (mode == "sub" && argc > 5) return subscribe(session, domain, count, std::strtoll(argv[5], nullptr, 10));
    std::fprintf(stderr, "unknown mode %s\n", mode.c_str());
    return 2;
} catch (const std::exception &e) {
    std::fprintf(stderr, "[ros peer] error: %s\n", e.what());
    return 1;
}
