// core_peer: a publisher and a subscriber of ROS 2's CUDA buffer backend, run as a peer
// of our GPU tests. It links that backend's own core library (package `cuda_buffer`,
// built from its released sources by scripts/cuda-buffer-core.sh): buffers come from its
// VMM pool, their writes are ordered by its write event, their FDs are served and
// imported by its IPC manager, and the reuse of its blocks follows its shared counts.
// What its rmw plugin adds (the descriptor's fields on publishing, their use on taking:
// cuda_buffer_backend_plugin.cpp 0.1.1 / 0.1.2, lines 152-211 and 225-288) is done here
// in the same order, since the plugin itself needs ROS. One command per line on stdin,
// one answer per line on stdout:
//
//   publish <bytes> <seed> <delay ms>
//       a buffer of the pool, filled on a stream of ours with our tests' pattern for
//       <seed> after that stream has slept <delay ms> (a host function on the stream:
//       the write is slow, and only its event says when it is done); answers
//       "descriptor size=S device=D pid=P block=B block_size=BS socket=PATH uid=U
//       type=T event=<128 hex digits>"; the buffer stays held
//   consume size=S device=D pid=P block=B block_size=BS socket=PATH uid=U type=T
//           event=<hex> seed=N
//       a descriptor of another process's block, taken as the plugin takes one
//       (from_descriptor_with_endpoint, lines 225-288: the IPC manager's import, the
//       event opened, a buffer whose deleter gives the shared count back), then read as
//       an application reads it: first copied out on a stream that does not wait (the
//       negative control), then through a read handle (its stream waits on the event)
//       and checked against the pattern for N; the buffer is then let go. Answers
//       "consumed bad=B early_bad=E" (bytes that differ from the pattern)
//   count <block>   -> "count=N": the block's shared count, as the pool reads it
//   drop            -> "ok": every held buffer given back to the pool (as a published
//                      message's buffer is, once rmw is done with it)
//   alloc <bytes>   -> "block=B": the block the pool hands out for a new buffer now
//                      (held until the next drop)
//   exit (or end of input) -> the process exits; the pool's destructor waits until no
//                      reader holds one of its blocks
//
// Usage: core_peer <CUDA device ordinal>

#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "cuda_buffer/cuda_buffer_api.hpp"
#include "cuda_buffer/cuda_buffer_ipc_manager.hpp"
#include "cuda_buffer/cuda_memory_pool.hpp"

namespace cbb = cuda_buffer_backend;

namespace
{

// zcs_memory::cuda::kernels::pattern_byte.
uint8_t pattern_byte(uint64_t i, uint64_t seed)
{
  const uint32_t x = static_cast<uint32_t>(i) ^ (static_cast<uint32_t>(i >> 32) * 0x27d4eb2fu);
  const uint32_t h = x * 0x9e3779b1u + static_cast<uint32_t>(seed) * 0x85ebca77u;
  return static_cast<uint8_t>((h >> 24) ^ x);
}

void check(cudaError_t e, const char * what)
{
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorName(e));
  }
}

void CUDART_CB sleep_on_stream(void * ms)
{
  std::this_thread::sleep_for(std::chrono::milliseconds(*static_cast<int *>(ms)));
}

struct Peer
{
  cudaStream_t stream{nullptr};
  std::vector<std::unique_ptr<int>> delays;  // read by host functions still queued
  std::vector<rosidl::Buffer<uint8_t>> held;
  std::vector<uint8_t *> staging;
  std::map<uint32_t, cbb::VmmBlock *> blocks;

  cbb::VmmBlock * block_of(rosidl::Buffer<uint8_t> & buf)
  {
    auto * impl = cbb::detail::cuda_impl_of(buf);
    auto pool = cbb::CudaBufferImpl<uint8_t>::get_or_create_global_pool();
    const auto va = reinterpret_cast<CUdeviceptr>(impl->get_cuda_buffer().get_device_ptr());
    cbb::VmmBlock * block = pool->find_block_for_va(va);
    if (block == nullptr) {
      throw std::runtime_error("the buffer is in no block of the pool");
    }
    blocks[block->block_id] = block;
    return block;
  }

  std::string publish(size_t n, uint64_t seed, int delay)
  {
    uint8_t * host = nullptr;
    check(cudaMallocHost(&host, n), "cudaMallocHost");
    staging.push_back(host);
    for (size_t i = 0; i < n; ++i) {
      host[i] = pattern_byte(i, seed);
    }
    rosidl::Buffer<uint8_t> buf = cbb::allocate_buffer(n);
    {
      cbb::WriteHandle wh = cbb::from_output_buffer(buf, stream);
      delays.push_back(std::make_unique<int>(delay));
      check(cudaLaunchHostFunc(stream, sleep_on_stream, delays.back().get()), "cudaLaunchHostFunc");
      cbb::to_buffer(host, n, wh, stream, cudaMemcpyHostToDevice);
    }  // the handle records the buffer's write event on `stream`

    // The plugin's steps (plugin.cpp:152-211).
    auto pool = cbb::CudaBufferImpl<uint8_t>::get_or_create_global_pool();
    if (!pool || !pool->is_ipc_capable()) {
      throw std::runtime_error("the pool cannot export (the plugin would send the CPU form)");
    }
    auto * impl = cbb::detail::cuda_impl_of(buf);
    cbb::VmmBlock * block = block_of(buf);
    if (block->exported_fd < 0) {
      throw std::runtime_error("the block has no exported FD");
    }
    const std::string socket = pool->register_block_for_ipc(block);
    if (socket.empty()) {
      throw std::runtime_error("the block's socket could not be served");
    }
    const uint64_t uid = pool->assign_uid(block);
    impl->get_cuda_buffer().finalize_write_handle();
    cudaIpcEventHandle_t event{};
    if (cudaEvent_t ev = impl->get_cuda_buffer().get_write_event()) {
      check(cudaIpcGetEventHandle(&event, ev), "cudaIpcGetEventHandle");
    }
    std::ostringstream out;
    out << "descriptor size=" << impl->size() << " device=" << impl->get_device_id() << " pid=" << getpid() <<
      " block=" << block->block_id << " block_size=" << block->size << " socket=" << socket <<
      " uid=" << uid << " type=" << typeid(uint8_t).name() << " event=";
    const auto * e = reinterpret_cast<const uint8_t *>(&event);
    for (size_t i = 0; i < sizeof(event); ++i) {
      char hex[3];
      std::snprintf(hex, sizeof(hex), "%02x", e[i]);
      out << hex;
    }
    held.push_back(std::move(buf));
    return out.str();
  }

  std::string consume(std::istringstream & in)
  {
    std::map<std::string, std::string> f;
    std::string kv;
    while (in >> kv) {
      const auto eq = kv.find('=');
      if (eq == std::string::npos) {
        throw std::runtime_error("not key=value: " + kv);
      }
      f[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    for (const char * k : {"size", "device", "pid", "block", "block_size", "socket", "uid", "type", "event", "seed"}) {
      if (f.count(k) == 0) {
        throw std::runtime_error(std::string("no ") + k);
      }
    }
    const size_t n = std::stoull(f["size"]);
    const uint64_t seed = std::stoull(f["seed"]);
    // The plugin's checks and import (plugin.cpp:225-258).
    int local_device = 0;
    check(cudaGetDevice(&local_device), "cudaGetDevice");
    if (f["type"] != typeid(uint8_t).name()) {
      throw std::runtime_error("element type " + f["type"]);
    }
    if (std::stoi(f["device"]) != local_device) {
      throw std::runtime_error("cross-device IPC is not implemented (by the plugin)");
    }
    auto imported = cbb::CudaVmmIPCManager::import_block(
      f["socket"], std::stoi(f["pid"]), static_cast<uint32_t>(std::stoul(f["block"])),
      std::stoull(f["block_size"]), std::stoull(f["uid"]));
    cbb::IPCMetadata * meta = imported.ipc_meta;
    cbb::CudaBuffer buffer(
      reinterpret_cast<void *>(imported.va), n, local_device,
      [meta](uint8_t *) {
        if (meta) {
          meta->refcount.fetch_sub(1, std::memory_order_release);
        }
      });
    // The event (plugin.cpp:260-282).
    const std::string & hex = f["event"];
    cudaIpcEventHandle_t handle{};
    auto * h = reinterpret_cast<uint8_t *>(&handle);
    bool has_event = false;
    for (size_t i = 0; i < sizeof(handle) && 2 * i + 1 < hex.size(); ++i) {
      h[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
      has_event = has_event || h[i] != 0;
    }
    if (has_event) {
      cudaEvent_t ev = nullptr;
      check(cudaIpcOpenEventHandle(&ev, handle), "cudaIpcOpenEventHandle");
      buffer.set_write_event(ev, true);
    }
    rosidl::Buffer<uint8_t> msg(std::make_unique<cbb::CudaBufferImpl<uint8_t>>(std::move(buffer), n));

    uint8_t * host = nullptr;
    check(cudaMallocHost(&host, n), "cudaMallocHost");
    auto mismatches = [&] {
        size_t bad = 0;
        for (size_t i = 0; i < n; ++i) {
          bad += host[i] != pattern_byte(i, seed);
        }
        return bad;
      };
    // Negative control: no wait on the writer's event.
    cudaStream_t early = nullptr;
    check(cudaStreamCreateWithFlags(&early, cudaStreamNonBlocking), "cudaStreamCreate");
    auto * impl = cbb::detail::cuda_impl_of(msg);
    check(cudaMemcpyAsync(host, impl->get_cuda_buffer().get_device_ptr(), n, cudaMemcpyDeviceToHost, early),
      "cudaMemcpyAsync");
    check(cudaStreamSynchronize(early), "cudaStreamSynchronize");
    const size_t early_bad = mismatches();
    cudaStreamDestroy(early);
    size_t bad = 0;
    {
      cbb::ReadHandle rh = cbb::from_input_buffer(msg, stream);
      check(cudaMemcpyAsync(host, rh.get_ptr(), n, cudaMemcpyDeviceToHost, stream), "cudaMemcpyAsync");
    }
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    bad = mismatches();
    cudaFreeHost(host);
    return "consumed bad=" + std::to_string(bad) + " early_bad=" + std::to_string(early_bad);
  }

  std::string answer(const std::string & line)
  {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "publish") {
      size_t n = 0;
      uint64_t seed = 0;
      int delay = 0;
      in >> n >> seed >> delay;
      return publish(n, seed, delay);
    }
    if (cmd == "consume") {
      return consume(in);
    }
    if (cmd == "count") {
      uint32_t id = 0;
      in >> id;
      auto it = blocks.find(id);
      if (it == blocks.end() || it->second->ipc_meta == nullptr) {
        return "error: no shared count for block " + std::to_string(id);
      }
      return "count=" + std::to_string(it->second->ipc_meta->refcount.load());
    }
    if (cmd == "drop") {
      check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
      held.clear();
      return "ok";
    }
    if (cmd == "alloc") {
      size_t n = 0;
      in >> n;
      rosidl::Buffer<uint8_t> buf = cbb::allocate_buffer(n);
      const uint32_t id = block_of(buf)->block_id;
      held.push_back(std::move(buf));
      return "block=" + std::to_string(id);
    }
    return "error: unknown command: " + line;
  }
};

}  // namespace

int main(int argc, char ** argv)
{
  if (argc != 2) {
    std::fprintf(stderr, "usage: core_peer <CUDA device ordinal>\n");
    return 2;
  }
  try {
    check(cudaSetDevice(std::atoi(argv[1])), "cudaSetDevice");
    Peer peer;
    check(cudaStreamCreateWithFlags(&peer.stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const bool ipc = cbb::CudaBufferImpl<uint8_t>::is_pool_ipc_capable();
    std::cout << "ready pid=" << getpid() << " ipc=" << ipc << std::endl;
    std::string line;
    while (std::getline(std::cin, line) && line != "exit") {
      std::string reply;
      try {
        reply = peer.answer(line);
      } catch (const std::exception & e) {
        reply = std::string("error: ") + e.what();
      }
      std::cout << reply << std::endl;
    }
    check(cudaStreamSynchronize(peer.stream), "cudaStreamSynchronize");
    peer.held.clear();
    for (uint8_t * p : peer.staging) {
      cudaFreeHost(p);
    }
  } catch (const std::exception & e) {
    std::fprintf(stderr, "core_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
