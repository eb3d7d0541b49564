// The host agent's telemetry: the /metrics endpoint, the metrics textfile,
// the "telemetry" control command (what shuntctl paths/top/events read) and
// path up/down events from the probe engine.
#pragma once
#include <functional>
#include <string>

namespace shunt::clocksync {
class ProbeEngine;
}

namespace shunt::telemetry {

// Registers the service and the command; `engine` returns the host's probe
// engine (null when none). Called once from the agent's builtin services,
// after the probe engine's own registration so it starts after it.
void register_agent_services(std::function<clocksync::ProbeEngine*()> engine);

// "HOST:PORT" (an IPv4 literal or a host name), "[IPV6]:PORT" or ":PORT"
// (every address: host empty) -> host and port; false when malformed.
bool parse_listen_addr(const std::string& text, std::string* host, int* port);

}  // namespace shunt::telemetry
