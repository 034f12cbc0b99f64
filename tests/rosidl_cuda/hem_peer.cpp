// hem_peer: the host endpoint registry of ROS 2's CUDA buffer backend, run as a peer of
// our tests. It links that backend's own `host_endpoint_manager.cpp` (package
// `cuda_buffer`, built from its released sources by scripts/cuda-buffer-core.sh) and
// drives it as the backend's rmw plugin does, one command per line on stdin, one answer
// per line on stdout:
//
//   register pub|sub <gid> <name>  -> "ok" or "failed"   (register_publisher / _subscription)
//   many pub|sub <gid> <n>         -> "ok <registered>"  (n GIDs from <gid>, its last four
//                                                        bytes counted up big-endian)
//   ipc 0|1                        -> "ok"                (set_ipc_capable)
//   query <gid>                    -> "found=0", or "found=1 locality=L kind=K instance=I
//                                     device=D uid=U ipc=0|1 cuda=0|1"
//   self                           -> "device=D uid=U"
//   exit (or end of input)         -> the process exits, destroying the registry handle
//
// <gid> is 32 hex digits. `query` first re-reads the shared registry
// (refresh_from_remote), as the plugin does before it decides. `cuda` is the plugin's
// decision for a discovered endpoint that lists the cuda backend: found and
// IPC-capable, and then either in this process or in another process of the host with
// the same device ordinal and uid (cuda_buffer_backend_plugin.cpp, on_discovering_endpoint,
// lines 109-120 in 0.1.1 and 0.1.2; the pool check before it, line 96, needs a GPU and is
// left out here). Without a GPU, CUDA_BUFFER_DEVICE_ID_OVERRIDE (read by the registry's
// constructor) gives this process a device ordinal.
//
// Usage: hem_peer <domain id>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <sstream>
#include <string>

#include "cuda_buffer/host_endpoint_manager.hpp"

namespace hem = host_endpoint_manager;

namespace
{

bool parse_gid(const std::string & hex, rmw_gid_t & gid)
{
  if (hex.size() != 2 * RMW_GID_STORAGE_SIZE) {
    return false;
  }
  gid.implementation_identifier = "";
  for (size_t i = 0; i < RMW_GID_STORAGE_SIZE; ++i) {
    char * end = nullptr;
    const std::string byte = hex.substr(2 * i, 2);
    const unsigned long v = std::strtoul(byte.c_str(), &end, 16);
    if (end != byte.c_str() + 2) {
      return false;
    }
    gid.data[i] = static_cast<uint8_t>(v);
  }
  return true;
}

void count_up(rmw_gid_t & gid, uint32_t by)
{
  const size_t at = RMW_GID_STORAGE_SIZE - 4;
  uint32_t v = 0;
  for (size_t i = 0; i < 4; ++i) {
    v = (v << 8) | gid.data[at + i];
  }
  v += by;
  for (size_t i = 0; i < 4; ++i) {
    gid.data[at + 3 - i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

bool plugin_decision(const hem::HostEndpointManager & m, const hem::LocalityInfo & info)
{
  if (!info.found || !info.ipc_capable) {
    return false;
  }
  if (info.locality == hem::EndpointLocality::INTRA_PROCESS) {
    return true;
  }
  return info.locality == hem::EndpointLocality::INTER_PROCESS_SAME_HOST &&
         info.device_id == m.get_device_id() && info.uid == m.get_uid();
}

std::string answer(hem::HostEndpointManager & m, const std::string & line)
{
  std::istringstream in(line);
  std::string cmd, a, b;
  in >> cmd >> a >> b;
  rmw_gid_t gid;
  if (cmd == "register" && (a == "pub" || a == "sub")) {
    std::string hex = b, name;
    in >> name;
    if (!parse_gid(hex, gid)) {
      return "error: bad gid";
    }
    const bool ok = a == "pub" ? m.register_publisher(gid, name.c_str()) :
      m.register_subscription(gid, name.c_str());
    return ok ? "ok" : "failed";
  }
  if (cmd == "many" && (a == "pub" || a == "sub")) {
    uint32_t n = 0;
    in >> n;
    if (!parse_gid(b, gid)) {
      return "error: bad gid";
    }
    uint32_t registered = 0;
    for (uint32_t i = 0; i < n; ++i) {
      rmw_gid_t g = gid;
      count_up(g, i);
      registered += a == "pub" ? m.register_publisher(g, "many") : m.register_subscription(g, "many");
    }
    return "ok " + std::to_string(registered);
  }
  if (cmd == "ipc" && (a == "0" || a == "1")) {
    m.set_ipc_capable(a == "1");
    return "ok";
  }
  if (cmd == "query") {
    if (!parse_gid(a, gid)) {
      return "error: bad gid";
    }
    m.refresh_from_remote();
    const hem::LocalityInfo info = m.query_endpoint_locality(gid);
    if (!info.found) {
      return "found=0";
    }
    std::ostringstream out;
    out << "found=1 locality=" << static_cast<int>(info.locality) << " kind=" <<
      static_cast<int>(info.entity_type) << " instance=" << info.remote_instance_id <<
      " device=" << info.device_id << " uid=" << info.uid << " ipc=" << info.ipc_capable <<
      " cuda=" << plugin_decision(m, info);
    return out.str();
  }
  if (cmd == "self") {
    return "device=" + std::to_string(m.get_device_id()) + " uid=" + std::to_string(m.get_uid());
  }
  return "error: unknown command: " + line;
}

}  // namespace

int main(int argc, char ** argv)
{
  if (argc != 2) {
    std::fprintf(stderr, "usage: hem_peer <domain id>\n");
    return 2;
  }
  try {
    auto m = hem::HostEndpointManager::get_instance(std::strtoull(argv[1], nullptr, 10));
    std::cout << "ready" << std::endl;
    std::string line;
    while (std::getline(std::cin, line) && line != "exit") {
      std::cout << answer(*m, line) << std::endl;
    }
  } catch (const std::exception & e) {
    std::fprintf(stderr, "hem_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
