#include "tools/shunt-audit/serve.h"

#include <algorithm>
#include <random>

#include "interpose/peer/channel.h"
#include "interpose/verbs/path_discovery.h"

namespace audit {
namespace {

// Does addr's instance answer on the audit port, authenticated, within 3 s?
bool reachable(const std::string& addr, int port, const shunt::peer::Key& key) {
  std::string err;
  auto r = shunt::peer::call(addr, port, key, {{"cmd", "audit_ping"}}, 3000, &err);
  return r && r->value("ok", false);
}

}  // namespace

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
    auto ports = shunt::verbs::candidate_ports(r.ipv4, peer, n, std::random_device{}());
    auto hops = shunt::verbs::hops_of_ports(r.ipv4, peer, ports, 2, wait, 5 * wait);
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
