// Automatic probe peers: the hosts this host's processes talk to. Every
// process reports its TCP sockets to the host agent (members(), "sockets":
// [{"peer": "IP:PORT"}]); a remote address on one of this host's probe
// subnets (SHUNT_PROBE_ADDRS) becomes a probed peer on that rail, named after
// the address. The other end does the same with ours, so both sides name
// each other by address and agree; a host also listed in SHUNT_PEERS merges
// by address and keeps its real name (ProbeEngine::add_peer).
//
// members() belongs to the agent thread, so a small timer thread asks the
// agent's own control socket ("auto-peers") twice a second and the scan runs
// in that command's handler, on the agent thread.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "clocksync/engine.h"
#include "interpose/core/log.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/agent.h"
#include "interpose/peer/control.h"

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
  std::thread timer;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
};
AutoPeers& ap() {
  static AutoPeers* a = new AutoPeers;
  return *a;
}

// Agent thread: adds every reported TCP peer on a probe subnet not added yet.
json sync_auto_peers() {
  clocksync::ProbeEngine* e = ap().engine ? ap().engine() : nullptr;
  if (!e) return {{"error", "no probe engine (SHUNT_PROBE_ADDRS)"}};
  std::set<uint32_t> own;
  std::vector<Rail> rails = probe_rails(e->config(), &own);
  int added = 0;
  for (auto& [pid, snap] : members().items()) {
    if (!snap.contains("sockets") || !snap["sockets"].is_array()) continue;
    for (auto& s : snap["sockets"]) {
      if (!s.is_object() || !s.contains("peer") || !s["peer"].is_string()) continue;
      std::string hp = s["peer"];
      auto colon = hp.rfind(':');
      if (colon == std::string::npos) continue;
      std::string ip = hp.substr(0, colon);
      in_addr a{};
      if (inet_pton(AF_INET, ip.c_str(), &a) != 1 || own.count(a.s_addr) || ap().added.count(ip)) continue;
      for (size_t r = 0; r < rails.size(); r++) {
        if (!rails[r].mask || (a.s_addr & rails[r].mask) != (rails[r].addr & rails[r].mask)) continue;
        clocksync::PeerSpec spec;
        spec.name = ip;
        spec.by_address = true;
        spec.addrs.assign(r + 1, "");
        spec.addrs[r] = ip;
        e->add_peer(spec);
        ap().added.insert(ip);
        added++;
        log::info("probe engine: peer {} on rail {} from a connection", ip, r);
        break;
      }
    }
  }
  return {{"ok", true}, {"added", added}};
}

void timer_loop() {
  ReentryGuard g;  // the agent's own control traffic is not the job's
  std::string path = socket_path(), err;
  std::unique_lock lk(ap().mu);
  while (!ap().stop) {
    lk.unlock();
    peer::request(path, {{"cmd", "auto-peers"}}, 1000, &err);
    lk.lock();
    ap().cv.wait_for(lk, std::chrono::milliseconds(500), [] { return ap().stop; });
  }
}
}  // namespace

void register_auto_peers(std::function<clocksync::ProbeEngine*()> engine) {
  ap().engine = std::move(engine);
  register_command("auto-peers", [](const json&) { return sync_auto_peers(); });
  register_service({"auto-peers",
                    [] {
                      if (!ap().engine || !ap().engine() || ap().timer.joinable()) return;
                      ap().timer = std::thread(timer_loop);
                    },
                    [] {
                      {
                        std::lock_guard lk(ap().mu);
                        ap().stop = true;
                      }
                      ap().cv.notify_all();
                      if (ap().timer.joinable()) ap().timer.join();
                    }});
}

}  // namespace shunt::agent
