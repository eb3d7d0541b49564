#include "tools/shunt-audit/serve.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <random>
#include <thread>

#include "interpose/verbs/path_discovery.h"
#include "peer/channel.h"

namespace audit {
namespace {

// Does addr's instance answer on the audit port, authenticated, within 3 s,
// in one of two tries? One try lost a handshake to a link losing 3% of its
// packets (fabric 63's lossy link, on the way to that host), and the host
// was called unreachable. Two tries of every peer stay within the driver's
// wait for the answer (10 s and 4 s a host).
bool reachable(const std::string& addr, int port, const shunt::peer::Key& key) {
  for (int attempt = 0; attempt < 2; attempt++) {
    std::string err;
    auto r = shunt::peer::call(addr, port, key, {{"cmd", "audit_ping"}}, 3000, &err);
    if (r && r->value("ok", false)) return true;
  }
  return false;
}

// n candidate source ports from local to peer and, for each, the router
// two hops out (a spine) that datagrams to dst_port take from it ("" none).
std::pair<std::vector<uint16_t>, std::vector<std::string>> spines_of(const std::string& local,
                                                                     const std::string& peer, int n,
                                                                     int wait_ms,
                                                                     uint16_t dst_port) {
  auto ports = shunt::verbs::candidate_ports(local, peer, n, std::random_device{}());
  auto hops = shunt::verbs::hops_of_ports(local, peer, ports, 2, wait_ms, 5 * wait_ms, dst_port);
  return {ports, hops};
}

std::string mesh_name(size_t host) {
  return "h" + std::to_string(host);
}

json path_json(const shunt::clocksync::PathStats& s) {
  return {{"sent", s.acked_sent}, {"rx", s.acked_rx}, {"owd_ns", s.fwd_p50_ns}};
}

}  // namespace

json Server::mesh_start(const json& req) {
  namespace cs = shunt::clocksync;
  mesh_.reset();
  mesh_sources_.clear();
  const json& hosts = req.at("hosts");
  if (!hosts.is_array() || hosts.size() != o_.hosts.size())
    throw std::runtime_error("mesh: one entry per host wanted");
  auto addrs = [&](size_t h) {
    std::vector<std::string> a;
    for (auto& x : hosts[h].at("addrs")) a.push_back(x.get<std::string>());
    if (a.size() > kMaxMeshRails)
      throw std::runtime_error("mesh: more rails than " + std::to_string(kMaxMeshRails));
    return a;
  };
  cs::EngineConfig c;
  c.name = mesh_name(rank_);
  c.port = static_cast<uint16_t>(std::clamp(req.value("port", 7480), 1, 65535));
  c.interval_ns = std::clamp(req.value("interval_ms", 25), 5, 1000) * int64_t{1'000'000};
  c.dead_ns = 2'000'000'000;  // loss is judged, not liveness
  c.key = probe_key_;
  auto mine = addrs(rank_);
  if (std::all_of(mine.begin(), mine.end(), [](const std::string& a) { return a.empty(); }))
    return {{"ok", true}, {"idle", "no rail up here"}};  // the others probe no path to it either
  // A rail this host does not probe still needs a socket, for the rail
  // indices to line up: one on loopback, which no peer is told of.
  for (size_t r = 0; r < mine.size(); r++)
    c.local_addrs.push_back(!mine[r].empty() ? mine[r] : "127.0.0." + std::to_string(r + 1));
  auto eng = std::make_unique<cs::ProbeEngine>(c);
  for (size_t h = 0; h < hosts.size(); h++) {
    if (static_cast<int>(h) == rank_) continue;
    cs::PeerSpec p{mesh_name(h), addrs(h)};
    p.addrs.resize(mine.size());
    for (size_t r = 0; r < p.addrs.size(); r++)
      if (mine[r].empty()) p.addrs[r].clear();
    eng->add_peer(p);
  }
  // Source paths: per peer and rail, one source port through each router
  // two hops out (a spine), found for the probes' own destination port:
  // where the routers hash it, a RoCE flow's port would take another path.
  // Routers answer a host about 6 ICMP messages at once, then one a
  // second: few candidates per peer, and a second round, a second later,
  // for the peers through fewer than two routers.
  json errors = json::array();
  const int n = std::clamp(req.value("candidates", 4), 0, 32),
            wait = std::clamp(req.value("discovery_ms", 200), 10, 5000);
  std::map<std::pair<size_t, size_t>, std::map<std::string, uint16_t>> found;  // (peer, rail)
  for (int round = 0; round < 2 && n > 0; round++) {
    if (round) std::this_thread::sleep_for(std::chrono::seconds(1));
    for (size_t r = 0; r < mine.size(); r++)
      for (size_t h = 0; h < hosts.size(); h++) {
        auto theirs = addrs(h);
        if (static_cast<int>(h) == rank_ || r >= theirs.size() || mine[r].empty() ||
            theirs[r].empty())
          continue;
        auto& by_router = found[{h, r}];
        if (by_router.size() >= 2) continue;
        auto [ports, hops] = spines_of(mine[r], theirs[r], n, wait, c.port);
        for (size_t k = 0; k < hops.size() && k < ports.size(); k++)
          if (!hops[k].empty()) by_router.emplace(hops[k], ports[k]);
      }
  }
  for (auto& [k, by_router] : found)
    for (auto& [router, port] : by_router) {
      auto [h, r] = k;
      if (mesh_sources_.size() >= kMaxMeshPaths) break;
      std::string err;
      int id = eng->add_source_path(mesh_name(h), static_cast<int>(r), port, &err);
      if (id > 0)
        mesh_sources_.push_back({static_cast<int>(h), static_cast<int>(r), port, id, router});
      else
        errors.push_back(fmt::format("rail {} port {} to {}: {}", r, port, o_.hosts[h], err));
    }
  std::string err;
  if (!eng->start(&err)) throw std::runtime_error("probe engine: " + err);
  mesh_ = std::move(eng);
  return {{"ok", true}, {"errors", errors}};
}

json Server::mesh_report() const {
  if (!mesh_) return {{"peers", json::array()}};  // none started: no rail up here
  json peers = json::array();
  for (auto& pr : mesh_->report()) {
    int h = -1;
    for (size_t i = 0; i < o_.hosts.size(); i++)
      if (pr.name == mesh_name(i)) h = static_cast<int>(i);
    if (h < 0) continue;
    json rails = json::array(), sources = json::array();
    for (size_t r = 0; r < pr.paths.size(); r++) rails.push_back(path_json(pr.paths[r]));
    for (auto& sp : pr.source_paths) {
      if (sp.reflected) continue;
      json x = path_json(sp.stats);
      x["rail"] = sp.rail, x["port"] = sp.port;
      for (auto& m : mesh_sources_)
        if (m.id == sp.id) x["router"] = m.router;
      sources.push_back(x);
    }
    // The clock model, or where it has too few clean pairs yet (a short
    // audit on busy hosts) the latest probes' NTP-style offset, unbounded.
    json clock{{"valid", pr.clock.valid || pr.clock.naive_valid}};
    if (pr.clock.valid)
      clock["offset_ns"] = pr.clock.offset_ns, clock["bound_ns"] = pr.clock.bound_ns;
    else if (pr.clock.naive_valid)
      clock["offset_ns"] = pr.clock.naive_offset_ns, clock["rough"] = true;
    peers.push_back({{"host", h}, {"rails", rails}, {"sources", sources}, {"clock", clock}});
  }
  return {{"peers", peers}};
}

json Server::dispatch(const json& req) {
  std::string cmd = req.value("cmd", "");
  if (cmd == "audit_facts") {
    json f = audit::host_facts(o_.devices);
    rails_ = audit::rails(f);
    return f;
  }
  // Asked once every host answered: a host still starting is not unreachable.
  if (cmd == "audit_reach") {
    json reach = json::array();
    // (not itself: its listener is the thread asking)
    for (size_t h = 0; h < o_.hosts.size(); h++)
      reach.push_back(static_cast<int>(h) == rank_ || reachable(o_.hosts[h], o_.port, key_));
    return reach;
  }
  if (cmd == "audit_ping") return {{"ok", true}};
  if (cmd == "audit_counters") return audit::port_counters(o_.devices);
  if (cmd == "audit_hops") {
    auto& r = rail(req.at("rail").get<int>());
    std::string peer = req.at("peer").get<std::string>();
    int n = std::clamp(req.value("n", 6), 1, 32),
        wait = std::clamp(req.value("wait_ms", 200), 10, 5000);
    auto [ports, hops] = spines_of(r.ipv4, peer, n, wait, shunt::verbs::kRoceV2Port);
    return {{"ports", ports}, {"hops", hops}};
  }
  if (cmd == "audit_open") {
    auto& r = rail(req.at("rail").get<int>());
    if (eps_.size() >= kMaxEndpoints) throw std::runtime_error("too many endpoints open");
    auto ep = std::make_unique<audit::RcEndpoint>(r.dev, r.port, r.gid_index);
    json a = ep->address();
    eps_[req.at("id").get<int>()] = std::move(ep);
    return a;
  }
  if (cmd == "audit_connect") {
    endpoint(req).connect(req.at("remote"), req.value("flow_label", 0u));
    return {{"ok", true}};
  }
  if (cmd == "audit_measure") {
    auto r = endpoint(req).measure(std::clamp(req.value("ms", 400), 10, 10000),
                                   std::clamp(req.value("rounds", 50), 1, 10000));
    if (!r.error.empty()) return {{"rc_error", r.error}};
    return {{"mbps", r.mbps}, {"lat_us", r.lat_us}};
  }
  if (cmd == "audit_close") {
    eps_.erase(req.at("id").get<int>());
    return {{"ok", true}};
  }
  if (cmd == "audit_mesh_start") return mesh_start(req);
  if (cmd == "audit_mesh_report") return mesh_report();
  if (cmd == "audit_mesh_stop") {
    mesh_.reset();
    mesh_sources_.clear();
    return {{"ok", true}};
  }
  if (cmd == "audit_done") {
    std::lock_guard lk(mu_);
    done_ = true;
    status_ = std::clamp(req.value("status", 2), 0, 3);
    verdict_ = req.value("verdict", "");
    cv_.notify_all();
    return {{"ok", true}};
  }
  return {{"error", "unknown request " + cmd}};
}

}  // namespace audit
