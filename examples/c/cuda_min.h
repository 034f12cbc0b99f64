/* The few CUDA driver API calls the examples make, loaded from libcuda at run time
 * (as the library itself does), so that building them needs no CUDA toolkit. The
 * calling thread must have the session's context current: zcs_session_bind_gpu. */
#ifndef ZCS_EXAMPLES_CUDA_MIN_H
#define ZCS_EXAMPLES_CUDA_MIN_H

#include <dlfcn.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

typedef int zcs_cu_result;
typedef void *zcs_cu_stream;
typedef unsigned long long zcs_cu_deviceptr;
typedef int zcs_cu_device;

struct zcs_cuda {
    zcs_cu_result (*stream_create)(zcs_cu_stream *, unsigned int);
    zcs_cu_result (*stream_synchronize)(zcs_cu_stream);
    zcs_cu_result (*stream_destroy)(zcs_cu_stream);
    zcs_cu_result (*memcpy_htod_async)(zcs_cu_deviceptr, const void *, size_t, zcs_cu_stream);
    zcs_cu_result (*memcpy_dtoh_async)(void *, zcs_cu_deviceptr, size_t, zcs_cu_stream);
    zcs_cu_result (*memset_d32_async)(zcs_cu_deviceptr, unsigned int, size_t, zcs_cu_stream);
    zcs_cu_result (*mem_alloc)(zcs_cu_deviceptr *, size_t);
    zcs_cu_result (*mem_free)(zcs_cu_deviceptr);
    zcs_cu_result (*ctx_get_device)(zcs_cu_device *);
    zcs_cu_result (*device_get_name)(char *, int, zcs_cu_device);
};

/* Loads the calls; 0 on success, -1 (with a message) where libcuda is missing. */
static inline int zcs_cuda_load(struct zcs_cuda *cu) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "error: cannot open libcuda.so.1: %s\n", dlerror());
        return -1;
    }
    /* dlsym returns an object pointer; POSIX guarantees the conversion (hence memcpy). */
#define ZCS_CU_SYM(field, name)                                                   \
    do {                                                                         \
        void *p_ = dlsym(lib, name);                                             \
        if (!p_) {                                                               \
            fprintf(stderr, "error: libcuda has no %s\n", name);                 \
            return -1;                                                           \
        }                                                                        \
        memcpy(&cu->field, &p_, sizeof p_);                                      \
    } while (0)
    ZCS_CU_SYM(stream_create, "cuStreamCreate");
    ZCS_CU_SYM(stream_synchronize, "cuStreamSynchronize");
    ZCS_CU_SYM(stream_destroy, "cuStreamDestroy_v2");
    ZCS_CU_SYM(memcpy_htod_async, "cuMemcpyHtoDAsync_v2");
    ZCS_CU_SYM(memcpy_dtoh_async, "cuMemcpyDtoHAsync_v2");
    ZCS_CU_SYM(memset_d32_async, "cuMemsetD32Async");
    ZCS_CU_SYM(mem_alloc, "cuMemAlloc_v2");
    ZCS_CU_SYM(mem_free, "cuMemFree_v2");
    ZCS_CU_SYM(ctx_get_device, "cuCtxGetDevice");
    ZCS_CU_SYM(device_get_name, "cuDeviceGetName");
#undef ZCS_CU_SYM
    return 0;
}

#endif
