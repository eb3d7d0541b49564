// Automatic probe peers: the hosts this host's processes talk to. Every
// process reports its TCP sockets to the host agent (members(), "sockets":
// [{"peer": "IP:PORT"}]); a remote address on one of this host's probe
// subnets (SHUNT_PROBE_ADDRS) becomes a probed peer on that rail, named after
// the address. The other end does the same with ours, so both sides name
// each other by address and agree; a host also listed in SHUNT_PEERS merges
// by address and keeps its real name (ProbeEngine::add_peer).
//
// The scan runs on the agent thread as each report is stored (on_report),
// over that report alone, and only where it lists sockets: a job of verbs
// alone costs nothing. (A timer thread asked the agent's control socket for
// a scan of every member twice a second: a connection, a request and a walk
// of every report's JSON, twice a second, on a one-CPU guest's job.)
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <functional>
#include <set>
#include <string>

#include "agent/agent.h"
#include "clocksync/engine.h"
#include "core/log.h"

namespace shunt::agent {

namespace {
using nlohmann::json;

struct Rail {
  uint32_t addr = 0, mask = 0;  // network byte order
};

std::vector<Rail> probe_rails(const clocksync::EngineConfig& c, std::set<uint32_t>* own) {
  std::vector<Rail> rails(c.local_addrs.size());
  for (size_t i = 0; i < rails.size(); i++) inet_pton(AF_INET, c.local_addrs[i].c_str(), &rails[i].addr);
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return rails;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    uint32_t a = reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr;
    own->insert(a);
    for (auto& r : rails)
      if (r.addr == a && i->ifa_netmask) r.mask = reinterpret_cast<sockaddr_in*>(i->ifa_netmask)->sin_addr.s_addr;
  }
  freeifaddrs(ifs);
  return rails;
}

struct AutoPeers {
  std::function<clocksync::ProbeEngine*()> engine;
  std::set<std::string> added;  // agent thread only
};
AutoPeers& ap() {
  static AutoPeers* a = new AutoPeers;
  return *a;
}

// Agent thread: adds every TCP peer of one report that is on a probe subnet
// and not added yet.
void add_peers_of(const json& report) {
  auto it = report.find("sockets");
  if (it == report.end() || !it->is_array() || it->empty()) return;
  clocksync::ProbeEngine* e = ap().engine ? ap().engine() : nullptr;
  if (!e) return;
  std::set<uint32_t> own;
  std::vector<Rail> rails;
  for (auto& s : *it) {
    if (!s.is_object() || !s.contains("peer") || !s["peer"].is_string()) continue;
    std::string hp = s["peer"];
    auto colon = hp.rfind(':');
    if (colon == std::string::npos) continue;
    std::string ip = hp.substr(0, colon);
    in_addr a{};
    if (inet_pton(AF_INET, ip.c_str(), &a) != 1 || ap().added.count(ip)) continue;
    if (rails.empty()) rails = probe_rails(e->config(), &own);  // the interfaces, once a report has a candidate
    if (own.count(a.s_addr)) continue;
    for (size_t r = 0; r < rails.size(); r++) {
      if (!rails[r].mask || (a.s_addr & rails[r].mask) != (rails[r].addr & rails[r].mask)) continue;
      clocksync::PeerSpec spec;
      spec.name = ip;
      spec.by_address = true;
      spec.addrs.assign(r + 1, "");
      spec.addrs[r] = ip;
      e->add_peer(spec);
      ap().added.insert(ip);
      log::info("probe engine: peer {} on rail {} from a connection", ip, r);
      break;
    }
  }
}
}  // namespace

void register_auto_peers(std::function<clocksync::ProbeEngine*()> engine) {
  ap().engine = std::move(engine);
  on_report([](const std::string&, const json& report) { add_peers_of(report); });
}

}  // namespace shunt::agent
