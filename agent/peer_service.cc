// The peer channel as a host service: the agent listens for other hosts'
// shims, but only when the job has a key (SHUNT_JOB_KEY): without one,
// nobody could be told apart from an attacker.
#include <unistd.h>

#include "agent/agent.h"
#include "agent/diagnose_service.h"
#include "core/log.h"
#include "core/runtime.h"
#include "interpose/verbs/bundle.h"
#include "peer/channel.h"

namespace shunt::agent {

using nlohmann::json;

// The agent's answer to an authenticated peer's request (the channel's
// handler; also driven by the tests and the peer channel's fuzz target).
json peer_answer(const json& req) {
  auto field = [&](const char* k) -> const json& {
    static const json* none = new json;
    auto it = req.find(k);
    return req.is_object() && it != req.end() ? *it : *none;
  };
  const std::string cmd = field("cmd").is_string() ? field("cmd").get<std::string>() : "";
  if (cmd == "ping") {
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    return {{"pong", true}, {"host", host}, {"agent_pid", getpid()}, {"version", SHUNT_VERSION}};
  }
  if (cmd == "locate") {  // which process on this host owns a verbs QP
    const json &gid = field("gid"), &qpn = field("qpn");
    if (!gid.is_string() || !qpn.is_number_integer() || qpn.get<int64_t>() < 0 || qpn.get<int64_t>() > UINT32_MAX)
      return {{"error", "locate needs gid (a string) and qpn (a QP number)"}};
    int port = verbs::bundle_locate(gid.get<std::string>(), qpn.get<uint32_t>());
    if (port > 0) return {{"port", port}};
    return {{"retry", "no process here owns that QP (yet)"}};
  }
  if (cmd == "diagnose") return telemetry::diagnosis_now();  // shuntctl diagnose, job-wide
  return {{"error", "unknown peer command " + cmd}};
}

namespace {

void start_peer_channel() {
  const Config& c = config();
  const std::string& key = c.str(Param::job_key);
  if (key.empty()) {
    log::info("peer channel: SHUNT_JOB_KEY is not set, not listening (shunt-run sets one)");
    return;
  }
  peer::start_listener(c.str(Param::peer_addr), static_cast<int>(c.num(Param::peer_port)),
                       peer::job_key_from(key), peer_answer);
}
}  // namespace

void register_peer_service() {
  register_service({"peer-channel", start_peer_channel, peer::stop_listener});
  register_command("peer-channel", [](const json&) {
    auto c = peer::listener_counters();
    return json{{"accepted", c.accepted}, {"authenticated", c.authenticated}, {"dropped", c.dropped},
                {"requests", c.requests}};
  });
}

}  // namespace shunt::agent
