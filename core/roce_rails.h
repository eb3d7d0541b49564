// The host's rails when nobody names them: the IPv4 addresses of the netdevs
// behind its active RoCE ports, from each device's GID table. A management, loopback or
// container interface has no RoCE GID, so it is never one. The probe
// engine's rails (SHUNT_PROBE_ADDRS) and the sockets' (SHUNT_SOCKET_RAILS)
// default to these; a variable that names rails wins, and `none` names none.
#pragma once
#include <string>
#include <vector>

#include "core/config.h"

namespace shunt {

struct RoceRail {
  std::string device;  // the RDMA device (rxe0, mlx5_1)
  int port = 1;
  std::string netdev;  // gid_attrs/ndevs of its IPv4 GID
  std::string ip;
};

// Every netdev behind an ACTIVE port with a RoCE (v1 or v2) IPv4-mapped GID
// under `root` (/sys/class/infiniband), once, with the address of its first
// such GID; in rail order: device name (mlx5_2 before mlx5_10), then port.
// *devices (when given) is how many RDMA devices `root` lists at all. The
// real root is read through the verbs API (ibv_query_gid_table), any other
// (a test's tree), and every device when the API fails for one, from sysfs; an
// answer is reused for 2 s.
std::vector<RoceRail> roce_rails(const std::string& root, int* devices = nullptr);

// Where a process's rails come from.
enum class RailsFrom {
  named,       // SHUNT_PROBE_ADDRS lists them
  none,        // SHUNT_PROBE_ADDRS=none: default discovery off
  roce_ports,  // found behind the RoCE ports (roce_rails)
};
struct ProbeRails {
  std::vector<std::string> addrs;
  RailsFrom from = RailsFrom::named;
  int devices = 0;  // RDMA devices seen, when discovered
};
// The probe engine's rails: SHUNT_PROBE_ADDRS when set, else those of the
// RoCE ports under SHUNT_TEST_IB_SYSFS (normally /sys/class/infiniband).
ProbeRails probe_rails(const Config& c);
// "SHUNT_PROBE_ADDRS", "none (SHUNT_PROBE_ADDRS=none)" or "RoCE ports": for
// shuntctl and the logs.
const char* rails_from_text(RailsFrom f);

// What the host agent does about probing, and the one line that says why
// when it does not probe: rails but no key, or no rails at all.
struct ProbePlan {
  bool start = false;
  LogLevel level = LogLevel::info;  // of `message`
  std::string message;              // empty: nothing to say
};
ProbePlan probe_plan(const ProbeRails& rails, bool have_key);

}  // namespace shunt
