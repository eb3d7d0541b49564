// The host agent's sockets service: it keeps the MPTCP endpoints of this
// network namespace so that every MPTCP connection gets a subflow on every
// rail (see docs/sockets.md for why these ones), and marks a rail's
// endpoint backup while the rail fails, so the kernel moves traffic off it
// at once; it restores it, damped, once the rail is healthy again.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::clocksync {
class ProbeEngine;
}

namespace shunt::sock {

// The service's parts, which the host agent registers (agent/services.cc):
// its start and stop, the "sockets" command's answer, and what it does
// with each member's report. `engine` returns the host's probe engine
// (nullptr when none runs); it is asked once, when the service starts
// (after the probe engine's).
struct RailService {
  std::function<void()> start, stop;
  std::function<nlohmann::json()> sockets;
  std::function<void(const std::string& pid, const nlohmann::json& report)> on_report;
};
RailService rail_service(std::function<clocksync::ProbeEngine*()> engine);

// Raises this network namespace's MPTCP limits to what the rails need,
// once per process, before its first MPTCP socket: a connection reads the
// limits when it is created, and one created before the host agent raised
// them (the agent starts on its own thread, often in the same process)
// never accepted the peer's announcement of its other rails (the fresh
// namespace's add_addr_accepted is 0) and ran on one rail for good. Cheap
// after the first call; does nothing without named rails.
void prepare_limits();

}  // namespace shunt::sock
