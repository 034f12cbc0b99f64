// Receives COUNT frames on KEY through zenoh-cuda-shm and checks every byte against
// the pattern of the frame's sequence number; prints how the frames came (zero-copy,
// cpu-bytes, inline, …). Says when it waits for a publisher, naming ours on other keys;
// ends on Ctrl-C or SIGTERM with its summary. Exits 1 on a wrong byte, a frame out of
// order or a silence of 20 s. C++: the owners of zenoh_cuda_shm.hpp, errors as
// exceptions. On a GPU, each frame is read on a stream of this program's own, in place,
// and copied to the host there to be checked.
//
//   z_cuda_sub -k demo/zcs/frame -e tcp/127.0.0.1:7447 -n 100
#include <chrono>
#include <cstdio>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <zenoh_cuda_shm.hpp>

extern "C" {
#include "common.h"
#include "cuda_min.h"
}

// Names our publishers on keys that `key` does not match (a mistyped key, say).
static void print_other_keys(const zcs::Session &session, const char *key) {
    std::vector<std::string> keys = session.publisher_keys(std::chrono::milliseconds(500), key);
    if (keys.empty()) return;
    std::string list;
    for (const std::string &k : keys) list += (list.empty() ? "'" : ", '") + k + "'";
    std::printf("[sub] publishers seen on other keys: %s (plain Zenoh publishers are not listed)\n", list.c_str());
    std::fflush(stdout);
}

int main(int argc, char **argv) try {
    zcs_flags f = zcs_parse(argc, argv, 0, 10);
    char *zenoh = zcs_zenoh_config(&f);
    char ours[128];
    zcs_our_config(&f, ours);
    std::string zenoh_text(zenoh);
    std::free(zenoh);
    zcs::Session session(zenoh_text.c_str(), ours);
    // On a GPU: this program's own stream, and a host buffer to copy frames into.
    zcs_cuda cu{};
    zcs_cu_stream stream = nullptr;
    if (session.backend() == "cuda") {
        if (zcs_cuda_load(&cu) != 0) return 1;
        session.bind_gpu();
        if (cu.stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */) != 0) {
            std::fprintf(stderr, "error: cuStreamCreate failed\n");
            return 1;
        }
    }
    zcs::Subscriber sub(session, f.key);
    zcs_catch_signals();
    std::printf("[sub] ready\n");
    std::fflush(stdout);
    uint64_t got = 0, bad = 0, last = 0;
    std::set<std::string> paths;
    zcs_waiting waiting{};
    const char *how = "done";
    while ((f.count == 0 || got < f.count) && !zcs_stop) {
        auto s = sub.recv(std::chrono::milliseconds(200));
        if (!s) {
            bool said = waiting.said;
            zcs_waiting_tick(&waiting, 200, got, f.key);
            // Only before a first message: after one, the key was right.
            if (!said && waiting.said && got == 0) print_other_keys(session, f.key);
            if (waiting.waited_ms >= 20000) {
                std::fprintf(stderr, "[sub] nothing for 20 s after %llu frames\n", (unsigned long long)got);
                how = "stopped";
                break;
            }
            continue;
        }
        waiting = zcs_waiting{};
        uint64_t seq = s->seq();
        std::vector<uint8_t> copy;
        const uint8_t *data;
        size_t len;
        if (auto host = s->host_data()) {
            std::tie(data, len) = *host;
        } else {
            // In place on our stream: the stream waits for the publisher's work.
            copy.resize(s->size());
            zcs::Read read = s->read(stream);
            if (cu.memcpy_dtoh_async(copy.data(), read.device_ptr(), copy.size(), stream) != 0) {
                std::fprintf(stderr, "error: cuMemcpyDtoHAsync failed\n");
                return 1;
            }
            read.end();
            if (cu.stream_synchronize(stream) != 0) {
                std::fprintf(stderr, "error: cuStreamSynchronize failed\n");
                return 1;
            }
            data = copy.data();
            len = copy.size();
        }
        for (size_t i = 0; i < len; i++) {
            if (data[i] != zcs_pattern_byte(i, seq)) {
                std::fprintf(stderr, "[sub] frame %llu: byte %zu is wrong\n", (unsigned long long)seq, i);
                bad++;
                break;
            }
        }
        if (last != 0 && seq != last + 1) {
            std::fprintf(stderr, "[sub] frame %llu after %llu\n", (unsigned long long)seq, (unsigned long long)last);
            bad++;
        }
        paths.insert(s->path());
        last = seq;
        got++;
    }
    std::string all;
    for (const auto &p : paths) all += (all.empty() ? "" : ",") + p;
    std::printf("[sub] %llu frames, %llu bad, paths %s\n", (unsigned long long)got, (unsigned long long)bad, all.c_str());
    if (zcs_stop) how = "interrupted";
    zcs_subscriber_stats_t st = sub.stats();
    zcs_print_received(how, got, &st);
    return bad == 0 && std::string(how) != "stopped" ? 0 : 1;
} catch (const zcs::Error &e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
}
