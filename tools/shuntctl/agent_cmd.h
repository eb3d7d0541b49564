// shuntctl commands answered by the host agent over its control socket.
#pragma once
#include <ostream>
#include <string>

namespace shunt::ctl {

// Sends `cmd` to the agent and prints the answer (plain or --json).
// Returns the exit status: 0, 2 when no agent answers, 1 on a command error.
int agent_command(std::ostream& out, const std::string& cmd, bool json);

}  // namespace shunt::ctl
