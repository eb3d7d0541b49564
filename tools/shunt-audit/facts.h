// What one host says about itself: software (kernel, RDMA provider modules,
// MPTCP, rdma-core, memlock, NCCL) and every RDMA port (state, speed,
// width, MTU, its IPv4 RoCEv2 GID and netdev, its counters). The shape is
// the "facts" object of the JSON report (docs/audit.md).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace audit {

// Where libshunt.so was preloaded when this process started (drop_preload() in main.cc).
extern std::string g_preloaded;

// One RDMA port as the back-end uses it: rail = index among the host's
// devices in name order (or in --devices order).
struct PortRef {
  std::string dev;
  int port = 1;
  int gid_index = -1;
  std::string ipv4;
  bool active = false;
};

nlohmann::json host_facts(const std::vector<std::string>& devices);
// Counters of every port: {"DEV/PORT": {name: value}}.
nlohmann::json port_counters(const std::vector<std::string>& devices);
// The ports of the rails, in rail order (the first port of each device).
std::vector<PortRef> rails(const nlohmann::json& facts);

}  // namespace audit
