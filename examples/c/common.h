/* Shared by the C examples: the test pattern (the same bytes as the Rust examples'
 * cuda::kernels::pattern_byte, so C and Rust processes check each other's frames), the
 * configuration strings built from command-line flags, and error reporting. */
#ifndef ZCS_EXAMPLES_COMMON_H
#define ZCS_EXAMPLES_COMMON_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <zenoh_cuda_shm.h>

/* Byte `i` of the pattern of message `seed` (its sequence number). */
static inline uint8_t zcs_pattern_byte(uint64_t i, uint64_t seed) {
    uint32_t x = (uint32_t)i ^ ((uint32_t)(i >> 32) * 0x27d4eb2fu);
    uint32_t h = x * 0x9e3779b1u + (uint32_t)seed * 0x85ebca77u;
    return (uint8_t)((h >> 24) ^ x);
}

/* Exits with the library's message when `r` is an error. */
static inline void zcs_check(zcs_result_t r, const char *what) {
    if (r != ZCS_OK) {
        fprintf(stderr, "error: %s: %s (%s)\n", what, zcs_last_error(), zcs_result_name(r));
        exit(1);
    }
}

/* Flags common to both examples, in the style of Zenoh's z_pub / z_sub. */
struct zcs_flags {
    const char *key;
    const char *connect;
    const char *listen;
    const char *device;
    size_t size;
    uint64_t count;
};

static inline void zcs_usage(const char *prog) {
    fprintf(stderr,
            "usage: %s [-k KEY] [-e CONNECT] [-l LISTEN] [-n COUNT] [-s SIZE] [--device auto|host|cuda]\n",
            prog);
    exit(2);
}

static inline struct zcs_flags zcs_parse(int argc, char **argv, size_t size, uint64_t count) {
    struct zcs_flags f = {"demo/zcs/frame", NULL, NULL, NULL, size, count};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (v == NULL) zcs_usage(argv[0]);
        if (!strcmp(a, "-k")) f.key = v;
        else if (!strcmp(a, "-e")) f.connect = v;
        else if (!strcmp(a, "-l")) f.listen = v;
        else if (!strcmp(a, "--device")) f.device = v;
        else if (!strcmp(a, "-s")) f.size = strtoull(v, NULL, 10);
        else if (!strcmp(a, "-n")) f.count = strtoull(v, NULL, 10);
        else zcs_usage(argv[0]);
        i++;
    }
    return f;
}

/* The configurations these flags describe, as JSON5: Zenoh in peer mode with the
 * endpoints given (no multicast scouting when any is), ours naming the device. */
static inline void zcs_configs(const struct zcs_flags *f, char zenoh[1024], char ours[128]) {
    int n = snprintf(zenoh, 1024, "{mode: \"peer\"");
    if (f->connect) n += snprintf(zenoh + n, 1024 - n, ", connect: {endpoints: [\"%s\"]}", f->connect);
    if (f->listen) n += snprintf(zenoh + n, 1024 - n, ", listen: {endpoints: [\"%s\"]}", f->listen);
    if (f->connect || f->listen) n += snprintf(zenoh + n, 1024 - n, ", scouting: {multicast: {enabled: false}}");
    snprintf(zenoh + n, 1024 - n, "}");
    snprintf(ours, 128, "{device: \"%s\"}", f->device ? f->device : "auto");
}

/* Opens the session these flags describe. */
static inline zcs_session_t zcs_open_from(const struct zcs_flags *f) {
    char zenoh[1024], ours[128];
    zcs_configs(f, zenoh, ours);
    zcs_session_t s = {0};
    zcs_check(zcs_session_open(zenoh, ours, &s), "open the session");
    return s;
}

#endif
