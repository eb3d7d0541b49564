#include "tools/shuntctl/agent_cmd.h"

#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/json_text.h"
#include "peer/control.h"

namespace shunt::ctl {

namespace {
using nlohmann::json;

void print_status(std::ostream& out, const json& a) {
  out << "agent pid " << a["agent_pid"] << ", shunt " << a["version"].get<std::string>() << ", up "
      << a["uptime_ms"].get<long>() / 1000 << " s, run dir " << a["run_dir"].get<std::string>() << "\n";
  out << std::left << std::setw(10) << "pid" << std::setw(10) << "mode" << std::setw(8) << "qps" << std::setw(10)
      << "sockets" << std::setw(10) << "state" << "last report\n";
  for (auto& m : a["members"]) {
    // gone: exited without a last report (killed, or the report was lost)
    const char* state = !m["exited"].get<bool>() ? "running" : m.value("lost", false) ? "gone" : "exited";
    out << std::setw(10) << m["pid"].get<long>() << std::setw(10) << m["mode"].get<std::string>() << std::setw(8)
        << m["qps"].get<long>() << std::setw(10) << m["sockets"].get<long>() << std::setw(10) << state
        << m["report_age_ms"].get<long>() << " ms ago\n";
  }
}

void print_peers(std::ostream& out, const json& a) {
  if (a.contains("probing") && a["probing"].is_object()) {
    const json& p = a["probing"];
    std::string rails;
    for (auto& r : p.value("rails", json::array())) rails += (rails.empty() ? "" : ",") + r.get<std::string>();
    out << "probe engine " << (p.value("running", false) ? "running" : "off") << ", rails "
        << (rails.empty() ? "none" : rails) << " (" << p.value("rails_from", "") << ")\n";
    if (!p.value("why_not", "").empty()) out << "  " << p.value("why_not", "") << "\n";
  }
  if (a["peers"].empty()) {
    out << "no probe peers yet (they come from the bundles' QPs and TCP peers, or SHUNT_PEERS)\n";
    return;
  }
  out << std::left << std::setw(16) << "peer" << std::setw(14) << "offset ns" << std::setw(12) << "bound ns"
      << std::setw(6) << "rail" << std::setw(7) << "state" << std::setw(14) << "fwd p50 ns" << "fwd loss\n";
  for (auto& p : a["peers"]) {
    for (auto& path : p["paths"])
      out << std::setw(16) << p["peer"].get<std::string>() << std::setw(14) << std::fixed << std::setprecision(0)
          << p["clock"]["offset_ns"].get<double>() << std::setw(12) << p["clock"]["bound_ns"].get<double>()
          << std::setw(6) << path["rail"].get<int>() << std::setw(7) << (path["alive"].get<bool>() ? "up" : "DOWN")
          << std::setw(14) << path["fwd_p50_ns"].get<double>() << std::setprecision(3)
          << path["fwd_loss"].get<double>() << "\n";
  }
}

// A field as text: strings bare, numbers as JSON, "-" for none.
std::string text(const json& o, const char* key) {
  auto it = o.find(key);
  if (it == o.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) return "-";
  return it->is_string() ? it->get<std::string>() : to_text(*it);
}

void print_members(std::ostream& out, const json& a) {
  const json& ms = a.contains("members") ? a["members"] : json::object();
  if (ms.empty()) {
    out << "no members\n";
    return;
  }
  out << std::left << std::setw(10) << "pid" << std::setw(10) << "mode" << std::setw(6) << "rank" << std::setw(6)
      << "qps" << std::setw(9) << "sockets" << std::setw(16) << "tx bytes" << std::setw(16) << "rx bytes"
      << "state\n";
  for (auto& [pid, m] : ms.items()) {
    uint64_t tx = 0, rx = 0;
    const json& socks = m.contains("sockets") && m["sockets"].is_array() ? m["sockets"] : json::array();
    for (auto& so : socks) tx += so.value("tx_bytes", uint64_t{0}), rx += so.value("rx_bytes", uint64_t{0});
    size_t qps = m.contains("verbs") && m["verbs"].contains("qps") ? m["verbs"]["qps"].size() : 0;
    out << std::setw(10) << pid << std::setw(10) << text(m, "mode") << std::setw(6) << text(m, "rank")
        << std::setw(6) << qps << std::setw(9) << socks.size() << std::setw(16) << tx << std::setw(16) << rx
        << (m.value("final", false) ? "exited" : "running") << "\n";
    for (auto& so : socks)
      out << "  fd " << std::setw(5) << text(so, "fd") << std::setw(8) << text(so, "role") << text(so, "local")
          << " -> " << text(so, "peer") << "  tx " << so.value("tx_bytes", uint64_t{0}) << " rx "
          << so.value("rx_bytes", uint64_t{0}) << (so.value("upgraded", false) ? "  mptcp" : "")
          << (so.value("open", false) ? "" : "  closed") << "\n";
  }
}

void print_sockets(std::ostream& out, const json& a) {
  out << "sockets mode " << text(a, "sockets_mode") << ", status " << text(a, "status") << ", "
      << text(a, "upgraded_in_agent_process") << " upgraded in the agent's process\n";
  if (a.contains("rails") && !a["rails"].empty()) {
    out << std::left << std::setw(6) << "rail" << std::setw(18) << "addr" << std::setw(10) << "endpoint"
        << std::setw(8) << "backup" << std::setw(10) << "failures" << "reason\n";
    for (auto& r : a["rails"])
      out << std::setw(6) << text(r, "rail") << std::setw(18) << text(r, "addr") << std::setw(10)
          << text(r, "endpoint_id") << std::setw(8) << (r.value("backup", false) ? "yes" : "no") << std::setw(10)
          << text(r, "failures") << text(r, "reason") << "\n";
  }
  if (a.contains("endpoints")) {
    out << "MPTCP endpoints:" << (a["endpoints"].empty() ? " none" : "") << "\n";
    for (auto& e : a["endpoints"])
      out << "  id " << text(e, "id") << " " << text(e, "addr") << (e.value("signal", false) ? " signal" : "")
          << (e.value("backup", false) ? " backup" : "") << "\n";
  }
  if (a.contains("limits"))
    out << "MPTCP limits: subflows " << text(a["limits"], "subflows") << ", add_addr_accepted "
        << text(a["limits"], "add_addr_accepted") << "\n";
  if (a.contains("missing") && !a["missing"].empty()) {
    out << "missing; these commands would fix it:\n";
    for (auto& m : a["missing"]) out << "  " << (m.is_string() ? m.get<std::string>() : to_text(m)) << "\n";
  }
}

// Sends `req` to the agent: its answer, or nullopt with *rc set and the
// reason on stderr.
}  // namespace

std::optional<json> ask_agent(const json& req, int* rc) {
  const char* rd = getenv("SHUNT_RUN_DIR");
  std::string refused;
  std::string dir = peer::agent_dir(rd ? rd : "", &refused);
  std::string err;
  auto ans = peer::request(dir + "/agent.sock", req, 3000, &err);
  if (!ans) {
    std::cerr << "shuntctl: " << err << " (is a shunt job running on this host? SHUNT_RUN_DIR=" << dir << ")\n";
    if (!refused.empty()) std::cerr << "shuntctl: " << refused << "\n";
    *rc = 2;
    return std::nullopt;
  }
  if (ans->contains("error")) {
    std::cerr << "shuntctl: " << (*ans)["error"].get<std::string>() << "\n";
    *rc = 1;
    return std::nullopt;
  }
  return ans;
}

namespace {
// Why each process in mode off turned shunt off, from its own report.
void print_off_reasons(std::ostream& out, const json& status) {
  bool any = false;
  for (auto& m : status["members"]) any |= m.value("mode", "") == "off";
  int rc = 0;
  auto all = any ? ask_agent({{"cmd", "members"}}, &rc) : std::nullopt;
  if (!all || !all->contains("members") || !(*all)["members"].is_object()) return;
  for (auto& [pid, m] : (*all)["members"].items())
    if (m.value("mode", "") == "off" && !m.value("off_reason", "").empty())
      out << "pid " << pid << ": shunt is off: " << m.value("off_reason", "") << "\n";
}
}  // namespace

int agent_command(std::ostream& out, const std::string& cmd, bool as_json) {
  int rc = 0;
  auto ans = ask_agent({{"cmd", cmd}}, &rc);
  if (!ans) return rc;
  if (as_json) out << to_text(*ans, 2) << "\n";
  else if (cmd == "status") {
    print_status(out, *ans);
    print_off_reasons(out, *ans);
  }
  else if (cmd == "peers") print_peers(out, *ans);
  else if (cmd == "members") print_members(out, *ans);
  else if (cmd == "sockets") print_sockets(out, *ans);
  else out << to_text(*ans, 2) << "\n";
  return 0;
}

int probing_command(std::ostream& out, const ProbingArgs& a, bool as_json) {
  json req = {{"cmd", "probing"}};
  if (a.resume) {
    req["resume"] = true;
  } else if (a.pause_ms > 0) {
    req["pause_ms"] = a.pause_ms;
    if (a.at_unix_ms > 0) req["at_unix_ms"] = a.at_unix_ms;
    if (a.count > 1) req["count"] = a.count, req["every_ms"] = a.every_ms;
  }
  int rc = 0;
  auto ans = ask_agent(req, &rc);
  if (!ans) return rc;
  const json& p = (*ans)["pause"];
  if (as_json) out << to_text(*ans, 2) << "\n";
  else if (p.is_null()) out << "probing: no pause\n";
  else
    out << "probing paused from " << p["from_unix_ms"].get<int64_t>() << " to " << p["until_unix_ms"].get<int64_t>()
        << " (unix ms)"
        << (p["count"].get<int>() > 1 ? ", " + std::to_string(p["count"].get<int>()) + " times every " +
                                            std::to_string(p["every_ms"].get<int64_t>()) + " ms"
                                      : std::string())
        << "; no path judged from " << p["margin_ms"].get<int64_t>() << " ms before to "
        << p["margin_ms"].get<int64_t>() << " ms after a pause\n";
  return 0;
}

}  // namespace shunt::ctl
