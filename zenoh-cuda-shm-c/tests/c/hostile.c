/* Hostile use of the C ABI: null arguments, null, stale and made-up handles, double
 * drops, use after close, bad configurations and lengths. Every call must return the
 * documented error (never crash), with a message. Built with AddressSanitizer by
 * tests/c_abi.rs; exits 1 at the first surprise. Argument: a Zenoh JSON5 configuration
 * for the one real session (an isolated peer). */
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <zenoh_cuda_shm.h>

#include "expect.h"

/* A callback subscriber's: counts the samples of 4 bytes and drops each. */
static void on_sample(zcs_sample_t sample, void *context) {
    size_t len = 0;
    if (zcs_sample_len(sample, &len) == ZCS_OK && len == 4) atomic_fetch_add((atomic_int *)context, 1);
    zcs_sample_drop(&sample);
}

/* A callback subscriber that drops itself from inside its first call. */
struct self_drop {
    zcs_subscriber_t self;
    atomic_int calls;
    atomic_int drop_rc;
};

static void drop_self(zcs_sample_t sample, void *context) {
    struct self_drop *c = context;
    atomic_fetch_add(&c->calls, 1);
    zcs_sample_drop(&sample);
    if (c->self.id != 0) atomic_store(&c->drop_rc, zcs_subscriber_drop(&c->self));
}

/* Counts the keys it is given. */
static void count_key(const char *key, void *context) {
    (void)key;
    (*(int *)context)++;
}

int main(int argc, char **argv) {
    const char *zenoh = argc > 1 ? argv[1] : "{mode: \"peer\", scouting: {multicast: {enabled: false}}}";
    zcs_session_t null_session = {0};
    zcs_publisher_t null_pub = {0};
    zcs_subscriber_t null_sub = {0};
    zcs_sample_t null_sample = {0};
    zcs_loan_t null_loan = {0};
    uint64_t u64 = 0;
    size_t size = 0;
    const char *str = NULL;

    /* Null out-parameters and arguments. */
    EXPECT(zcs_session_open(zenoh, "{device: \"host\"}", NULL), ZCS_ERR_NULL);
    EXPECT(zcs_session_close(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_publisher_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_subscriber_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_sample_drop(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_loan_drop(NULL), ZCS_ERR_NULL);

    /* Bad configurations. */
    zcs_session_t s = {0};
    EXPECT(zcs_session_open("{mode: ", NULL, &s), ZCS_ERR_INVALID);
    EXPECT(zcs_session_open(zenoh, "{no_such_key: 1}", &s), ZCS_ERR_INVALID);
    EXPECT(zcs_session_open(zenoh, "{device: \"quantum\"}", &s), ZCS_ERR_INVALID);
    if (s.id != 0) { fprintf(stderr, "a failed open wrote its handle\n"); failures++; }

    /* Null handles. */
    EXPECT(zcs_session_backend(null_session, &str), ZCS_ERR_STALE);
    EXPECT(zcs_session_close(&null_session), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_declare(null_session, "k", &null_pub), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_put_bytes(null_pub, (const uint8_t *)"x", 1, NULL), ZCS_ERR_STALE);
    EXPECT(zcs_subscriber_recv(null_sub, 0, &null_sample), ZCS_ERR_STALE);
    EXPECT(zcs_sample_seq(null_sample, &u64), ZCS_ERR_STALE);
    EXPECT(zcs_loan_len(null_loan, &size), ZCS_ERR_STALE);
    EXPECT(zcs_sample_timestamp_ns(null_sample, &u64), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_zero_copy_subscribers(null_pub, &size), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_blocks_in_use(null_pub, &size), ZCS_ERR_STALE);

    /* A real session, publisher, subscriber and loan. */
    EXPECT(zcs_session_open(zenoh, "{device: \"host\"}", &s), ZCS_OK);
    zcs_publisher_t p = {0};
    zcs_subscriber_t sub = {0};
    EXPECT(zcs_publisher_declare(s, NULL, &p), ZCS_ERR_NULL);
    EXPECT(zcs_publisher_declare(s, "hostile/**", &p), ZCS_ERR_INVALID);
    EXPECT(zcs_publisher_declare(s, "hostile/c", &p), ZCS_OK);
    EXPECT(zcs_subscriber_declare(s, "hostile/c", &sub), ZCS_OK);
    int keys = 0;
    EXPECT(zcs_session_publisher_keys(s, NULL, 100, NULL, &keys), ZCS_ERR_NULL);
    EXPECT(zcs_session_publisher_keys(null_session, NULL, 100, count_key, &keys), ZCS_ERR_STALE);
    EXPECT(zcs_session_publisher_keys(s, "/hostile/c", 100, count_key, &keys), ZCS_ERR_INVALID);
    EXPECT(zcs_session_publisher_keys(s, "hostile//c", 100, count_key, &keys), ZCS_ERR_INVALID);
    if (keys != 0) {
        fprintf(stderr, "zcs_session_publisher_keys called back %d times on bad input\n", keys);
        return 1;
    }
    size_t aware = 0;
    for (int i = 0; i < 500 && aware == 0; i++) {
        EXPECT(zcs_publisher_subscribers(p, &aware, NULL), ZCS_OK);
        struct timespec t = {0, 10000000L};
        nanosleep(&t, NULL);
    }
    EXPECT(zcs_publisher_put_bytes(p, NULL, 4, NULL), ZCS_ERR_NULL);
    zcs_loan_t loan = {0};
    EXPECT(zcs_publisher_loan(p, 0, &loan), ZCS_ERR_INVALID);
    EXPECT(zcs_publisher_loan(p, 4096, &loan), ZCS_OK);
    uint8_t *host = NULL;
    uint64_t dptr = 0;
    void *stream = NULL;
    EXPECT(zcs_loan_host_ptr(loan, &host), ZCS_OK);
    EXPECT(zcs_loan_device_ptr(loan, &dptr, &stream), ZCS_ERR_MEMORY);
    memset(host, 7, 4096);
    zcs_loan_t copy = loan;
    EXPECT(zcs_publisher_put(p, &loan, &u64), ZCS_OK);
    if (loan.id != 0) { fprintf(stderr, "put did not zero the loan\n"); failures++; }
    EXPECT(zcs_publisher_put(p, &copy, &u64), ZCS_ERR_STALE); /* put twice */
    EXPECT(zcs_loan_drop(&copy), ZCS_ERR_STALE);
    EXPECT(zcs_loan_host_ptr(copy, &host), ZCS_ERR_STALE);  /* use after put */

    /* A sample: dropped twice, used after drop. */
    zcs_sample_t sample = {0};
    EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK);
    EXPECT(zcs_sample_len(sample, &size), ZCS_OK);
    EXPECT(zcs_sample_timestamp_ns(sample, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_sample_timestamp_ns(sample, &u64), ZCS_OK);
    if (u64 == 0) { fprintf(stderr, "a sample of ours without its publication time\n"); failures++; }
    EXPECT(zcs_publisher_zero_copy_subscribers(p, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_publisher_blocks_in_use(p, NULL), ZCS_ERR_NULL);
    size_t in_use = 0;
    EXPECT(zcs_publisher_blocks_in_use(p, &in_use), ZCS_OK);
    /* Device reads and the GPU's context: a host-memory session has neither. */
    zcs_read_t read = {0};
    EXPECT(zcs_sample_read(sample, NULL, &read, &dptr), ZCS_ERR_MEMORY);
    EXPECT(zcs_sample_read(sample, NULL, NULL, &dptr), ZCS_ERR_NULL);
    EXPECT(zcs_read_end(&read), ZCS_ERR_STALE);
    EXPECT(zcs_read_end(NULL), ZCS_ERR_NULL);
    EXPECT(zcs_session_bind_gpu(s), ZCS_ERR_MEMORY);
    if (size != 4096) { fprintf(stderr, "a sample of %zu bytes\n", size); failures++; }
    uint8_t small[16];
    EXPECT(zcs_sample_copy_to_host(sample, small, sizeof small), ZCS_ERR_INVALID);
    zcs_sample_t sample2 = sample;
    EXPECT(zcs_sample_drop(&sample), ZCS_OK);
    EXPECT(zcs_sample_drop(&sample2), ZCS_ERR_STALE);
    EXPECT(zcs_sample_seq(sample2, &u64), ZCS_ERR_STALE);
    EXPECT(zcs_subscriber_recv(sub, 0, &sample), ZCS_ERR_TIMEOUT);

    /* Tensors: a description that does not fit is refused and the loan stays usable. */
    int64_t shape[2] = {16, 64}; /* 16 x 64 float32: the 4096 bytes of the loan */
    int64_t wide[2] = {16, 65};
    zcs_tensor_t t;
    memset(&t, 0, sizeof t);
    t.dtype_code = 2;
    t.dtype_bits = 32;
    t.dtype_lanes = 1;
    t.ndim = 2;
    t.shape = shape;
    EXPECT(zcs_publisher_loan(p, 4096, &loan), ZCS_OK);
    EXPECT(zcs_publisher_put_tensor(p, &loan, NULL, &u64), ZCS_ERR_NULL);
    zcs_tensor_t bad = t;
    bad.ndim = -1;
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    bad.ndim = 65;
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    bad = t;
    bad.shape = NULL;
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_NULL);
    bad = t;
    bad.dtype_bits = 31;
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    bad = t;
    bad.device_type = 2; /* kDLCUDA, from a host-memory publisher */
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    bad.device_type = 99;
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    bad = t;
    bad.shape = wide; /* 4160 bytes in a loan of 4096 */
    EXPECT(zcs_publisher_put_tensor(p, &loan, &bad, &u64), ZCS_ERR_INVALID);
    if (loan.id == 0) { fprintf(stderr, "a refused tensor put took the loan\n"); failures++; }
    EXPECT(zcs_loan_host_ptr(loan, &host), ZCS_OK);
    for (int i = 0; i < 1024; i++) ((float *)host)[i] = (float)i * 0.5f;
    /* Another publisher's loan is refused by put and put_tensor, and stays usable. */
    zcs_publisher_t other = {0};
    zcs_loan_t theirs = {0};
    EXPECT(zcs_publisher_declare(s, "hostile/other", &other), ZCS_OK);
    EXPECT(zcs_publisher_loan(other, 64, &theirs), ZCS_OK);
    EXPECT(zcs_publisher_put(p, &theirs, &u64), ZCS_ERR_INVALID);
    EXPECT(zcs_publisher_put_tensor(p, &theirs, &t, &u64), ZCS_ERR_INVALID);
    EXPECT(zcs_publisher_put(other, &theirs, &u64), ZCS_OK);
    EXPECT(zcs_publisher_drop(&other), ZCS_OK);
    EXPECT(zcs_publisher_put_tensor(p, &loan, &t, &u64), ZCS_OK);
    if (loan.id != 0) { fprintf(stderr, "put_tensor did not zero the loan\n"); failures++; }
    EXPECT(zcs_publisher_put_tensor_host(p, host, 100, &t, &u64), ZCS_ERR_INVALID); /* 100 bytes < 4096 */
    EXPECT(zcs_publisher_put_tensor_device(p, 1, 4096, &t, NULL, &u64), ZCS_ERR_MEMORY);
    EXPECT(zcs_publisher_put_device(p, 1, 4096, NULL, &u64), ZCS_ERR_MEMORY);

    EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK);
    zcs_tensor_t got;
    EXPECT(zcs_sample_tensor(sample, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_sample_tensor(sample, &got), ZCS_OK);
    if (got.dtype_code != 2 || got.dtype_bits != 32 || got.dtype_lanes != 1 || got.ndim != 2 || got.shape[0] != 16 ||
        got.shape[1] != 64 || got.strides[0] != 64 || got.strides[1] != 1 || got.device_type != 1 ||
        got.byte_offset != 0) {
        fprintf(stderr, "the received description differs from the one put\n");
        failures++;
    }
    /* DLPack: bad flags refused; an export outlives its sample until its deleter. The
     * struct below is DLPack 1.x's layout (dlpack.h), to read the export back. */
    struct dl_v1 {
        uint32_t major, minor;
        void *ctx;
        void (*deleter)(void *);
        uint64_t flags;
        void *data;
        int32_t device_type, device_id, ndim;
        uint8_t code, bits;
        uint16_t lanes;
        int64_t *shape, *strides;
        uint64_t byte_offset;
    };
    DLManagedTensorVersioned *m = NULL;
    EXPECT(zcs_sample_to_dlpack(sample, NULL, 8, &m), ZCS_ERR_INVALID);
    EXPECT(zcs_sample_to_dlpack(sample, NULL, ZCS_DLPACK_COPY | ZCS_DLPACK_NO_COPY, &m), ZCS_ERR_INVALID);
    EXPECT(zcs_sample_to_dlpack(sample, NULL, 0, NULL), ZCS_ERR_NULL);
    EXPECT(zcs_sample_to_dlpack(sample, NULL, 0, &m), ZCS_OK);
    EXPECT(zcs_sample_drop(&sample), ZCS_OK);
    const struct dl_v1 *dl = (const struct dl_v1 *)m;
    if (!dl || dl->major != 1 || dl->ndim != 2 || dl->shape[1] != 64 || dl->device_type != 1 ||
        ((const float *)((const uint8_t *)dl->data + dl->byte_offset))[1023] != 511.5f) {
        fprintf(stderr, "the DLPack export does not describe the tensor put\n");
        failures++;
    }
    EXPECT(zcs_dlpack_free(m), ZCS_OK);
    EXPECT(zcs_dlpack_free(NULL), ZCS_OK);
    /* A bytes sample has no description. */
    EXPECT(zcs_publisher_put_bytes(p, (const uint8_t *)"plain", 5, &u64), ZCS_OK);
    EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK);
    EXPECT(zcs_sample_tensor(sample, &got), ZCS_ERR_NO_TENSOR);
    EXPECT(zcs_sample_to_dlpack(sample, NULL, 0, &m), ZCS_ERR_NO_TENSOR);
    EXPECT(zcs_sample_drop(&sample), ZCS_OK);

    /* A callback subscriber: no queue to receive from; a null callback is refused. */
    atomic_int called = 0;
    zcs_subscriber_t cb = {0};
    EXPECT(zcs_subscriber_declare_callback(s, "hostile/c", NULL, &called, &cb), ZCS_ERR_NULL);
    EXPECT(zcs_subscriber_declare_callback(s, "hostile/c", on_sample, &called, &cb), ZCS_OK);
    EXPECT(zcs_subscriber_recv(cb, 0, &sample), ZCS_ERR_INVALID);
    for (int i = 0; i < 500 && aware < 2; i++) {
        EXPECT(zcs_publisher_subscribers(p, &aware, NULL), ZCS_OK);
        struct timespec t = {0, 10000000L};
        nanosleep(&t, NULL);
    }
    EXPECT(zcs_publisher_put_bytes(p, (const uint8_t *)"abcd", 4, &u64), ZCS_OK);
    for (int i = 0; i < 1000 && atomic_load(&called) == 0; i++) {
        struct timespec t = {0, 10000000L};
        nanosleep(&t, NULL);
    }
    if (atomic_load(&called) != 1) { fprintf(stderr, "the callback saw %d samples\n", atomic_load(&called)); failures++; }
    EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK); /* the queue got it too */
    EXPECT(zcs_sample_drop(&sample), ZCS_OK);
    EXPECT(zcs_subscriber_drop(&cb), ZCS_OK);

    /* A callback subscriber dropped from inside its callback: the drop succeeds, and
       no call comes after it. */
    struct self_drop sd = {{0}, 0, -100};
    EXPECT(zcs_subscriber_declare_callback(s, "hostile/c", drop_self, &sd, &sd.self), ZCS_OK);
    /* Put until its first call (it may miss the first puts while it joins). */
    for (int i = 0; i < 500 && atomic_load(&sd.drop_rc) == -100; i++) {
        EXPECT(zcs_publisher_put_bytes(p, (const uint8_t *)"abcd", 4, &u64), ZCS_OK);
        EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK);
        EXPECT(zcs_sample_drop(&sample), ZCS_OK);
        struct timespec t = {0, 20000000L};
        nanosleep(&t, NULL);
    }
    if (atomic_load(&sd.drop_rc) != ZCS_OK) { fprintf(stderr, "dropping itself in its callback: %d\n", atomic_load(&sd.drop_rc)); failures++; }
    EXPECT(zcs_publisher_put_bytes(p, (const uint8_t *)"efgh", 4, &u64), ZCS_OK);
    EXPECT(zcs_subscriber_recv(sub, 10000, &sample), ZCS_OK);
    EXPECT(zcs_sample_drop(&sample), ZCS_OK);
    {
        struct timespec t = {0, 200000000L};
        nanosleep(&t, NULL);
    }
    if (atomic_load(&sd.calls) != 1) { fprintf(stderr, "the self-dropping callback ran %d times\n", atomic_load(&sd.calls)); failures++; }

    /* A handle made up, and one of another kind's number space. */
    zcs_publisher_t madeup = {p.id ^ 0x500000000ull};
    EXPECT(zcs_publisher_put_bytes(madeup, (const uint8_t *)"x", 1, NULL), ZCS_ERR_STALE);

    /* Use after drop and close. */
    zcs_publisher_t p2 = p;
    zcs_subscriber_t sub2 = sub;
    EXPECT(zcs_publisher_drop(&p), ZCS_OK);
    EXPECT(zcs_publisher_drop(&p2), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_put_bytes(p2, (const uint8_t *)"x", 1, NULL), ZCS_ERR_STALE);
    EXPECT(zcs_subscriber_drop(&sub), ZCS_OK);
    EXPECT(zcs_subscriber_recv(sub2, 0, &sample), ZCS_ERR_STALE);
    zcs_session_t s2 = s;
    EXPECT(zcs_session_close(&s), ZCS_OK);
    EXPECT(zcs_session_close(&s2), ZCS_ERR_STALE);
    EXPECT(zcs_publisher_declare(s2, "hostile/c", &p), ZCS_ERR_STALE);

    if (failures) {
        fprintf(stderr, "%d hostile calls were not refused as documented\n", failures);
        return 1;
    }
    printf("hostile: every call refused as documented\n");
    return 0;
}
