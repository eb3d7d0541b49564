// The probe engine's clocks (engine.cc has the rest): the loop correction
// over our direct estimates and the peers' gossip, a peer's clock as
// reported, and its publication in shared memory.
#include "clocksync/engine_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
#include <utility>

#include "clocksync/loop.h"

namespace shunt::clocksync {

using namespace detail;

void ProbeEngine::correct_loops(int64_t now) {
  // Hosts: 0 = us, 1.. = peers. Edges: our direct estimates, and the peers'
  // gossiped estimates between two of our peers (both ends' views averaged,
  // since they come from the same probes and are not independent).
  int n = int(peers_.size()) + 1;
  std::vector<Edge> edges;
  std::map<std::pair<int, int>, std::pair<Edge, int>> between;
  for (int i = 0; i < int(peers_.size()); i++) {
    const Peer& p = *peers_[i];
    const ClockModel& m = p.est.model();
    if (m.valid) edges.push_back({0, i + 1, m.offset_at(now), std::max(1.0, m.bound_at(now))});
    if (!m.valid) continue;
    for (const Heard& h : p.heard) {
      int j = -1;
      for (int k = 0; k < int(peers_.size()); k++)
        if (peers_[k]->id == h.id) j = k;
      if (j < 0 || j == i || now - h.local_rx > 2'000'000'000) continue;
      // The sender's clock now is ours plus its offset.
      double elapsed = double(now) + m.offset_at(now) - double(h.sender_time);
      Edge e{i + 1, j + 1, h.offset_ns + h.drift * elapsed,
             std::max(1.0, h.bound_ns + 1e-7 * std::fabs(elapsed))};
      auto key = std::make_pair(std::min(i, j), std::max(i, j));
      auto it = between.find(key);
      if (it == between.end()) {
        between[key] = {e, 1};
      } else {
        Edge& a = it->second.first;
        double off = e.from == a.from ? e.offset_ns : -e.offset_ns;
        // Two views further apart than their bounds allow: one is stale (a
        // step one end has seen and the other not yet). Use neither.
        if (it->second.second < 0 || std::fabs(a.offset_ns - off) > a.bound_ns + e.bound_ns) {
          it->second.second = -1;
          continue;
        }
        a.bound_ns = std::max(std::min(a.bound_ns, e.bound_ns), std::fabs(a.offset_ns - off) / 2);
        a.offset_ns = (a.offset_ns + off) / 2;
        it->second.second++;
      }
    }
  }
  for (auto& [k, v] : between)
    if (v.second > 0) edges.push_back(v.first);
  LoopSolution sol;
  bool ok = solve_loops(n, 0, edges, &sol);
  for (int i = 0; i < int(peers_.size()); i++) {
    Peer& p = *peers_[i];
    p.corr_valid = ok && p.est.model().valid && std::isfinite(sol.bound_ns[i + 1]);
    if (!p.corr_valid) continue;
    p.corr_offset = sol.offset_ns[i + 1];
    // Never claim more than the direct estimate can be off by.
    p.corr_bound = std::min(sol.bound_ns[i + 1], p.est.model().bound_at(now));
    p.corr_at = now;
  }
}

PeerClock ProbeEngine::clock_of(const Peer& p, int64_t now) const {
  PeerClock c;
  const ClockModel& m = p.est.model();
  c.at = now;
  if (p.have_f && p.have_r && std::llabs(p.naive_f_t - p.naive_r_t) < 2 * cfg_.interval_ns * rail_every(cfg_)) {
    c.naive_valid = true;
    c.naive_offset_ns = double(p.naive_f - p.naive_r) / 2;
  }
  if (!m.valid) return c;
  c.valid = true;
  c.direct_offset_ns = m.offset_at(now);
  c.direct_bound_ns = m.bound_at(now);
  c.drift_ppb = m.drift * 1e9;
  c.half_rtt_ns = m.half_rtt_ns;
  c.age_ns = double(now - m.t_ref);
  c.offset_ns = c.direct_offset_ns;
  c.bound_ns = c.direct_bound_ns;
  if (p.corr_valid) {
    // The correction was computed at corr_at; carry it forward with the drift.
    double dt = double(now - p.corr_at);
    c.offset_ns = p.corr_offset + m.drift * dt;
    c.bound_ns = p.corr_bound + m.bound_rate * std::max(0.0, dt);
    // The correction may only move the estimate within the direct bound: a
    // loop still holding a stale view (a step not yet seen everywhere, or one
    // this estimator just took) must not pull it out.
    if (std::fabs(c.offset_ns - c.direct_offset_ns) > c.direct_bound_ns) {
      c.offset_ns = c.direct_offset_ns;
      c.bound_ns = c.direct_bound_ns;
    }
  }
  return c;
}

void ProbeEngine::publish(int64_t now) {
  if (!shm_) return;
  for (int i = 0; i < int(peers_.size()); i++) {
    const Peer& p = *peers_[i];
    PeerClock c = clock_of(p, now);
    PublishedClock pc;
    pc.peer_id = p.id;
    pc.name = p.name;
    pc.t_ref = now;
    pc.offset_ns = c.offset_ns;
    pc.drift = c.drift_ppb * 1e-9;
    pc.bound_ns = c.bound_ns;
    pc.bound_rate = p.est.model().bound_rate;
    pc.updated = now;
    pc.valid = c.valid;
    shm_->pub.publish(i, pc);
  }
}

}  // namespace shunt::clocksync
