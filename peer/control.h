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
// An answer (members, telemetry: every process's report) may be this long;
// the agent takes shorter requests (ControlServer::kMaxRequestLine).
constexpr size_t kMaxLine = 8 << 20;

// Connects to the socket at `path`, sends `req`, returns the answer, or
// nullopt with `err` set (no agent, timeout, malformed answer).
std::optional<nlohmann::json> request(const std::string& path, const nlohmann::json& req,
                                      int timeout_ms, std::string* err);

// Reads one line (without the newline) from a blocking fd with a deadline.
bool read_line(int fd, std::string* line, int timeout_ms);
bool write_all(int fd, const std::string& data, int timeout_ms);

// Whether `dir` is this user's alone: a directory (not a symbolic link)
// owned by the effective uid that neither its group nor others may write.
// Else false, with `why` saying what is wrong ("owned by uid 65534").
bool private_dir(const std::string& dir, std::string* why);

// The run directory in force, created (0700) if missing: SHUNT_RUN_DIR,
// else /run/shunt where it is this user's (root's, as a rule), else
// /tmp/shunt-UID. One that is not private_dir() (another user made it, or
// may write it) is refused, with a line in `refused`, and
// $XDG_RUNTIME_DIR/shunt is used instead where XDG_RUNTIME_DIR is private.
// Every process of the user decides alike, so they meet in the same one.
// Empty when none is usable.
std::string run_dir(const std::string& configured, std::string* refused = nullptr);

// Where a reader (shuntctl) finds the agent's socket: the directory that
// run_dir() decides on, nothing created. Where none is usable, the first
// candidate (for the reader's message); `refused` as in run_dir().
std::string agent_dir(const std::string& configured, std::string* refused = nullptr);

}  // namespace shunt::peer
