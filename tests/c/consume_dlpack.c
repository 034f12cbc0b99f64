/*
 * A minimal DLPack consumer and producer in C, for the tensor tests.
 *
 * The structs are written here from the layout dlpack.h (v1.3) documents, independently
 * of the Rust definitions in zenoh-cuda-shm/src/dlpack/abi.rs, so that a test going through
 * these functions checks the Rust side's ABI, not a copy of it. Nothing here touches
 * device memory: for kDLCUDA tensors the consumer only reads the fields (the Rust side
 * checks the data through the pointer read here), and the producer only wraps a pointer
 * the caller owns. No CUDA library is needed to build or link this file.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int32_t device_type;
    int32_t device_id;
} DLDevice;

typedef struct {
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
} DLDataType;

typedef struct {
    void *data;
    DLDevice device;
    int32_t ndim;
    DLDataType dtype;
    int64_t *shape;
    int64_t *strides;
    uint64_t byte_offset;
} DLTensor;

typedef struct {
    uint32_t major;
    uint32_t minor;
} DLPackVersion;

typedef struct DLManagedTensor {
    DLTensor dl_tensor;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensor *self);
} DLManagedTensor;

typedef struct DLManagedTensorVersioned {
    DLPackVersion version;
    void *manager_ctx;
    void (*deleter)(struct DLManagedTensorVersioned *self);
    uint64_t flags;
    DLTensor dl_tensor;
} DLManagedTensorVersioned;

enum { kDLCPU = 1 };
#define ZCS_MAX_DIMS 8

/* What the consumer read; mirrored by `Summary` in dlpack_ffi.rs. */
typedef struct {
    int32_t versioned;
    uint32_t version_major;
    uint32_t version_minor;
    int32_t has_deleter;
    uint64_t flags;
    uint64_t manager_ctx;
    uint64_t data;
    int32_t device_type;
    int32_t device_id;
    int32_t ndim;
    uint8_t code;
    uint8_t bits;
    uint16_t lanes;
    int32_t shape_null;
    int32_t strides_null;
    int64_t shape[ZCS_MAX_DIMS];
    int64_t strides[ZCS_MAX_DIMS];
    uint64_t byte_offset;
    uint64_t host_copied;
} zcs_dl_summary;

static int summarize(const DLTensor *t, zcs_dl_summary *out, uint8_t *host_copy, uint64_t copy_len) {
    out->data = (uint64_t)(uintptr_t)t->data;
    out->device_type = t->device.device_type;
    out->device_id = t->device.device_id;
    out->ndim = t->ndim;
    out->code = t->dtype.code;
    out->bits = t->dtype.bits;
    out->lanes = t->dtype.lanes;
    out->shape_null = t->shape == NULL;
    out->strides_null = t->strides == NULL;
    out->byte_offset = t->byte_offset;
    if (t->ndim < 0 || t->ndim > ZCS_MAX_DIMS) {
        return -2;
    }
    for (int32_t i = 0; i < t->ndim; i++) {
        out->shape[i] = t->shape ? t->shape[i] : -1;
        out->strides[i] = t->strides ? t->strides[i] : -1;
    }
    /* Host data is read here, as a C consumer would; device data is not touched. */
    if (t->device.device_type == kDLCPU && host_copy != NULL && copy_len > 0) {
        memcpy(host_copy, (const uint8_t *)t->data + t->byte_offset, (size_t)copy_len);
        out->host_copied = copy_len;
    }
    return 0;
}

/* Reads every field of a versioned tensor (and, for kDLCPU, `copy_len` bytes from its
 * first element into `host_copy`). Returns 0, 1 when the major version is not 1 (only the
 * version was read, as DLPack requires), or a negative value for bad arguments. */
int zcs_dlpack_inspect_versioned(const DLManagedTensorVersioned *m, zcs_dl_summary *out, uint8_t *host_copy,
                                 uint64_t copy_len) {
    if (m == NULL || out == NULL) {
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->versioned = 1;
    out->version_major = m->version.major;
    out->version_minor = m->version.minor;
    out->has_deleter = m->deleter != NULL;
    if (m->version.major != 1) {
        return 1;
    }
    out->flags = m->flags;
    out->manager_ctx = (uint64_t)(uintptr_t)m->manager_ctx;
    return summarize(&m->dl_tensor, out, host_copy, copy_len);
}

/* As zcs_dlpack_inspect_versioned, for the legacy struct. */
int zcs_dlpack_inspect_legacy(const DLManagedTensor *m, zcs_dl_summary *out, uint8_t *host_copy, uint64_t copy_len) {
    if (m == NULL || out == NULL) {
        return -1;
    }
    memset(out, 0, sizeof *out);
    out->has_deleter = m->deleter != NULL;
    out->manager_ctx = (uint64_t)(uintptr_t)m->manager_ctx;
    return summarize(&m->dl_tensor, out, host_copy, copy_len);
}

/* The consumer is done: call the deleter, as DLPack requires, exactly once. */
void zcs_dlpack_delete_versioned(DLManagedTensorVersioned *m) {
    if (m != NULL && m->deleter != NULL) {
        m->deleter(m);
    }
}

/* As zcs_dlpack_delete_versioned, for the legacy struct. */
void zcs_dlpack_delete_legacy(DLManagedTensor *m) {
    if (m != NULL && m->deleter != NULL) {
        m->deleter(m);
    }
}

/* Sizes and offsets as this compiler lays the structs out. */
void zcs_dlpack_layout(uint64_t out[10]) {
    out[0] = sizeof(DLTensor);
    out[1] = sizeof(DLManagedTensor);
    out[2] = sizeof(DLManagedTensorVersioned);
    out[3] = offsetof(DLManagedTensorVersioned, manager_ctx);
    out[4] = offsetof(DLManagedTensorVersioned, deleter);
    out[5] = offsetof(DLManagedTensorVersioned, flags);
    out[6] = offsetof(DLManagedTensorVersioned, dl_tensor);
    out[7] = offsetof(DLManagedTensor, deleter);
    out[8] = offsetof(DLTensor, dtype);
    out[9] = offsetof(DLTensor, byte_offset);
}

/* A producer: wraps memory the caller owns (never touched here) in a heap-allocated
 * managed tensor whose deleter frees it and increments *deleted. */
typedef struct {
    DLManagedTensorVersioned versioned;
    DLManagedTensor legacy;
    int64_t shape[ZCS_MAX_DIMS];
    int64_t strides[ZCS_MAX_DIMS];
    int32_t *deleted;
} zcs_producer_ctx;

static void producer_delete_versioned(DLManagedTensorVersioned *m) {
    zcs_producer_ctx *c = (zcs_producer_ctx *)m->manager_ctx;
    (*c->deleted)++;
    free(c);
}

static void producer_delete_legacy(DLManagedTensor *m) {
    zcs_producer_ctx *c = (zcs_producer_ctx *)m->manager_ctx;
    (*c->deleted)++;
    free(c);
}

static zcs_producer_ctx *producer_new(void *data, int32_t device_type, int32_t device_id, int32_t ndim,
                                      const int64_t *shape, const int64_t *strides, uint8_t code, uint8_t bits,
                                      uint16_t lanes, uint64_t byte_offset, int32_t *deleted, DLTensor *t) {
    if (ndim < 0 || ndim > ZCS_MAX_DIMS || deleted == NULL) {
        return NULL;
    }
    zcs_producer_ctx *c = (zcs_producer_ctx *)calloc(1, sizeof *c);
    if (c == NULL) {
        return NULL;
    }
    for (int32_t i = 0; i < ndim; i++) {
        c->shape[i] = shape[i];
        c->strides[i] = strides ? strides[i] : 0;
    }
    c->deleted = deleted;
    t->data = data;
    t->device.device_type = device_type;
    t->device.device_id = device_id;
    t->ndim = ndim;
    t->dtype.code = code;
    t->dtype.bits = bits;
    t->dtype.lanes = lanes;
    t->shape = c->shape;
    t->strides = strides ? c->strides : NULL;
    t->byte_offset = byte_offset;
    return c;
}

DLManagedTensorVersioned *zcs_dlpack_make_versioned(void *data, int32_t device_type, int32_t device_id, int32_t ndim,
                                                    const int64_t *shape, const int64_t *strides, uint8_t code,
                                                    uint8_t bits, uint16_t lanes, uint64_t byte_offset,
                                                    uint32_t major, uint64_t flags, int32_t *deleted) {
    DLTensor t;
    zcs_producer_ctx *c =
        producer_new(data, device_type, device_id, ndim, shape, strides, code, bits, lanes, byte_offset, deleted, &t);
    if (c == NULL) {
        return NULL;
    }
    c->versioned.version.major = major;
    c->versioned.version.minor = 0;
    c->versioned.manager_ctx = c;
    c->versioned.deleter = producer_delete_versioned;
    c->versioned.flags = flags;
    c->versioned.dl_tensor = t;
    return &c->versioned;
}

DLManagedTensor *zcs_dlpack_make_legacy(void *data, int32_t device_type, int32_t device_id, int32_t ndim,
                                        const int64_t *shape, const int64_t *strides, uint8_t code, uint8_t bits,
                                        uint16_t lanes, uint64_t byte_offset, int32_t *deleted) {
    DLTensor t;
    zcs_producer_ctx *c =
        producer_new(data, device_type, device_id, ndim, shape, strides, code, bits, lanes, byte_offset, deleted, &t);
    if (c == NULL) {
        return NULL;
    }
    c->legacy.manager_ctx = c;
    c->legacy.deleter = producer_delete_legacy;
    c->legacy.dl_tensor = t;
    return &c->legacy;
}
