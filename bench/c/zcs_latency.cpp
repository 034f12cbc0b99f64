// zcs_latency_cpp: the `zero-copy` row of bench/src/bin/zcs_latency.rs, measured from
// C++ through the C ABI (zenoh_cuda_shm.hpp), so that the two can be compared in one run.
//
// The same method: the ping (this process) publishes a block of each size on a key; the
// pong (this program re-run as a child) receives it, makes it ready on its own CUDA
// stream (Sample::read, then a synchronize of that stream, then the read's end) and
// replies with 17 bytes (row, sequence number, the one-way latency it measured from the
// sample's publication time to that point) through its own publisher, which reaches the
// ping the same way. Without a GPU (--backend host) the pong reads the host block in
// place instead. Before each round the ping waits for the previous block to come back,
// then loans, and times put → reply. The same sizes, warm-up, rounds, time budget and
// percentiles as zcs_latency (bench/src/lib.rs: latency::rounds, latency::row), the
// same Zenoh configuration (peer, TCP on 127.0.0.1, congestion control `block` on the
// benchmark's keys) and ours (`provider: off`, `spin_us` 0); the ping writes nothing
// into the blocks. One JSON object per line: a `latency-setup` line, then one `latency`
// row per size, named `zero-copy-cpp`, with zcs_latency's fields.
//
//   zcs_latency_cpp --backend cuda                          # GPU: 4 KiB … 1 GiB
//   zcs_latency_cpp --backend host --sizes 4KiB,1MiB --iters 50   # no GPU
//
// Flags: --backend cuda|host, --sizes (bytes, or with a KiB/MiB/GiB suffix; comma
// separated), --iters, --warmup, --max-secs: zcs_latency's, with its defaults.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <zenoh_cuda_shm.hpp>

#include "cuda_min.hpp"

extern char **environ;

namespace {

using Clock = std::chrono::steady_clock;

const char *const PREFIX = "zcs-lat-cpp";
const char *const KEY = "zcs-lat-cpp/zero-copy";
const char *const REPLY_KEY = "zcs-lat-cpp/reply/zero-copy";
const uint8_t PATH_ZC = 0;
const auto IO = std::chrono::seconds(60);
const auto REPLY_TIMEOUT = std::chrono::seconds(20);

[[noreturn]] void usage(const char *prog) {
    std::fprintf(stderr,
                 "usage: %s [--backend cuda|host] [--sizes 4KiB,64KiB,...] [--iters N] [--warmup N] [--max-secs S]\n",
                 prog);
    std::exit(2);
}

// zcs_tests::parse_size: digits, then nothing, B, K/KiB, M/MiB or G/GiB (any case).
size_t parse_size(const std::string &s) {
    size_t i = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') i++;
    if (i == 0) throw std::invalid_argument("bad size \"" + s + "\"");
    unsigned long long n = std::stoull(s.substr(0, i));
    std::string unit = s.substr(i);
    for (char &c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    unsigned long long mult;
    if (unit.empty() || unit == "b") mult = 1;
    else if (unit == "k" || unit == "kib") mult = 1ull << 10;
    else if (unit == "m" || unit == "mib") mult = 1ull << 20;
    else if (unit == "g" || unit == "gib") mult = 1ull << 30;
    else throw std::invalid_argument("bad size unit in \"" + s + "\" (use KiB, MiB or GiB)");
    if (n == 0 || n > SIZE_MAX / mult) throw std::invalid_argument("bad size \"" + s + "\"");
    return static_cast<size_t>(n * mult);
}

struct Args {
    std::string backend = "cuda";
    std::vector<size_t> sizes;
    size_t iters = 1000;
    size_t warmup = 50;
    double max_secs = 8.0;
    // The pong's: the ping's port.
    bool pong = false;
    int port = 0;
};

Args parse(int argc, char **argv) {
    Args a;
    std::string sizes = "4KiB,64KiB,1MiB,8MiB,32MiB,256MiB,1GiB";
    for (int i = 1; i < argc; i += 2) {
        std::string f = argv[i];
        if (i + 1 >= argc) usage(argv[0]);
        std::string v = argv[i + 1];
        try {
            if (f == "--backend") a.backend = v;
            else if (f == "--sizes") sizes = v;
            else if (f == "--iters") a.iters = std::stoul(v);
            else if (f == "--warmup") a.warmup = std::stoul(v);
            else if (f == "--max-secs") a.max_secs = std::stod(v);
            else if (f == "--pong-of-port") {
                a.pong = true;
                a.port = std::stoi(v);
            } else usage(argv[0]);
        } catch (const std::logic_error &) {
            usage(argv[0]);
        }
    }
    if (a.backend != "cuda" && a.backend != "host") usage(argv[0]);
    for (size_t start = 0; start <= sizes.size();) {
        size_t comma = std::min(sizes.find(',', start), sizes.size());
        a.sizes.push_back(parse_size(sizes.substr(start, comma - start)));
        start = comma + 1;
    }
    return a;
}

// Nanoseconds since the Unix epoch: the clock of the publication timestamps.
uint64_t now_ns() {
    timespec t{};
    if (clock_gettime(CLOCK_REALTIME, &t) != 0) throw std::runtime_error("clock_gettime failed");
    return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// zcs_tests::loopback_zenoh_config: peer, no multicast scouting, TCP on 127.0.0.1
// (an ephemeral port unless `listen`), congestion control `block` on our keys.
std::string zenoh_config(int listen, int connect) {
    std::string c = "{mode: \"peer\", scouting: {multicast: {enabled: false}}";
    c += ", listen: {endpoints: [\"tcp/127.0.0.1:" + std::to_string(listen) + "\"]}";
    if (connect) c += ", connect: {endpoints: [\"tcp/127.0.0.1:" + std::to_string(connect) + "\"]}";
    c += std::string(", qos: {publication: [{key_exprs: [\"") + PREFIX + "/**\", \"" + PREFIX +
         "/**/@zcs/**\"], config: {congestion_control: \"block\"}}]}}";
    return c;
}

std::string zcs_config(const std::string &backend) {
    return "{device: \"" + backend + "\", provider: \"off\"}";
}

// Closes a descriptor of ours, saying so if that fails (in destructors: no throw).
void close_fd(int fd) {
    if (close(fd) != 0) std::perror("close");
}

// A TCP port on 127.0.0.1 that was free a moment ago.
int free_tcp_port() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throw std::runtime_error("socket failed");
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int ok = bind(fd, reinterpret_cast<sockaddr *>(&addr), sizeof addr) == 0 &&
             getsockname(fd, reinterpret_cast<sockaddr *>(&addr), &len) == 0;
    close_fd(fd);
    if (!ok) throw std::runtime_error("no free TCP port on 127.0.0.1");
    return ntohs(addr.sin_port);
}

// A reply: the row, the sequence number and the pong's one-way latency (ns), little-endian.
void put_le(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_le(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

// Waits until `p` serves exactly `zero_copy` subscribers in place, knows `aware`
// GPU-aware ones and nobody listens on the plain key, unchanged for 200 ms (zcs_latency's
// wait_route).
void wait_route(const zcs::Publisher &p, size_t zero_copy, size_t aware) {
    auto t = Clock::now();
    auto quiet = Clock::now();
    for (;;) {
        auto [a, plain] = p.subscribers();
        size_t zc = p.zero_copy_subscribers();
        if (zc != zero_copy || a != aware || plain) {
            quiet = Clock::now();
        } else if (Clock::now() - quiet >= std::chrono::milliseconds(200)) {
            return;
        }
        if (Clock::now() - t > std::chrono::seconds(30)) {
            throw std::runtime_error("route not ready (zero-copy " + std::to_string(zc) + " aware " +
                                     std::to_string(a) + " plain " + std::to_string(plain) + ")");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
}

// ---------------------------------------------------------------------------------
// Pong
// ---------------------------------------------------------------------------------

// Replies to every block until the ping writes to (or closes) stdin; its stdout carries
// one line, "ready", once both routes are in place.
int pong(const Args &a) {
    zcs::Session session(zenoh_config(0, a.port).c_str(), zcs_config(a.backend).c_str());
    const bool cuda = a.backend == "cuda";
    std::optional<zcs_cu::Stream> stream;
    if (cuda) {
        session.bind_gpu();
        stream.emplace();
    }
    zcs::Publisher reply(session, REPLY_KEY);
    zcs::Subscriber sub(session, KEY);
    wait_route(reply, 1, 1);
    if (std::fputs("ready\n", stdout) == EOF || std::fflush(stdout) != 0) throw std::runtime_error("write ready");
    uint64_t other_paths = 0;
    std::string other;
    for (;;) {
        std::optional<zcs::Sample> s = sub.recv(std::chrono::milliseconds(100));
        if (!s) {
            pollfd p{0, POLLIN, 0};
            int n = poll(&p, 1, 0);
            if (n < 0) throw std::runtime_error("poll stdin");
            if (n > 0) break;  // "stop", or the ping is gone
            continue;
        }
        if (cuda) {
            zcs::Read read = s->read(stream->get());
            stream->synchronize();
            read.end();
        } else {
            auto h = s->host_data();
            if (!h || h->second == 0) throw std::runtime_error("a host session's sample without host bytes");
            volatile uint8_t first = h->first[0], last = h->first[h->second - 1];
            (void)first;
            (void)last;
        }
        uint64_t ts = s->timestamp_ns(), now = now_ns();
        uint8_t msg[17];
        msg[0] = PATH_ZC;
        put_le(msg + 1, s->seq());
        put_le(msg + 9, now > ts ? now - ts : 0);
        reply.put_bytes(msg, sizeof msg);
        // The row must measure the path it is named after (checked after the reply, off
        // the timed path).
        std::string path = s->path();
        if (path != "zero-copy") other_paths++, other = path;
    }
    if (other_paths > 0) {
        std::fprintf(stderr, "pong: %" PRIu64 " blocks came by another path than zero-copy (%s)\n", other_paths,
                     other.c_str());
        return 1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------
// Ping
// ---------------------------------------------------------------------------------

// The pong: this program with --pong-of-port, its stdin and stdout on pipes. Killed and
// reaped when destroyed while still running (the ping failed).
class Pong {
   public:
    Pong(const Args &a, int port) {
        int in[2], out[2];
        if (pipe2(in, O_CLOEXEC) != 0) throw std::runtime_error("pipe2");
        if (pipe2(out, O_CLOEXEC) != 0) {
            close_fd(in[0]);
            close_fd(in[1]);
            throw std::runtime_error("pipe2");
        }
        posix_spawn_file_actions_t fa;
        int rc = posix_spawn_file_actions_init(&fa);
        if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, in[0], 0);
        if (rc == 0) rc = posix_spawn_file_actions_adddup2(&fa, out[1], 1);
        std::string port_s = std::to_string(port);
        std::vector<std::string> args = {"zcs_latency_cpp", "--pong-of-port", port_s, "--backend", a.backend};
        std::vector<char *> argv;
        for (auto &s : args) argv.push_back(s.data());
        argv.push_back(nullptr);
        if (rc == 0) rc = posix_spawn(&pid_, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
        if (posix_spawn_file_actions_destroy(&fa) != 0) std::perror("posix_spawn_file_actions_destroy");
        close_fd(in[0]);
        close_fd(out[1]);
        if (rc != 0) {
            close_fd(in[1]);
            close_fd(out[0]);
            throw std::runtime_error(std::string("start the pong: ") + std::strerror(rc));
        }
        to_ = in[1];
        from_ = out[0];
    }
    Pong(const Pong &) = delete;
    Pong &operator=(const Pong &) = delete;
    ~Pong() {
        if (pid_ > 0) {
            if (kill(pid_, SIGKILL) != 0) std::perror("kill the pong");
            int status;
            if (waitpid(pid_, &status, 0) != pid_) std::perror("reap the pong");
        }
        if (to_ >= 0) close_fd(to_);
        if (from_ >= 0) close_fd(from_);
    }

    // Waits for its "ready" line.
    void wait_ready() {
        std::string line;
        auto deadline = Clock::now() + IO;
        while (line.find('\n') == std::string::npos) {
            int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count());
            pollfd p{from_, POLLIN, 0};
            int n = left > 0 ? poll(&p, 1, left) : 0;
            if (n <= 0) throw std::runtime_error("the pong did not get ready within 60 s");
            char buf[64];
            ssize_t got = read(from_, buf, sizeof buf);
            if (got <= 0) throw std::runtime_error("the pong exited before it was ready");
            line.append(buf, static_cast<size_t>(got));
        }
        if (line != "ready\n") throw std::runtime_error("the pong said \"" + line + "\"");
    }

    // Tells it to stop and waits for its exit (status 0 expected).
    void stop() {
        if (write(to_, "stop\n", 5) != 5) throw std::runtime_error("write to the pong");
        close_fd(to_);
        to_ = -1;
        auto deadline = Clock::now() + IO;
        for (;;) {
            int status = 0;
            pid_t r = waitpid(pid_, &status, WNOHANG);
            if (r == pid_) {
                pid_ = -1;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) throw std::runtime_error("the pong failed");
                return;
            }
            if (r < 0) throw std::runtime_error("waitpid");
            if (Clock::now() > deadline) throw std::runtime_error("the pong did not stop within 60 s");
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
    }

   private:
    pid_t pid_ = -1;
    int to_ = -1;
    int from_ = -1;
};

// Round trips and pong-measured one-way latencies of a row, sorted, in µs.
struct Samples {
    std::vector<double> rtt;
    std::vector<double> one_way;
};

// zcs_bench::latency::rounds: `warmup` untimed rounds (stopping after a quarter of the
// budget), then `iters` timed ones (stopping after the budget, with at least 5).
template <typename F>
Samples rounds(const Args &a, F one) {
    const auto budget = std::chrono::duration<double>(a.max_secs);
    auto t = Clock::now();
    for (size_t i = 0; i < a.warmup; i++) {
        one();
        if (Clock::now() - t > budget / 4) break;
    }
    t = Clock::now();
    Samples s;
    s.rtt.reserve(a.iters);
    s.one_way.reserve(a.iters);
    for (size_t i = 0; i < a.iters; i++) {
        auto [rtt, one_way] = one();
        s.rtt.push_back(std::chrono::duration<double, std::micro>(rtt).count());
        s.one_way.push_back(one_way);
        if (i + 1 >= 5 && Clock::now() - t > budget) break;
    }
    std::sort(s.rtt.begin(), s.rtt.end());
    std::sort(s.one_way.begin(), s.one_way.end());
    return s;
}

// zcs_tests::percentile: the value at rank ceil(p/100 · n) of a sorted list.
double percentile(const std::vector<double> &sorted, double p) {
    if (sorted.empty()) return NAN;
    size_t rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(sorted.size())));
    rank = std::clamp<size_t>(rank, 1, sorted.size());
    return sorted[rank - 1];
}

// A JSON number, the shortest text that reads back as `v` (null for NaN, as serde_json
// writes it).
std::string num(double v) {
    if (!std::isfinite(v)) return "null";
    char b[64];
    auto [end, ec] = std::to_chars(b, b + sizeof b, v);
    if (ec != std::errc()) throw std::runtime_error("format a number");
    return std::string(b, end);
}

std::string str(const std::string &s) {
    std::string o = "\"";
    for (char c : s) {
        if (c == '"' || c == '\\') o += '\\', o += c;
        else if (static_cast<unsigned char>(c) < 0x20) {
            char b[8];
            std::snprintf(b, sizeof b, "\\u%04x", c);
            o += b;
        } else o += c;
    }
    return o + "\"";
}

// zcs_bench::latency::row's fields, then `extra` (a JSON object's members).
void row(const std::string &path, const std::string &backend, size_t size, const Samples &s,
         const std::string &extra) {
    const auto &rtt = s.rtt;
    const auto &ow = s.one_way;
    double rtt_max = rtt.empty() ? NAN : rtt.back(), ow_max = ow.empty() ? NAN : ow.back();
    std::printf("{\"bench\":\"latency\",\"path\":%s,\"backend\":%s,\"size\":%zu,\"n\":%zu,\"one_way_p50_us\":%s,"
                "\"one_way_p99_us\":%s,\"one_way_max_us\":%s,\"rtt_p50_us\":%s,\"measured_one_way_p50_us\":%s,"
                "\"measured_one_way_p99_us\":%s,\"measured_one_way_max_us\":%s,%s}\n",
                str(path).c_str(), str(backend).c_str(), size, rtt.size(), num(percentile(rtt, 50) / 2).c_str(),
                num(percentile(rtt, 99) / 2).c_str(), num(rtt_max / 2).c_str(), num(percentile(rtt, 50)).c_str(),
                num(percentile(ow, 50)).c_str(), num(percentile(ow, 99)).c_str(), num(ow_max).c_str(), extra.c_str());
    if (std::fflush(stdout) != 0) throw std::runtime_error("write stdout");
}

// Waits for the reply to `seq`; the one-way latency the pong measured (µs).
double wait_reply(const zcs::Subscriber &replies, uint8_t path, uint64_t seq) {
    const auto t = Clock::now();
    for (;;) {
        auto left = REPLY_TIMEOUT - (Clock::now() - t);
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left);
        std::optional<zcs::Sample> s = replies.recv(ms.count() > 0 ? ms : std::chrono::milliseconds(0));
        if (!s) throw std::runtime_error("no reply to seq " + std::to_string(seq) + " within 20 s");
        auto h = s->host_data();
        if (h && h->second >= 17 && h->first[0] == path && get_le(h->first + 1) == seq) {
            return static_cast<double>(get_le(h->first + 9)) / 1e3;
        }
        // A late reply from an earlier round: ignore it.
    }
}

// One block round trip: waits for the previous block to come back (so warm blocks are
// reused), loans, then times put → reply.
std::pair<Clock::duration, double> block_round(const zcs::Publisher &p, const zcs::Subscriber &replies,
                                               size_t size) {
    auto t = Clock::now();
    while (p.blocks_in_use() > 0) {
        if (Clock::now() - t > REPLY_TIMEOUT) throw std::runtime_error("the previous block never came back");
        std::this_thread::sleep_for(std::chrono::microseconds(10));
    }
    zcs::Loan loan = p.loan(size);
    const auto t0 = Clock::now();
    uint64_t seq = p.put(std::move(loan));
    double one_way = wait_reply(replies, PATH_ZC, seq);
    return {Clock::now() - t0, one_way};
}

int ping(const Args &a) {
    const bool cuda = a.backend == "cuda";
    const int port = free_tcp_port();
    zcs::Session session(zenoh_config(port, 0).c_str(), zcs_config(a.backend).c_str());
    // The row's backend as zcs_latency names it.
    const std::string backend = session.backend() == "cuda" ? "cuda-vmm" : "host-memfd";
    std::string gpu;
    if (cuda) {
        session.bind_gpu();
        gpu = zcs_cu::device_name();
    }
    zcs::Subscriber replies(session, REPLY_KEY);
    zcs::Publisher pub(session, KEY);
    Pong pong(a, port);
    pong.wait_ready();
    wait_route(pub, 1, 1);
    const std::string blocks = "the publishers' own pools";
    std::printf("{\"bench\":\"latency-setup\",\"program\":\"zcs_latency_cpp\",\"backend\":%s,\"iters\":%zu,"
                "\"warmup\":%zu,\"max_secs_per_row\":%s,\"transport\":%s,\"blocks\":%s,\"spin_us\":0,\"pong_gpu\":0%s}\n",
                str(backend).c_str(), a.iters, a.warmup, num(a.max_secs).c_str(),
                str("zenoh peer, tcp 127.0.0.1, congestion control block").c_str(), str(blocks).c_str(),
                cuda ? (",\"gpu\":" + str(gpu)).c_str() : "");
    const std::string extra = "\"ready\":" +
                              str(cuda ? "read on the pong's stream, then stream synchronized" : "host bytes mapped") +
                              ",\"blocks\":" + str(blocks) + ",\"program\":\"zcs_latency_cpp\"";
    for (size_t size : a.sizes) {
        Samples s = rounds(a, [&] { return block_round(pub, replies, size); });
        row("zero-copy-cpp", backend, size, s, extra);
    }
    pong.stop();
    return 0;
}

}  // namespace

int main(int argc, char **argv) try {
    Args a = parse(argc, argv);
    return a.pong ? pong(a) : ping(a);
} catch (const std::exception &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
