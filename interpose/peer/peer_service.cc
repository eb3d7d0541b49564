// The peer channel as a host service: the agent listens for other hosts'
// shims, but only when the job has a key (SHUNT_JOB_KEY): without one,
// nobody could be told apart from an attacker.
#include <unistd.h>

#include "interpose/core/log.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/agent.h"
#include "interpose/peer/channel.h"
#include "interpose/verbs/bundle.h"

namespace shunt::agent {

namespace {
using nlohmann::json;

json answer(const json& req) {
  const std::string cmd = req.value("cmd", "");
  if (cmd == "ping") {
    char host[256] = "unknown";
    gethostname(host, sizeof host - 1);
    return {{"pong", true}, {"host", host}, {"agent_pid", getpid()}, {"version", SHUNT_VERSION}};
  }
  if (cmd == "locate") {  // which process on this host owns a verbs QP
    int port = verbs::bundle_locate(req.value("gid", ""), req.value("qpn", 0u));
    if (port > 0) return {{"port", port}};
    return {{"retry", "no process here owns that QP (yet)"}};
  }
  return {{"error", "unknown peer command " + cmd}};
}

void start_peer_channel() {
  const Config& c = config();
  const std::string& key = c.str(Param::job_key);
  if (key.empty()) {
    log::info("peer channel: SHUNT_JOB_KEY is not set, not listening (shunt-run sets one)");
    return;
  }
  peer::start_listener(c.str(Param::peer_addr), static_cast<int>(c.num(Param::peer_port)),
                       peer::job_key_from(key), answer);
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
