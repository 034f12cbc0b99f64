// C++ owners of the CUDA objects the C++ programs make themselves (a stream, a device
// buffer), over the driver calls cuda_min.h loads from libcuda at run time. A failed
// call throws std::runtime_error naming it, as zcs::Error does for the library's calls.
// Make and destroy them on a thread where the session's context is current
// (zcs::Session::bind_gpu), and before the session closes: declare them after it.
#ifndef ZCS_EXAMPLES_CUDA_MIN_HPP
#define ZCS_EXAMPLES_CUDA_MIN_HPP

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

extern "C" {
#include "cuda_min.h"
}

namespace zcs_cu {

inline void check(zcs_cu_result r, const char *call) {
    if (r != 0) throw std::runtime_error(std::string(call) + " failed (CUresult " + std::to_string(r) + ")");
}

// The driver calls, loaded on first use.
inline const zcs_cuda &driver() {
    static const zcs_cuda cu = [] {
        zcs_cuda c{};
        if (zcs_cuda_load(&c) != 0) throw std::runtime_error("cannot load the CUDA driver's calls");
        return c;
    }();
    return cu;
}

// A CUDA stream of the current context (non-blocking: no implicit order with the legacy
// default stream).
class Stream {
   public:
    Stream() { check(driver().stream_create(&s_, 1 /* CU_STREAM_NON_BLOCKING */), "cuStreamCreate"); }
    Stream(const Stream &) = delete;
    Stream &operator=(const Stream &) = delete;
    ~Stream() {
        zcs_cu_result r = driver().stream_destroy(s_);
        if (r != 0) std::fprintf(stderr, "warning: cuStreamDestroy failed (CUresult %d)\n", r);
    }
    zcs_cu_stream get() const noexcept { return s_; }
    void synchronize() const { check(driver().stream_synchronize(s_), "cuStreamSynchronize"); }

   private:
    zcs_cu_stream s_ = nullptr;
};

// Device memory of the current context.
class DeviceMemory {
   public:
    explicit DeviceMemory(size_t bytes) { check(driver().mem_alloc(&p_, bytes), "cuMemAlloc"); }
    DeviceMemory(const DeviceMemory &) = delete;
    DeviceMemory &operator=(const DeviceMemory &) = delete;
    ~DeviceMemory() {
        zcs_cu_result r = driver().mem_free(p_);
        if (r != 0) std::fprintf(stderr, "warning: cuMemFree failed (CUresult %d)\n", r);
    }
    uint64_t ptr() const noexcept { return p_; }

   private:
    zcs_cu_deviceptr p_ = 0;
};

// The name of the current context's device ("NVIDIA H100 80GB HBM3").
inline std::string device_name() {
    zcs_cu_device d = 0;
    check(driver().ctx_get_device(&d), "cuCtxGetDevice");
    char name[256] = {0};
    check(driver().device_get_name(name, static_cast<int>(sizeof name) - 1, d), "cuDeviceGetName");
    return name;
}

}  // namespace zcs_cu

#endif
