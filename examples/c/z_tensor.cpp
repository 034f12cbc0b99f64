// Tensors over zenoh-cuda-shm from C++: `pub` publishes COUNT float32 tensors of SHAPE
// on KEY with their description, `sub` receives them and checks the description and
// every element. The tensors are those of examples/python/pub.py and sub.py: message
// `seq` (from 1) holds seq - 1 in every element, so this program and the Python
// examples check each other.
//
//   z_tensor sub -k demo/tensor -l tcp/127.0.0.1:7447 -n 100 --shape 4,1080,1920
//   z_tensor pub -k demo/tensor -e tcp/127.0.0.1:7447 -n 100 --shape 4,1080,1920
//
// The publisher puts each tensor one of two ways (--how; by default odd messages the
// first way, even ones the second):
// - `copy`: on a GPU, it fills a device buffer of its own on its own stream
//   (cuMemsetD32Async) and puts it with Publisher::put_tensor_device: one device→device
//   copy into a block, enqueued on that stream after the fill; the host waits for
//   neither. Without a GPU, put_tensor_host copies a host buffer.
// - `loan`: it fills a loaned block in place (device memory: on the loan's stream; host
//   memory: by the CPU) and puts it with Publisher::put_tensor: no copy at all.
// The subscriber reads each tensor where it is: on a GPU, in place on a stream of its
// own (Sample::read: the stream waits for the publisher's work, the host does not), then
// copies it to the host on that stream to check it; in host memory, in place. It prints
// how each tensor came (its path) and ends with the counts of good, bad and lost ones;
// it exits 1 if any was bad or lost, or after 20 s without one.
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <zenoh_cuda_shm.hpp>

extern "C" {
#include "common.h"
}
#include "cuda_min.hpp"

namespace {

enum class How { Alternate, Copy, Loan };

struct Args {
    bool publish = false;
    zcs_flags zenoh{"demo/tensor", nullptr, nullptr, nullptr, 0, 100, nullptr, nullptr};
    std::vector<int64_t> shape{4, 1080, 1920};
    How how = How::Alternate;
    double rate = 0;  // messages per second; 0: as fast as the pool allows
    size_t wait_zero_copy = 0;
};

// The usage text on stdout (asked for: status 0), or, after `why` (and the value or
// flag refused), on stderr (status 2).
[[noreturn]] void usage(const char *prog, const char *why = nullptr, const char *arg = nullptr) {
    std::FILE *out = why ? stderr : stdout;
    if (why) std::fprintf(stderr, "error: %s%s%s%s\n", why, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    std::fprintf(out, "usage: %s pub|sub [flags]\n", prog);
    zcs_flags_help(out, "demo/tensor", 100, 0);
    std::fprintf(out,
                 "  --shape D,D,...         the tensor's shape (float32; default 4,1080,1920)\n"
                 "pub only:\n"
                 "  --how alternate|copy|loan  how tensors are put (default alternate)\n"
                 "  -r, --rate RATE         messages per second (default 0: as fast as the pool allows)\n"
                 "  --wait-zero-copy N      wait (up to 10 s) for N subscribers on the zero-copy path\n");
    std::exit(why ? 2 : 0);
}

std::vector<int64_t> parse_shape(const char *text, const char *prog) {
    std::vector<int64_t> shape;
    const char *p = text;
    while (*p) {
        char *end = nullptr;
        long long d = std::strtoll(p, &end, 10);
        if (end == p || d <= 0 || (*end != ',' && *end != '\0'))
            usage(prog, "--shape takes sizes above 0 separated by commas, not", text);
        shape.push_back(d);
        p = *end == ',' ? end + 1 : end;
    }
    if (shape.empty()) usage(prog, "--shape takes sizes above 0 separated by commas, not", text);
    return shape;
}

// A number flag's value, all of it a number.
double number(const char *flag, const char *v, const char *prog) {
    char *end = nullptr;
    double d = std::strtod(v, &end);
    if (end == v || *end != '\0' || !(d >= 0)) usage(prog, flag, v);
    return d;
}

uint64_t count(const char *flag, const char *v, const char *prog) {
    uint64_t n = 0;
    if (!zcs_parse_count(v, &n)) usage(prog, flag, v);
    return n;
}

Args parse(int argc, char **argv) {
    Args a;
    if (argc >= 2 && zcs_is(argv[1], "-h", "--help")) usage(argv[0]);
    if (argc < 2) usage(argv[0], "pub or sub must come first");
    if (!std::strcmp(argv[1], "pub")) a.publish = true;
    else if (std::strcmp(argv[1], "sub") != 0) usage(argv[0], "pub or sub must come first, not", argv[1]);
    for (int i = 2; i < argc; i += 2) {
        const char *f = argv[i];
        if (zcs_is(f, "-h", "--help")) usage(argv[0]);
        const char *v = i + 1 < argc ? argv[i + 1] : nullptr;
        if (f[0] != '-') usage(argv[0], "unexpected argument", f);
        if (v == nullptr) usage(argv[0], "a value is missing after", f);
        const char *why = nullptr;
        int taken = zcs_take_flag(&a.zenoh, f, v, &why);
        if (taken < 0) usage(argv[0], why, v);
        if (taken > 0) continue;
        if (!std::strcmp(f, "--shape")) a.shape = parse_shape(v, argv[0]);
        else if (a.publish && zcs_is(f, "-r", "--rate")) a.rate = number("-r/--rate takes a rate of 0 or more, not", v, argv[0]);
        else if (a.publish && !std::strcmp(f, "--wait-zero-copy"))
            a.wait_zero_copy = count("--wait-zero-copy takes a whole number, not", v, argv[0]);
        else if (a.publish && !std::strcmp(f, "--how")) {
            if (!std::strcmp(v, "alternate")) a.how = How::Alternate;
            else if (!std::strcmp(v, "copy")) a.how = How::Copy;
            else if (!std::strcmp(v, "loan")) a.how = How::Loan;
            else usage(argv[0], "--how takes alternate, copy or loan, not", v);
        } else usage(argv[0], "unknown flag", f);
    }
    if (const char *conflict = zcs_flags_conflict(&a.zenoh)) usage(argv[0], conflict);
    return a;
}

// The payload's size: 4 bytes per element; 0 when it would not fit a size_t.
size_t payload_bytes(const std::vector<int64_t> &shape) {
    size_t n = 4;
    for (int64_t d : shape) {
        if (static_cast<uint64_t>(d) > SIZE_MAX / n) return 0;
        n *= static_cast<size_t>(d);
    }
    return n;
}

// The bits of message `seq`'s value, seq - 1 as a float32 (what every element holds).
uint32_t value_bits(uint64_t seq) {
    float v = static_cast<float>(seq - 1);
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof bits);
    return bits;
}

std::string shape_text(const std::vector<int64_t> &shape) {
    std::string s = "(";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + (shape.size() == 1 ? ",)" : ")");
}

zcs::Session open_session(const Args &a) {
    char *zenoh = zcs_zenoh_config(&a.zenoh);
    char ours[128];
    zcs_our_config(&a.zenoh, ours);
    std::string zenoh_text(zenoh);
    std::free(zenoh);
    return zcs::Session(zenoh_text.c_str(), ours);
}

// What the copy path copies from, on a GPU: a device buffer and the stream that fills
// it. Destroyed only once that stream has passed every copy out of the buffer.
struct DeviceSource {
    zcs_cu::Stream stream;
    zcs_cu::DeviceMemory buffer;
    explicit DeviceSource(size_t bytes) : buffer(bytes) {}
    DeviceSource(const DeviceSource &) = delete;
    DeviceSource &operator=(const DeviceSource &) = delete;
    ~DeviceSource() {
        zcs_cu_result r = zcs_cu::driver().stream_synchronize(stream.get());
        if (r != 0) std::fprintf(stderr, "warning: cuStreamSynchronize failed (CUresult %d)\n", r);
    }
};

int publish(const Args &a) {
    const size_t bytes = payload_bytes(a.shape);
    if (bytes == 0) throw std::runtime_error("the shape's payload does not fit in memory");
    const size_t elements = bytes / 4;
    zcs::Session session = open_session(a);
    const std::string backend = session.backend();
    const bool cuda = backend == "cuda";
    // Declared after the session, so destroyed before it closes (its context with it).
    std::optional<DeviceSource> device;
    std::vector<uint8_t> host;
    if (cuda) {
        session.bind_gpu();
        device.emplace(bytes);
    } else {
        host.resize(bytes);
    }
    zcs::Publisher pub(session, a.zenoh.key);
    std::printf("[pub] ready on '%s' (%s)\n", a.zenoh.key, backend.c_str());
    if (std::fflush(stdout) != 0) throw std::runtime_error("write stdout");
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    for (;;) {
        auto [aware, plain] = pub.subscribers();
        bool enough = (aware > 0 || plain) && pub.zero_copy_subscribers() >= a.wait_zero_copy;
        if (enough) break;
        if (std::chrono::steady_clock::now() > deadline) {
            std::fprintf(stderr, "[pub] %zu subscriber(s), %zu in place, after 10 s: publishing anyway\n", aware,
                         pub.zero_copy_subscribers());
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const zcs::TensorDesc desc(zcs::DType::f32(), a.shape);
    const std::string shape = shape_text(a.shape);
    const auto period = a.rate > 0 ? std::chrono::duration<double>(1.0 / a.rate) : std::chrono::duration<double>(0);
    auto next = std::chrono::steady_clock::now();
    uint64_t copies = 0, loans = 0;
    zcs_catch_signals();
    uint64_t sent = 0;
    for (uint64_t n = 1; (a.zenoh.count == 0 || n <= a.zenoh.count) && !zcs_stop; n++) {
        const uint32_t bits = value_bits(n);
        const bool by_copy = a.how == How::Copy || (a.how == How::Alternate && n % 2 == 1);
        uint64_t seq = 0;
        if (by_copy && cuda) {
            // Fill our buffer on our stream; the copy into a block follows it there.
            zcs_cu::check(zcs_cu::driver().memset_d32_async(device->buffer.ptr(), bits, elements, device->stream.get()),
                          "cuMemsetD32Async");
            seq = pub.put_tensor_device(device->buffer.ptr(), bytes, desc, device->stream.get());
        } else if (by_copy) {
            for (size_t i = 0; i < elements; i++) std::memcpy(&host[4 * i], &bits, 4);
            seq = pub.put_tensor_host(host.data(), bytes, desc);
        } else {
            zcs::Loan loan = pub.loan(bytes);
            if (uint8_t *h = loan.host_data()) {
                for (size_t i = 0; i < elements; i++) std::memcpy(h + 4 * i, &bits, 4);
            } else {
                // The loan's stream: its put orders every reader after this fill.
                auto [ptr, stream] = loan.device_ptr();
                zcs_cu::check(zcs_cu::driver().memset_d32_async(ptr, bits, elements, stream), "cuMemsetD32Async");
            }
            seq = pub.put_tensor(loan, desc);
        }
        if (seq != n) throw std::runtime_error("message " + std::to_string(n) + " went out as " + std::to_string(seq));
        (by_copy ? copies : loans)++;
        sent = n;
        std::printf("[pub] put #%" PRIu64 " (%s) %s float32: value %g\n", seq, by_copy ? "copy" : "loan",
                    shape.c_str(), static_cast<double>(n - 1));
        if (period.count() > 0) {
            next += std::chrono::duration_cast<std::chrono::steady_clock::duration>(period);
            std::this_thread::sleep_until(next);
        }
    }
    if (device) device->stream.synchronize();
    // Let the subscribers finish with the last tensors before the publisher goes.
    deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (pub.blocks_in_use() > 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    std::printf("[pub] %s%" PRIu64 " tensors %s float32 published (%s): %" PRIu64 " by copy (%s), %" PRIu64
                " from loans (put_tensor)\n",
                zcs_stop ? "interrupted: " : "", sent, shape.c_str(), backend.c_str(), copies,
                cuda ? "put_tensor_device" : "put_tensor_host", loans);
    return 0;
}

// What is wrong with a received description, or "" if it is what the publisher sends.
std::string description_fault(const zcs::TensorDesc &t, const std::vector<int64_t> &shape, size_t size) {
    if (!(t.dtype == zcs::DType::f32())) {
        return "dtype (" + std::to_string(t.dtype.code) + ", " + std::to_string(t.dtype.bits) + ", " +
               std::to_string(t.dtype.lanes) + ") is not float32";
    }
    if (t.shape != shape) return "shape " + shape_text(t.shape) + ", expected " + shape_text(shape);
    std::vector<int64_t> compact(shape.size());
    int64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        compact[i] = stride;
        stride *= shape[i];
    }
    if (t.strides != compact) return "strides " + shape_text(t.strides) + " are not compact row-major";
    if (t.byte_offset != 0) return "byte offset " + std::to_string(t.byte_offset);
    if (t.device_type != 1 && t.device_type != 2) return "device type " + std::to_string(t.device_type);
    if (size != payload_bytes(shape)) return std::to_string(size) + " bytes for this shape";
    return "";
}

int subscribe(const Args &a) {
    const size_t bytes = payload_bytes(a.shape);
    if (bytes == 0) throw std::runtime_error("the shape's payload does not fit in memory");
    zcs::Session session = open_session(a);
    const bool cuda = session.backend() == "cuda";
    std::optional<zcs_cu::Stream> stream;
    if (cuda) {
        session.bind_gpu();
        stream.emplace();
    }
    zcs::Subscriber sub(session, a.zenoh.key);
    std::printf("[sub] ready on '%s' (%s)\n", a.zenoh.key, session.backend().c_str());
    if (std::fflush(stdout) != 0) throw std::runtime_error("write stdout");
    std::vector<uint8_t> copy;
    uint64_t got = 0, ok = 0, bad = 0, lost = 0, last = 0;
    std::set<std::string> paths;
    zcs_catch_signals();
    zcs_waiting waiting{};
    const char *how = "done";
    while ((a.zenoh.count == 0 || got < a.zenoh.count) && !zcs_stop) {
        std::optional<zcs::Sample> s = sub.recv(std::chrono::milliseconds(200));
        if (!s) {
            zcs_waiting_tick(&waiting, 200, got, a.zenoh.key);
            if (waiting.waited_ms >= 20000) {
                std::fprintf(stderr, "[sub] nothing for 20 s after %" PRIu64 " tensors\n", got);
                how = "stopped";
                break;
            }
            continue;
        }
        waiting = zcs_waiting{};
        got++;
        const uint64_t seq = s->seq();
        const std::string path = s->path();
        paths.insert(path);
        std::string fault;
        if (last != 0 && seq <= last) fault = "came after #" + std::to_string(last);
        if (last != 0 && seq > last + 1) lost += seq - last - 1;
        last = seq > last ? seq : last;
        std::optional<zcs::TensorDesc> t = s->tensor();
        if (!t) {
            fault = "no tensor description (published as plain bytes)";
        } else if (fault.empty()) {
            fault = description_fault(*t, a.shape, s->size());
        }
        if (fault.empty()) {
            const uint8_t *data;
            size_t len;
            if (auto h = s->host_data()) {
                std::tie(data, len) = *h;
            } else {
                // In place on our stream, which waits for the publisher's work; copied to
                // the host there to be checked.
                copy.resize(s->size());
                zcs::Read read = s->read(stream->get());
                zcs_cu::check(
                    zcs_cu::driver().memcpy_dtoh_async(copy.data(), read.device_ptr(), copy.size(), stream->get()),
                    "cuMemcpyDtoHAsync");
                read.end();
                stream->synchronize();
                data = copy.data();
                len = copy.size();
            }
            const uint32_t want = value_bits(seq);
            for (size_t i = 0; i + 4 <= len; i += 4) {
                uint32_t w;
                std::memcpy(&w, data + i, 4);
                if (w != want) {
                    float v;
                    std::memcpy(&v, &w, 4);
                    fault = "element " + std::to_string(i / 4) + " is " + std::to_string(v) + ", expected " +
                            std::to_string(seq - 1);
                    break;
                }
            }
        }
        const char *where = !t ? "?" : t->device_type == 2 ? "cuda" : "cpu";
        std::printf("#%" PRIu64 " %-9s %s float32 from %s: value %g %s%s\n", seq, path.c_str(),
                    t ? shape_text(t->shape).c_str() : "()", where, static_cast<double>(seq - 1),
                    fault.empty() ? "ok" : "BAD: ", fault.c_str());
        (fault.empty() ? ok : bad)++;
    }
    std::string all;
    for (const auto &p : paths) all += (all.empty() ? "" : ",") + p;
    std::printf("[sub] %" PRIu64 " tensors: %" PRIu64 " ok, %" PRIu64 " bad, %" PRIu64 " lost; paths %s\n", got, ok,
                bad, lost, all.c_str());
    if (zcs_stop) how = "interrupted";
    zcs_subscriber_stats_t st = sub.stats();
    zcs_print_received(how, got, &st);
    return bad == 0 && lost == 0 && std::string(how) != "stopped" ? 0 : 1;
}

}  // namespace

int main(int argc, char **argv) try {
    Args a = parse(argc, argv);
    return a.publish ? publish(a) : subscribe(a);
} catch (const std::exception &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
