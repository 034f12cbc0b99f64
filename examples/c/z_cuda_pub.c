/* Publishes COUNT frames of SIZE bytes on KEY through zenoh-cuda-shm, each filled with
 * the pattern of its sequence number, after waiting (up to 10 s) for a subscriber.
 *
 *   z_cuda_pub -k demo/zcs/frame -l tcp/127.0.0.1:7447 -n 100 -s 1048576
 *
 * A host loan is written by the CPU; a device loan (a CUDA session) by a copy enqueued
 * on the loan's stream, which the put orders every subscriber's reads after: no wait
 * on the host. Ctrl-C or SIGTERM ends it with its summary. */
#include <time.h>

#include "common.h"
#include "cuda_min.h"

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

int main(int argc, char **argv) {
    struct zcs_flags f = zcs_parse(argc, argv, 1 << 20, 10);
    zcs_session_t session = zcs_open_from(&f);
    const char *backend = "";
    zcs_check(zcs_session_backend(session, &backend), "backend");
    zcs_publisher_t pub = {0};
    zcs_check(zcs_publisher_declare(session, f.key, &pub), "declare the publisher");
    zcs_catch_signals();
    printf("[pub] publishing on '%s' (%s)\n", f.key, backend);
    fflush(stdout);
    size_t aware = 0;
    bool plain = false;
    for (int i = 0; i < 1000 && aware == 0 && !plain && !zcs_stop; i++) {
        zcs_check(zcs_publisher_subscribers(pub, &aware, &plain), "subscribers");
        sleep_ms(10);
    }
    if (aware == 0 && !plain) fprintf(stderr, "[pub] no subscriber after 10 s: publishing anyway\n");
    uint8_t *frame = malloc(f.size);
    struct zcs_cuda cu;
    int cuda_loaded = 0;
    uint64_t sent = 0;
    double last_report = now_s();
    for (uint64_t n = 1; (f.count == 0 || n <= f.count) && !zcs_stop; n++) {
        zcs_loan_t loan = {0};
        zcs_check(zcs_publisher_loan(pub, f.size, &loan), "loan");
        uint8_t *host = NULL;
        zcs_result_t r = zcs_loan_host_ptr(loan, &host);
        if (r == ZCS_OK) {
            for (size_t i = 0; i < f.size; i++) host[i] = zcs_pattern_byte(i, n);
        } else if (r == ZCS_ERR_MEMORY) {
            uint64_t dptr = 0;
            void *stream = NULL;
            zcs_check(zcs_loan_device_ptr(loan, &dptr, &stream), "device pointer");
            if (!cuda_loaded) {
                if (zcs_cuda_load(&cu) != 0) return 1;
                zcs_check(zcs_session_bind_gpu(session), "bind the GPU");
                cuda_loaded = 1;
            }
            for (size_t i = 0; i < f.size; i++) frame[i] = zcs_pattern_byte(i, n);
            if (cu.memcpy_htod_async(dptr, frame, f.size, stream) != 0) {
                fprintf(stderr, "error: the copy onto the GPU failed\n");
                return 1;
            }
        } else {
            zcs_check(r, "host pointer");
        }
        uint64_t seq = 0;
        zcs_check(zcs_publisher_put(pub, &loan, &seq), "put");
        if (seq != n) {
            fprintf(stderr, "error: message %llu went out as %llu\n", (unsigned long long)n, (unsigned long long)seq);
            return 1;
        }
        sent = n;
        if (now_s() - last_report >= 1.0) {
            size_t zero_copy = 0;
            zcs_check(zcs_publisher_subscribers(pub, &aware, &plain), "subscribers");
            zcs_check(zcs_publisher_zero_copy_subscribers(pub, &zero_copy), "zero-copy subscribers");
            printf("[pub] %llu msgs  subscribers: %zu aware (%zu zero-copy)%s\n", (unsigned long long)n, aware,
                   zero_copy, plain ? " + plain listeners" : "");
            fflush(stdout);
            last_report = now_s();
        }
    }
    free(frame);
    printf("[pub] %s%llu messages of %zu bytes published (%s)\n", zcs_stop ? "interrupted: " : "",
           (unsigned long long)sent, f.size, backend);
    zcs_check(zcs_publisher_drop(&pub), "drop the publisher");
    zcs_check(zcs_session_close(&session), "close the session");
    return 0;
}
