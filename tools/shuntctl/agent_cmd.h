// shuntctl commands answered by the host agent over its control socket.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <string>

namespace shunt::ctl {

// Sends `req` to this host's agent: its answer, or nullopt with *rc set
// (2: no agent answered, 1: it answered an error) and the reason on stderr.
std::optional<nlohmann::json> ask_agent(const nlohmann::json& req, int* rc);

// Sends `cmd` to the agent and prints the answer (plain or --json).
// Returns the exit status: 0, 2 when no agent answers, 1 on a command error.
int agent_command(std::ostream& out, const std::string& cmd, bool json);

// `shuntctl probing`: pauses the host's probe engine for pause_ms (> 0)
// from at_unix_ms (0: now), `count` times `every_ms` apart; ends the pauses
// (resume); or shows the schedule in force. Same exit statuses.
struct ProbingArgs {
  int pause_ms = 0;
  int64_t at_unix_ms = 0;
  int64_t every_ms = 0;
  int count = 1;
  bool resume = false;
};
int probing_command(std::ostream& out, const ProbingArgs& a, bool json);

}  // namespace shunt::ctl
