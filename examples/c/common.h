/* Shared by the C examples: the test pattern (the same bytes as the Rust examples'
 * cuda::kernels::pattern_byte, so C and Rust processes check each other's frames), the
 * configuration strings built from command-line flags, error reporting, and what the
 * Rust examples say while they run (the end on SIGINT/SIGTERM with a summary, the
 * waiting lines, a subscriber's counts adding up). */
#ifndef ZCS_EXAMPLES_COMMON_H
#define ZCS_EXAMPLES_COMMON_H

#include <signal.h>
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

/* Flags common to the examples, in the style of Zenoh's z_pub / z_sub and with the
 * names of the Rust examples. */
struct zcs_flags {
    const char *key;
    const char *connect;
    const char *listen;
    const char *device;
    size_t size;
    uint64_t count;
    const char *mode;   /* -m: peer (default), client or router */
    const char *config; /* -c: a Zenoh JSON5 configuration file */
};

/* The flags of zcs_flags, one a line, for a usage text (`size`: whether -s is one). */
static inline void zcs_flags_help(FILE *out, const char *key, uint64_t count, int size) {
    fprintf(out,
            "  -k, --key KEY           key expression (default %s)\n"
            "  -m, --mode MODE         Zenoh mode: peer (default), client or router\n"
            "  -e, --connect ENDPOINT  an endpoint to connect to (e.g. tcp/127.0.0.1:7447)\n"
            "  -l, --listen ENDPOINT   an endpoint to listen on\n"
            "  -c, --config FILE       a Zenoh JSON5 configuration file (mode and endpoints then\n"
            "                          come from it: -m, -e and -l cannot be added to it)\n"
            "  --device DEVICE         block memory: auto (default: a GPU if usable), host or cuda\n"
            "  -n, --count N           messages (default %llu; 0: until Ctrl-C or SIGTERM)\n",
            key, (unsigned long long)count);
    if (size) fprintf(out, "  -s, --size BYTES        bytes per message (default %d)\n", size);
    fprintf(out, "  -h, --help              this text\n");
}

/* The usage text on stdout (asked for: status 0), or, after `why`, on stderr (status 2). */
static inline void zcs_usage_exit(const char *prog, const char *why, const char *arg, uint64_t count, int size) {
    FILE *out = why ? stderr : stdout;
    if (why) fprintf(stderr, "error: %s%s%s%s\n", why, arg ? " '" : "", arg ? arg : "", arg ? "'" : "");
    fprintf(out, "usage: %s [flags]\n", prog);
    zcs_flags_help(out, "demo/zcs/frame", count, size);
    exit(why ? 2 : 0);
}

/* A count flag's value: digits only. */
static inline int zcs_parse_count(const char *v, uint64_t *out) {
    char *end = NULL;
    if (*v < '0' || *v > '9') return 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (*end != '\0') return 0;
    *out = n;
    return 1;
}

static inline int zcs_is(const char *a, const char *short_name, const char *long_name) {
    return (short_name && !strcmp(a, short_name)) || (long_name && !strcmp(a, long_name));
}

/* Takes flag `a` with value `v` if it is one of the common ones: 1 if taken, 0 if it is
 * not one of them, -1 with *why set if its value is refused. */
static inline int zcs_take_flag(struct zcs_flags *f, const char *a, const char *v, const char **why) {
    if (zcs_is(a, "-k", "--key")) f->key = v;
    else if (zcs_is(a, "-e", "--connect")) f->connect = v;
    else if (zcs_is(a, "-l", "--listen")) f->listen = v;
    else if (zcs_is(a, "-c", "--config")) f->config = v;
    else if (zcs_is(a, NULL, "--device")) {
        if (strcmp(v, "auto") && strcmp(v, "host") && strcmp(v, "cuda")) {
            *why = "--device takes auto, host or cuda, not";
            return -1;
        }
        f->device = v;
    } else if (zcs_is(a, "-m", "--mode")) {
        if (strcmp(v, "peer") && strcmp(v, "client") && strcmp(v, "router")) {
            *why = "-m/--mode takes peer, client or router, not";
            return -1;
        }
        f->mode = v;
    } else if (zcs_is(a, "-n", "--count")) {
        if (!zcs_parse_count(v, &f->count)) {
            *why = "-n/--count takes a whole number, not";
            return -1;
        }
    } else return 0;
    return 1;
}

/* Checks the flags together: -c carries the whole Zenoh configuration. */
static inline const char *zcs_flags_conflict(const struct zcs_flags *f) {
    if (f->config && (f->mode || f->connect || f->listen))
        return "-c/--config takes mode and endpoints from the file: drop -m, -e and -l, or -c";
    return NULL;
}

/* Parses argv: the common flags and, where `size` is not 0 (a publisher), -s. */
static inline struct zcs_flags zcs_parse(int argc, char **argv, size_t size, uint64_t count) {
    struct zcs_flags f = {"demo/zcs/frame", NULL, NULL, NULL, size, count, NULL, NULL};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (zcs_is(a, "-h", "--help")) zcs_usage_exit(argv[0], NULL, NULL, count, (int)size);
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        const char *why = NULL;
        int taken = 0;
        if (a[0] != '-') zcs_usage_exit(argv[0], "unexpected argument", a, count, (int)size);
        if (v == NULL) zcs_usage_exit(argv[0], "a value is missing after", a, count, (int)size);
        if (size && zcs_is(a, "-s", "--size")) {
            uint64_t n = 0;
            if (!zcs_parse_count(v, &n) || n == 0) zcs_usage_exit(argv[0], "-s/--size takes a byte count, not", v, count, (int)size);
            f.size = (size_t)n;
            taken = 1;
        } else {
            taken = zcs_take_flag(&f, a, v, &why);
        }
        if (taken < 0) zcs_usage_exit(argv[0], why, v, count, (int)size);
        if (taken == 0) zcs_usage_exit(argv[0], "unknown flag", a, count, (int)size);
        i++;
    }
    const char *conflict = zcs_flags_conflict(&f);
    if (conflict) zcs_usage_exit(argv[0], conflict, NULL, count, (int)size);
    return f;
}

/* Zenoh's configuration these flags describe, as JSON5 (free it): the -c file's text,
 * or peer mode (or -m) with the endpoints given (no multicast scouting when any is).
 * Exits with a message naming the flag when the file cannot be read. */
static inline char *zcs_zenoh_config(const struct zcs_flags *f) {
    if (f->config) {
        FILE *file = fopen(f->config, "rb");
        char *text = NULL;
        long len = -1;
        if (file && fseek(file, 0, SEEK_END) == 0 && (len = ftell(file)) >= 0 && fseek(file, 0, SEEK_SET) == 0) {
            text = (char *)malloc((size_t)len + 1);
            if (text && fread(text, 1, (size_t)len, file) == (size_t)len) text[len] = '\0';
            else {
                free(text);
                text = NULL;
            }
        }
        if (file) fclose(file);
        if (!text) {
            fprintf(stderr, "error: -c/--config %s: cannot read it\n", f->config);
            exit(1);
        }
        return text;
    }
    size_t cap = 256 + (f->connect ? strlen(f->connect) : 0) + (f->listen ? strlen(f->listen) : 0);
    char *zenoh = (char *)malloc(cap);
    if (!zenoh) {
        fprintf(stderr, "error: out of memory\n");
        exit(1);
    }
    int n = snprintf(zenoh, cap, "{mode: \"%s\"", f->mode ? f->mode : "peer");
    if (f->connect) n += snprintf(zenoh + n, cap - n, ", connect: {endpoints: [\"%s\"]}", f->connect);
    if (f->listen) n += snprintf(zenoh + n, cap - n, ", listen: {endpoints: [\"%s\"]}", f->listen);
    if (f->connect || f->listen) n += snprintf(zenoh + n, cap - n, ", scouting: {multicast: {enabled: false}}");
    snprintf(zenoh + n, cap - n, "}");
    return zenoh;
}

/* Our configuration: the device. */
static inline void zcs_our_config(const struct zcs_flags *f, char ours[128]) {
    snprintf(ours, 128, "{device: \"%s\"}", f->device ? f->device : "auto");
}

/* Set by SIGINT or SIGTERM once zcs_catch_signals() has run: loops end there and print
 * their summary, as Ctrl-C or `kill` end the Rust examples. */
static volatile sig_atomic_t zcs_stop = 0;

static void zcs_on_signal(int sig) {
    (void)sig;
    zcs_stop = 1;
}

static inline void zcs_catch_signals(void) {
    signal(SIGINT, zcs_on_signal);
    signal(SIGTERM, zcs_on_signal);
}

/* A subscriber's silence: `waited_ms` without a message since the last one (or the
 * start), and whether it was said. */
struct zcs_waiting {
    uint64_t waited_ms;
    bool said;
};

/* Adds `step_ms` without a message; says once per silence that it waits: after 2 s
 * before a first message, after 5 s between messages (the Rust examples' lines). */
static inline void zcs_waiting_tick(struct zcs_waiting *w, uint64_t step_ms, uint64_t got, const char *key) {
    w->waited_ms += step_ms;
    if (w->said || w->waited_ms < (got == 0 ? 2000u : 5000u)) return;
    w->said = true;
    if (got == 0)
        printf("[sub] waiting for a publisher on '%s'\xe2\x80\xa6\n", key);
    else
        printf("[sub] nothing for 5 s after %llu messages; waiting for a publisher on '%s'\xe2\x80\xa6\n",
               (unsigned long long)got, key);
    fflush(stdout);
}

/* The summary's account of what came: `checked` of the samples received (by path), the
 * rest unread at the end or dropped by the full queue; then what was lost. */
static inline void zcs_print_received(const char *how, uint64_t checked, const struct zcs_subscriber_stats_t *s) {
    uint64_t received = s->zero_copy + s->peer_copy + s->host_block + s->inline_samples + s->cpu_bytes + s->plain;
    uint64_t gone = checked + s->dropped_queue_full;
    printf("[sub] %s: %llu messages checked of %llu received (zero-copy %llu, cpu-bytes %llu, inline %llu, plain %llu)",
           how, (unsigned long long)checked, (unsigned long long)received, (unsigned long long)s->zero_copy,
           (unsigned long long)s->cpu_bytes, (unsigned long long)s->inline_samples, (unsigned long long)s->plain);
    if (received > gone) printf(": %llu unread at the end", (unsigned long long)(received - gone));
    if (s->dropped_queue_full > 0)
        printf("%s %llu dropped as the queue was full", received > gone ? "," : ":",
               (unsigned long long)s->dropped_queue_full);
    printf("; lost %llu, duplicates dropped %llu\n", (unsigned long long)s->lost, (unsigned long long)s->duplicates);
}

/* Opens the session these flags describe. */
static inline zcs_session_t zcs_open_from(const struct zcs_flags *f) {
    char *zenoh = zcs_zenoh_config(f);
    char ours[128];
    zcs_our_config(f, ours);
    zcs_session_t s = {0};
    zcs_result_t r = zcs_session_open(zenoh, ours, &s);
    free(zenoh);
    zcs_check(r, "open the session");
    return s;
}

#endif
