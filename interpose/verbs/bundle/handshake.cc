// The answering end of the set-up: join, abort and activate requests from the peer's shim.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

namespace {

// The ports of this side's shadows on its own rail, by path discovery, into
// placed; a retry answer while the round is out. Under b->mu.
// This side's shadows on its own rail take ports from path discovery too
// (the host agent's round towards the peer), so what this side sends
// spreads over the routers as the deciding side's data does; left to the
// hash, 8 ports land 6:2 or worse about half the time. While the round is
// out the deciding side is asked to come again (it does every 100 ms), for
// at most discovery_cap_ms (ten times SHUNT_PATH_DISCOVERY_MS) + 1 s;
// then the hash places them.
std::optional<json> place_own(Bundle* b, const std::vector<Half>& remote, int n,
                              std::vector<std::pair<uint32_t, std::string>>* placed) {
  int want = 0;
  for (const Half& h : remote) want += !h.none && !h.rail;
  want = std::min(want, n);
  const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
  std::string lip, rip;
  if (wait_ms > 0 && want >= 2 && !b->rails.empty() && gid_v4(b->rails[0].lgid, &lip) &&
      gid_v4(b->rails[0].rgid, &rip)) {
    std::vector<uint16_t> ports;
    std::vector<std::string> hops;
    const uint32_t prim = sport_of(flow_label_for(label_seed(b), -1));  // the application QP's port
    ask_prim_router_early(b, prim);
    const int got = shared_hops(lip, rip, 3 * want, wait_ms, true, &ports, &hops);
    if (got < 0) {
      if (!b->hops_until_ms) b->hops_until_ms = mono_ms() + discovery_cap_ms(wait_ms) + 1000;
      if (mono_ms() < b->hops_until_ms) return json{{"retry", "finding paths"}};
    } else if (got > 0) {
      std::string spread;
      *placed = cross_order(
          pick_ports(std::move(ports), std::move(hops), want, prim, &spread));
      if (!placed->empty()) event_shadows_placed(b, 0, want, spread, true);
    }
  }
  return std::nullopt;
}

// This side's half of each of the peer's paths, made and connected, as the
// answer lists them (null: none). Under b->mu.
json make_halves(Bundle* b, const std::vector<Half>& remote, int n, bool rails,
                 const std::vector<std::pair<uint32_t, std::string>>& placed, std::string* err_out) {
  std::string& err = *err_out;
  int own = 0;
  json mine = json::array();
  for (const Half& h : remote) {
    int rail = h.none ? -1 : h.rail ? (rails ? rail_for_half(b, h.gid, &err) : -1) : own < n ? 0 : -1;
    if (rail < 0 || !create_shadow(b, static_cast<int>(b->paths.size()), &err, rail)) {
      mine.push_back(nullptr);
      continue;
    }
    Path& p = b->paths.back();
    p.remote_qpn = h.qpn;
    p.remote_psn = h.psn;
    if (!rail && own < static_cast<int>(placed.size()))
      p.flow_label = placed[own].first, p.router = p.home = placed[own].second;
    if (!connect_shadow(b, p, &err)) {
      ibv_destroy_qp(p.qp);
      b->paths.pop_back();
      mine.push_back(nullptr);
      continue;
    }
    if (!rail) own++;
    mine.push_back(path_json(b, p));
  }
  return mine;
}

}  // namespace

json answer_join(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"retry", "no such QP here yet"}};
  std::lock_guard g(b->mu);
  if (!b->have_rtr) return {{"retry", "QP not at RTR yet"}};
  if (gid_hex(b->rgid) != req.value("peer_gid", "") || b->rqpn != req.value("peer_qpn", 0u))
    return {{"error", "that QP is connected to another peer"}};
  if (b->active.load() || !b->paths.empty()) return {{"error", "bundle already set up"}};
  std::vector<Half> remote;
  if (!parse_paths(req.value("paths", json::array()), 64, &remote)) return {{"error", "no paths, or a malformed one"}};
  init_rails(b);
  const int n = static_cast<int>(config().num(Param::paths_per_rail));
  const bool rails = rails_wanted(b);
  std::string err;
  std::vector<std::pair<uint32_t, std::string>> placed;
  if (auto retry = place_own(b, remote, n, &placed)) return *retry;
  json mine = make_halves(b, remote, n, rails, placed, &err);
  if (b->paths.empty()) {
    set_phase(b, Phase::primary_only, err);
    return {{"error", err.empty() ? "no path could be made" : err}};
  }
  read_addrs(b, req);
  b->peer_access = req.value("access", -1);
  {
    std::lock_guard l(b->lk);
    read_rkeys(b, req);
  }
  set_phase(b, Phase::joined);
  return {{"paths", mine}, {"addrs", local_addrs()}, {"rails", rkeys_json(b)}, {"access", b->access}};
}

namespace {

// The deciding side's list of the paths it kept (ours by QPN and NIC), in
// its order: ours not in it go, the rest take its order. Under b->mu.
bool keep_paths(Bundle* b, const json& keep, std::string* err) {
  if (!keep.is_array()) return true;  // all of them, as joined
  std::vector<Path> kept;
  std::vector<bool> used(b->paths.size(), false);
  for (const auto& x : keep) {
    uint32_t qpn = x.is_object() ? x.value("qpn", 0u) : 0;
    std::string g = x.is_object() ? x.value("gid", "") : "";
    size_t i = 0;
    for (; i < b->paths.size(); i++) {
      const Path& p = b->paths[i];
      if (!used[i] && p.qpn == qpn && (p.rail ? gid_hex(b->rails[p.rail].lgid) == g : g.empty())) break;
    }
    if (i == b->paths.size()) {
      *err = "the peer kept a path this side does not have";
      return false;
    }
    used[i] = true;
    kept.push_back(b->paths[i]);
  }
  for (size_t i = 0; i < b->paths.size(); i++)
    if (!used[i]) ibv_destroy_qp(b->paths[i].qp);
  b->paths = std::move(kept);
  return !b->paths.empty() || (*err = "the peer kept no path", false);
}

}  // namespace

// The deciding side could not finish the setup: this side's shadows go.
json answer_abort(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  std::lock_guard g(b->mu);
  if (b->active.load()) return {{"error", kActiveBundle}};
  std::lock_guard l(b->lk);
  destroy_shadows(b, false);
  set_phase(b, Phase::primary_only, "the peer gave up the setup");
  return {{"ok", true}};
}

json answer_activate(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  {
    std::lock_guard g(b->mu);
    if (b->paths.empty()) return {{"error", "no shadows"}};
    if (b->active.load()) return {{"ok", true}};
    std::string err;
    if (!keep_paths(b, req.value("keep", json()), &err)) {
      std::lock_guard l(b->lk);
      destroy_shadows(b, false);
      set_phase(b, Phase::primary_only, err);
      return {{"error", err}};
    }
    track_shadows(b);
    settle_prim_router(b);
    activate(b);
    start_stall_watch();
  }
  // The agent's answer can take seconds on a busy host: not on the peer
  // channel's thread, which every other peer's set-up waits for meanwhile
  // (their activations timed out, and those bundles stayed primary-only).
  auto probes = [b] {
    register_probe_paths(b);
    start_steering(b);
  };
  if (!start_job("bundle probes", probes)) probes();  // (no thread: here, late rather than never)
  return {{"ok", true}};
}

}  // namespace shunt::verbs::bundle
