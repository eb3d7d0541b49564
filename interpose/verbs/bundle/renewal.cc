// Renewal: a failed path gets a new source port (towards its home router where it can), is probed, and comes back on probation.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

namespace {

// The j-th candidate flow label of path p's next renewal (j = 0: the one
// the hash alone would give it), for the draw `salt` (candidates that all
// missed a router must not be asked again for ever).
uint32_t renewal_label(Bundle* b, const Path& p, int j, uint32_t salt = 0) {
  return flow_label_for(label_seed(b) + 7919u * (p.gen + (j == 0 ? 0 : 1)) + 104729u * static_cast<uint32_t>(j) + salt,
                        static_cast<int>(&p - b->paths.data()));
}

constexpr int kRenewCandidates = 3;
constexpr int64_t kAnswerGraceMs = 50;

}  // namespace

int pick_renewal(const std::vector<std::string>& hops, const std::string& home, const std::set<std::string>& works,
                 const std::map<std::string, int>& load) {
  const int n = static_cast<int>(hops.size());
  for (int j = 0; j < n; j++)
    if (!hops[j].empty() && (home.empty() ? works.count(hops[j]) > 0 : hops[j] == home)) return j;
  auto load_of = [&](const std::string& h) {
    auto it = load.find(h);
    return it == load.end() ? 0 : it->second;
  };
  int pick = -1;  // home is not asked for or not answering: the router with the fewest paths, or any
  for (int j = 0; j < n; j++)
    if (!hops[j].empty() && (pick < 0 || (!home.empty() && load_of(hops[j]) < load_of(hops[pick])))) pick = j;
  return pick;
}

std::map<int, std::set<std::string>> proven_routers(Bundle* b, const std::vector<int>& skip) {
  std::map<int, std::set<std::string>> works;
  auto proven = [&](const Path& p) {
    if (!p.router.empty() && usable(p) && p.proven_ms >= b->fail_ms) works[p.rail].insert(p.router);
  };
  proven(b->prim);
  for (size_t i = 0; i < b->paths.size(); i++)
    if (std::find(skip.begin(), skip.end(), static_cast<int>(i)) == skip.end()) proven(b->paths[i]);
  return works;
}

// Where the next renewal of each path in `idx` goes: kRenewCandidates
// ports each, one discovery round for all (at most SHUNT_PATH_DISCOVERY_MS:
// the peer may be waiting for the answer). home (return_home): a port on
// its home router if one answered, else on the router with the fewest of
// the bundle's paths. Else (a failure) a candidate on a router that one of
// the bundle's paths on that rail was proven through since the last
// failure (its probe completed: the whole route to the peer works), else
// the first candidate some router answered for. Discovery sees 2 hops out
// only: from the far side of a dark spine-to-leaf link, that spine answers
// like the others, and a path sent there (home, or the first answer) fails
// again a stall later. The router it failed on is not avoided as such: the
// dark direction may be the peer's half. No answer: the hash's. A path
// without a home (the hash placed it at setup: its routers did not answer
// then) is sent home never, but its failure's renewal is chosen like any.
// Returns the paths whose port is on their home router.
// Not under b->lk; under b->move_mu.
std::vector<int> renewal_ports(Bundle* b, const std::vector<int>& idx, bool home) {
  const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
  std::vector<int> home_bound;
  if (wait_ms <= 0) return home_bound;
  struct Ask {
    int i;
    std::string home;
    std::vector<uint32_t> labels;
  };
  std::map<int, std::vector<Ask>> by_rail;
  std::map<std::string, int> load;  // paths per router now
  std::map<int, std::pair<std::string, std::string>> ends;
  std::map<int, std::set<std::string>> works;  // per rail, the routers of paths proven since the last failure
  {
    std::lock_guard g(b->mu);
    std::lock_guard l(b->lk);
    const uint32_t salt = static_cast<uint32_t>(b->rng());  // a fresh draw of candidates each round
    if (!home) works = proven_routers(b, idx);
    for (const auto& p : b->paths)
      if (!p.router.empty()) load[p.router]++;
    for (int i : idx) {
      Path& p = b->paths[i];
      p.next_label = 0;
      if ((home && p.home.empty()) || p.rail < 0 || p.rail >= static_cast<int>(b->rails.size())) continue;
      std::string lip, rip;
      if (!gid_v4(b->rails[p.rail].lgid, &lip) || !gid_v4(b->rails[p.rail].rgid, &rip)) continue;
      ends[p.rail] = {lip, rip};
      if (!p.router.empty()) load[p.router]--;  // it leaves its router
      Ask a{i, p.home, {}};
      for (int j = 1; j <= kRenewCandidates; j++) a.labels.push_back(renewal_label(b, p, j, salt));
      by_rail[p.rail].push_back(std::move(a));
    }
  }
  for (auto& [rail, asks] : by_rail) {
    std::vector<uint16_t> ports;
    for (const auto& a : asks)
      for (uint32_t fl : a.labels) ports.push_back(static_cast<uint16_t>(sport_of(fl)));
    auto hops = hops_of_ports(ends[rail].first, ends[rail].second, ports, 2, wait_ms, wait_ms);
    std::lock_guard l(b->lk);
    size_t k = 0;
    for (const auto& a : asks) {
      std::vector<std::string> seen(hops.begin() + static_cast<long>(k), hops.begin() + static_cast<long>(k) + kRenewCandidates);
      int pick = pick_renewal(seen, home ? a.home : std::string(), works[rail], load);
      if (pick >= 0) {
        const std::string& h = hops[k + pick];
        Path& p = b->paths[a.i];
        p.next_label = a.labels[pick];
        p.next_router = h;
        load[h]++;
        if (h == a.home) home_bound.push_back(a.i);
      }
      k += kRenewCandidates;
    }
  }
  return home_bound;
}

namespace {

// Puts a shadow that failed back into service with a new flow label (so a
// new ECMP path): both halves go through RESET to RTS with new PSNs, after
// every completion of the old incarnation was polled. The path then waits
// on probation until a probe (shunt's zero-length WRITE) on it completes.
bool reset_half(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = b->rails[p.rail].pkey;
  a.port_num = b->rails[p.rail].port;
  a.qp_access_flags = b->access;
  if (ibv_modify_qp(p.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *err = std::string("shadow to INIT: ") + strerror(errno);
    return false;
  }
  p.psn = random_psn();
  p.gen++;
  if (p.next_label) {  // chosen by where it goes (renewal_ports)
    p.flow_label = p.next_label;
    p.router = p.next_router;
  } else {
    p.flow_label = renewal_label(b, p, 0);
    p.router.clear();  // a new port: its router is not known
  }
  p.next_label = 0;
  p.next_router.clear();
  p.probe_alive = false;  // a new port: its probes start over
  p.probe_dead = false;
  p.step(LifeEvent::reset);  // (a stopped path is renewed as a failed one)
  return true;
}

// Stops the path: its QP to the error state and then RESET, so the device
// makes no more completions for it; the caller then drains the CQs once
// for all the paths it stopped. Under b->move_mu.
bool quiesce_path(Bundle* b, int i, std::string* err, bool planned = false) {
  {
    std::lock_guard l(b->lk);
    After a;
    if (!b->paths[i].down()) path_failed(b, i, -1, &a, !planned);
    flush_held(b, b->ctx);
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(b->paths[i].qp, &a, IBV_QP_STATE);
  a.qp_state = IBV_QPS_RESET;
  if (ibv_modify_qp(b->paths[i].qp, &a, IBV_QP_STATE) != 0) {
    *err = std::string("shadow to RESET: ") + strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

// Shunt's zero-length signaled WRITE on a path: the path is on probation
// (out of the rotation) until it completes. Under b->lk.
void probe(Bundle* b, int i) {
  Path& p = b->paths[i];
  p.step(LifeEvent::probe_sent);
  p.probe_ms = mono_ms();
  p.witness = false;
  p.last_signaled = false;
  uint64_t before = p.posted;
  fence(b, b->ctx, i);
  if (p.posted != before) {
    p.signaled[p.signaled.size() - 1].kind = kProbe;
    b->fences--;
  } else {
    p.step(LifeEvent::probe_unsent);  // cannot probe: trust it
  }
}

// Returns whether it is on probation (else trusted at once: no probe).
bool back_in_service(Bundle* b, int i) {
  std::lock_guard l(b->lk);
  Path& p = b->paths[i];
  p.posted = p.done = 0;
  p.signaled.clear();
  p.infl.clear();
  p.flow_bytes = 0;
  p.ns_per_byte = 0;
  p.step(LifeEvent::renew);
  // Its stall clock starts again at the watch's next look: run on from
  // before the failure, it failed the renewed path as stalled before its
  // probe could complete (the port retransmits for others throughout a fault).
  p.watch_ms = 0;  // (its next look then takes watch_done from done)
  p.hiccups.fill(0);  // a new port: it has not flapped yet
  probe(b, i);
  return p.probation();  // (a path that cannot be probed is trusted at once)
}

// Probes every usable shadow (after a failure, the others may sit behind
// the same fault): each is on probation, out of the rotation, until its
// probe completes; one that does not fails like any path.
void probe_all(Bundle* b) {
  std::lock_guard l(b->lk);
  for (size_t i = 0; i < b->paths.size(); i++)
    if (usable(b->paths[i]) && static_cast<int>(i) != b->carrier) probe(b, static_cast<int>(i));
}

namespace {

// A probe completes only when somebody polls its CQ, and a rank waiting on
// its own bootstrap (TCP) polls nothing: without this, paths renewed while
// the application is away stay on probation and a move finds no candidate
// until SHUNT_HOLD_MS runs out. Shunt polls once a probe is overdue.
constexpr int64_t kProbePollMs = 100;

}  // namespace

void poll_overdue_probes(Bundle* b) {
  bool overdue = false;
  {
    std::lock_guard l(b->lk);
    int64_t now = mono_ms();
    for (const auto& p : b->paths) overdue |= !p.down() && p.probation() && now - p.probe_ms >= kProbePollMs;
  }
  if (overdue) drain(b);
}

// Probes the candidates and returns those that answered within ms, in the
// order they answered (shunt polls the CQs itself meanwhile). Once one
// answered, the others get kAnswerGraceMs more: a candidate behind the
// fault never answers, and the move waited the whole ms for it.
std::vector<int> answering(Bundle* b, const std::vector<int>& cand, int ms) {
  {
    std::lock_guard l(b->lk);
    for (int i : cand)
      if (!b->paths[i].down() && !b->paths[i].probation()) probe(b, i);
  }
  std::vector<int> ok;
  int64_t deadline = mono_ms() + ms;
  while (mono_ms() < deadline && ok.size() < cand.size()) {
    drain(b);
    std::lock_guard l(b->lk);
    for (int i : cand)
      if (usable(b->paths[i]) && std::find(ok.begin(), ok.end(), i) == ok.end()) {
        if (ok.empty()) deadline = std::min(deadline, mono_ms() + kAnswerGraceMs);
        ok.push_back(i);
      }
  }
  return ok;
}

// Renews the given failed paths together (one exchange with the peer).
// Returns those back in service.
std::vector<int> renew_paths(Bundle* b, const std::vector<int>& want, std::string* err, bool planned) {
  std::vector<int> ready;
  for (int i : want)
    if (quiesce_path(b, i, err, planned)) ready.push_back(i);
  if (ready.empty()) return ready;
  drain(b);
  if (!planned) renewal_ports(b, ready, false);  // (a planned one chose its ports already)
  json list = json::array();
  std::vector<int> reset;
  for (int i : ready)
    if (reset_half(b, b->paths[i], err)) {
      reset.push_back(i);
      list.push_back({{"path", i}, {"psn", b->paths[i].psn}});
    }
  std::vector<int> done;
  if (reset.empty()) return done;
  auto r = ask_peer(b, request(b, Msg::path_renew, {{"paths", list}, {"planned", planned}}), 3000, err);
  if (!r || !r->contains("psns") || !(*r)["psns"].is_array()) {
    if (r) *err = r->dump();
    return done;
  }
  for (const auto& x : (*r)["psns"]) {
    int i = x.value("path", -1);
    if (std::find(reset.begin(), reset.end(), i) == reset.end()) continue;
    Path& p = b->paths[i];
    p.remote_psn = x.value("psn", 0u) & 0xffffff;
    if (!connect_shadow(b, p, err)) continue;
    event_renewed(b, i, back_in_service(b, i));
    done.push_back(i);
  }
  if (done.size() < reset.size() && err->empty()) *err = "the peer renewed only some: " + r->dump();
  return done;
}

json answer_path_renew(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no active bundle for that QP"}};
  std::vector<std::pair<int, uint32_t>> want;
  for (const auto& x : req.value("paths", json::array())) {
    int i = x.is_object() ? x.value("path", -1) : -1;
    std::lock_guard l(b->lk);
    if (i >= 0 && i < static_cast<int>(b->paths.size()) && i != b->carrier)
      want.emplace_back(i, x.value("psn", 0u) & 0xffffff);
  }
  std::string err;
  std::vector<std::pair<int, uint32_t>> ready;
  const bool planned = req.value("planned", false);
  for (auto [i, psn] : want)
    if (quiesce_path(b, i, &err, planned)) ready.emplace_back(i, psn);
  if (!ready.empty()) {
    drain(b);
    std::vector<int> idx;
    for (auto [i, psn] : ready) idx.push_back(i);
    renewal_ports(b, idx, planned);  // this side's ports of those paths, by where they go
  }
  json psns = json::array();
  for (auto [i, psn] : ready) {
    Path& p = b->paths[i];
    p.remote_psn = psn;
    if (!reset_half(b, p, &err) || !connect_shadow(b, p, &err)) continue;
    event_renewed(b, i, back_in_service(b, i));
    psns.push_back({{"path", i}, {"psn", p.psn}});
  }
  if (!psns.empty()) wake_worker(b);  // polls their probes if the application does not
  return {{"psns", psns}};
}

}  // namespace shunt::verbs::bundle
