// The host agent's sockets service: it keeps the MPTCP endpoints of this
// network namespace so that every MPTCP connection gets a subflow on every
// rail (see docs/sockets.md for why these ones), and marks a rail's
// endpoint backup while the rail fails, so the kernel moves traffic off it
// at once; it restores it, damped, once the rail is healthy again.
#pragma once
#include <functional>

#include "interpose/peer/agent.h"

namespace shunt::clocksync {
class ProbeEngine;
}

namespace shunt::sock {

// `engine` returns the host's probe engine (nullptr when none runs); it is
// asked once, when the service starts (after the probe engine's).
agent::Service rail_service(std::function<clocksync::ProbeEngine*()> engine);

}  // namespace shunt::sock
