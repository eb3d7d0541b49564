// The host agent's probes of a bundle's paths: the source ports it
// registers with the agent (the probe mesh probes them), and what the
// probes say of each (alive, forward queue) when the worker asks.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>

#include "peer/agent_socket.h"
#include "peer/control.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

// The agent's key for the bundle's source paths on rail k (its own NIC: 0).
std::string probe_key(const Bundle* b, size_t k) {
  std::string key = gid_hex(b->lgid) + "-" + std::to_string(b->pqp->qp_num);
  return k ? key + "/" + std::to_string(k) : key;
}

size_t rail_count(const Bundle* b) { return std::max<size_t>(b->rails.size(), 1); }

// Asks the host agent's probe engine to probe the peer from every shadow's
// UDP source port (clocksync source paths), each from its NIC's address to
// the peer's on that rail; again, with the new list, once renewals moved
// shadows to new ports (a no-op while the lists are the ones the agent
// has). Without a probe engine, or for a NIC whose address the engine does
// not probe from, the bundle works all the same; one line says why.
// Returns whether it registered ports the agent did not probe for it yet.
bool register_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return false;
  std::vector<json> sports, spares;
  std::vector<std::pair<std::string, std::string>> ends;  // per rail: local, peer address
  std::string all, via;  // via: the peer's address on the application's NIC
  {
    std::lock_guard g(b->mu);
    if (b->dead || !b->active.load()) return false;
    std::lock_guard l(b->lk);
    for (size_t k = 0; k < rail_count(b); k++) {
      json list = json::array(), spare = json::array();
      // The application's QP too, where shunt knows its port (its flow
      // label), until it fails (it is never renewed).
      if (!k && path_sport(b->prim) && b->prim.qp && !b->prim.down()) list.push_back(path_sport(b->prim));
      for (size_t i = 0; i < b->paths.size(); i++) {
        const Path& p = b->paths[i];
        if (p.rail != static_cast<int>(k)) continue;
        list.push_back(path_sport(p));
        // Spares: probed at SHUNT_SPARE_PROBE_EVERY. Not the carrier (the
        // probes are how its silent loss is found; shadows that carry a
        // split find theirs by their own ACK timeouts, about
        // SHUNT_PATH_DEAD_MS), not a failed path (its probes tell when the
        // route is back), and none where queue steering reads every path's
        // queue from its probes.
        if (static_cast<int>(i) != b->carrier && !p.down() && !b->steer_queue) spare.push_back(path_sport(p));
      }
      std::string local, peer;
      const ibv_gid& lg = k ? b->rails[k].lgid : b->lgid;
      const ibv_gid& rg = k ? b->rails[k].rgid : b->rgid;
      if (!gid_v4(lg, &local) || !gid_v4(rg, &peer)) local.clear();
      if (!k) via = peer;
      all += list.dump() + spare.dump() + ";";
      sports.push_back(std::move(list));
      spares.push_back(std::move(spare));
      ends.emplace_back(local, peer);
    }
    if (b->probed && all == b->probed_sports) return false;
  }
  bool any = false;
  for (size_t k = 0; k < sports.size(); k++) {
    if (ends[k].first.empty() || sports[k].empty()) continue;
    auto r = peer::request(sock,
                           {{"cmd", "bundle-paths"}, {"peer", ends[k].second}, {"local", ends[k].first},
                            {"sports", sports[k]}, {"spares", spares[k]}, {"key", probe_key(b, k)}, {"via", via}},
                           2000, &err);
    if (r && r->value("ok", false)) {
      any = true;
      continue;
    }
    event_probes_refused(k, r ? r->value("error", r->dump()) : err);
  }
  if (!any) return false;
  std::lock_guard g(b->mu);
  b->probed = true;
  b->probed_sports = all;
  return true;
}

void drop_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return;
  for (size_t k = 0; k < rail_count(b); k++)
    peer::request(sock, {{"cmd", "bundle-paths-drop"}, {"key", probe_key(b, k)}}, 2000, &err);
}

// What the host agent's probes say of the bundle's source paths now, by
// (rail, source port): each path's entry of `bundle-paths-stats`. False
// when no rail's request was answered.
bool probe_stats(Bundle* b, ProbeStats* out) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return false;
  size_t rails;
  {
    std::lock_guard g(b->mu);
    rails = rail_count(b);
  }
  bool answered = false;
  for (size_t k = 0; k < rails; k++) {
    auto r = peer::request(sock, {{"cmd", "bundle-paths-stats"}, {"key", probe_key(b, k)}}, 1000, &err);
    if (!r || !r->value("ok", false)) continue;
    answered = true;
    for (const auto& p : r->value("paths", json::array())) (*out)[{static_cast<int>(k), p.value("port", 0u)}] = p;
  }
  return answered;
}

}  // namespace shunt::verbs::bundle
