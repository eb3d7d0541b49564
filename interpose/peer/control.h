// The host agent's control protocol: newline-delimited JSON over a Unix
// stream socket. A request is one object with "cmd"; the answer is one
// object, with "error" set when the command failed. Used by the agent, by
// every shunt process to report, and by shuntctl.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace shunt::peer {

// Lines longer than this are a protocol error (the connection is dropped).
constexpr size_t kMaxLine = 8 << 20;

// Connects to the socket at `path`, sends `req`, returns the answer, or
// nullopt with `err` set (no agent, timeout, malformed answer).
std::optional<nlohmann::json> request(const std::string& path, const nlohmann::json& req,
                                      int timeout_ms, std::string* err);

// Reads one line (without the newline) from a blocking fd with a deadline.
bool read_line(int fd, std::string* line, int timeout_ms);
bool write_all(int fd, const std::string& data, int timeout_ms);

// The run directory in force (SHUNT_RUN_DIR, else /run/shunt when usable,
// else /tmp/shunt-UID); created if missing. Empty on failure.
std::string run_dir(const std::string& configured);

// Where a reader (shuntctl) finds the agent's socket: SHUNT_RUN_DIR as
// given, else /run/shunt where an agent listens there or the caller could
// have made one, else /tmp/shunt-UID. Nothing is created and the directory
// need not be writable: the socket is open to every user.
std::string agent_dir(const std::string& configured);

}  // namespace shunt::peer
