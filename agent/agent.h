// The host agent. Every shunt process that uses verbs or TCP starts one
// small thread ("shunt-agent") on first use. The first to take the lock file
// in the run directory becomes the host's agent: it serves the control
// socket (agent.sock) and runs the host's services (the probe engine, the
// metrics endpoint); the others send it their counters every
// SHUNT_REPORT_INTERVAL_MS and at exit, and keep trying the lock, so one of
// them takes over within a second when the agent exits.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::agent {

// Starts this process's agent thread if the mode and SHUNT_AGENT allow it;
// cheap and idempotent, called from the verbs and socket entry points.
void ensure_started();
bool is_host_agent();
// socket_path(), the control socket in force: peer/agent_socket.h

// A command the host agent serves on its control socket. The handler runs
// on the agent thread: keep it short; what it throws is the request's
// error. Register before ensure_started(). The socket serves the agent's
// user and root only (its directory and the socket are theirs alone, and
// each client's uid is checked); a control command, one that changes what
// the agent does, is refused to any other uid all the same.
using Handler = std::function<nlohmann::json(const nlohmann::json& request)>;
enum class Access { read, control };
void register_command(const std::string& name, Handler h, Access access = Access::read);

// A host service: started on the thread that becomes the agent, stopped
// when the process exits. Register before ensure_started().
struct Service {
  std::string name;
  std::function<void()> start, stop;
};
void register_service(Service s);

// What the agent knows of every process on the host: pid -> its latest
// report (telemetry::stats_json() plus "reported_ms"); the agent's own is
// taken now (at most once per report interval). Agent thread only.
const nlohmann::json& members();
// The same without taking the agent's own snapshot: the other processes'
// latest reports (and the agent's own as last taken, if ever). Agent thread only.
const nlohmann::json& members_as_reported();
// Exited processes whose reports members() let go (it keeps the last 256
// exited). Agent thread only.
uint64_t exited_dropped();
// Their counters, summed per job and rank (telemetry::fold_exited), so the
// metrics' counters never go backwards when a report is let go. Agent thread only.
const nlohmann::json& retired();

// Called on the agent thread each time a process's report has been stored
// in members(), with its pid and that report; for the agent's own process,
// every report interval, with its sockets alone (no "verbs").
// Keep it short. Register before ensure_started().
using ReportListener = std::function<void(const std::string& pid, const nlohmann::json& report)>;
void on_report(ReportListener l);

// Unit tests: the answer line (with its newline) that the control socket
// gives `line` from a client of `uid`, on this process's agent state; and
// a report stored as the agent stores its own (unchecked).
std::string control_answer_for_test(const std::string& line, unsigned uid);
void store_report_for_test(const std::string& pid, nlohmann::json report);

}  // namespace shunt::agent
