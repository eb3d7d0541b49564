// Placement: the shadows' source ports chosen by the routers path discovery saw them take, and the application QP's own router.
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/rails.h"
#include "peer/agent_socket.h"

namespace shunt::verbs::bundle {

// Discovery's answers for (local, peer) from the host agent, which sends
// one round of datagrams for all bundles of the host to that peer (see
// HopCache): 1 with them, 0 without an agent that answers (then a bundle
// sends its own), -1 while the agent's round is out and `once` (else it
// asks again until the round ends).
int shared_hops(const std::string& local, const std::string& peer, int candidates, int wait_ms, bool once,
                std::vector<uint16_t>* ports, std::vector<std::string>* hops) {
  return shared_hops_via(agent::socket_path(), local, peer, candidates, wait_ms, once, ports, hops);
}

// From discovery's answers, `want` ports balanced over the routers that
// answered, never `prim` (the application QP's): (flow label, router) each,
// and "router xN, ..." in *spread. Empty when no router answered.
std::vector<std::pair<uint32_t, std::string>> pick_ports(std::vector<uint16_t> ports, std::vector<std::string> hops,
                                                         int want, uint32_t prim, std::string* spread) {
  for (size_t i = ports.size(); i-- > 0;)  // never the application QP's own port
    if (ports[i] == prim) ports.erase(ports.begin() + i), hops.erase(hops.begin() + i);
  std::vector<int> pick = balanced_pick(hops, want);
  std::map<std::string, int> seen;
  for (int k : pick) seen[hops[k]]++;
  spread->clear();
  for (const auto& [h, n] : seen) *spread += (spread->empty() ? "" : ", ") + (h.empty() ? "unknown" : h) + " x" + std::to_string(n);
  std::vector<std::pair<uint32_t, std::string>> out;
  if (seen.size() < 2 && seen.count("")) return out;
  for (int k : pick) out.emplace_back(ports[k] & 0x3fffu, hops[k]);  // the label whose port it is (sport_of)
  return out;
}

// The answering side's order of its placed ports (answer_join): pick_ports
// takes the routers in turn (path k on router k % R, as the deciding side's
// halves);
// here path k gets router (k / R) % R, so that over R x R paths the two
// halves of the bundle's paths meet every pair of routers (a pinned
// carrier steered off a congested spine in one direction keeps its spine
// in the other: two jobs on one pair of hosts can collide each way).
std::vector<std::pair<uint32_t, std::string>> cross_order(const std::vector<std::pair<uint32_t, std::string>>& placed) {
  std::vector<std::string> routers;
  std::map<std::string, std::deque<size_t>> by;
  for (size_t k = 0; k < placed.size(); k++) {
    if (!by.count(placed[k].second)) routers.push_back(placed[k].second);
    by[placed[k].second].push_back(k);
  }
  const size_t r = routers.size();
  if (r < 2) return placed;
  std::vector<std::pair<uint32_t, std::string>> out;
  for (size_t k = 0; k < placed.size(); k++) {
    auto* q = &by[routers[(k / r) % r]];
    for (size_t j = 0; q->empty() && j < r; j++) q = &by[routers[j]];
    out.push_back(placed[q->front()]);
    q->pop_front();
  }
  return out;
}

// The application QP's own router, asked while the bundle is set up, with
// its shadows' ports: once it is active the host agent probes from that
// port, and a discovery datagram can no longer leave from it (discovery
// takes no port another socket holds). settle_prim_router reads the answer
// and frees the port before activation; where none came, the worker asks
// again (ask_prim_router). Under b->mu.
void ask_prim_router_early(Bundle* b, uint32_t sport) {
  std::string lip, rip;
  if (b->prim_early_fd >= 0 || b->prim_router_tries || config().num(Param::path_discovery_ms) <= 0 ||
      !gid_v4(b->lgid, &lip) || !gid_v4(b->rgid, &rip))
    return;
  b->prim_router_tries++;
  b->prim_early_fd = hop_send(lip, rip, static_cast<uint16_t>(sport), 2);
}

// Under b->mu; `take`: keep the answer (at activation), else only close.
void settle_prim_router(Bundle* b, bool take) {
  if (b->prim_early_fd < 0) return;
  std::string hop;
  if (take && hop_answer(b->prim_early_fd, &hop) && !hop.empty()) {
    std::lock_guard l(b->lk);
    b->prim.router = hop;
  }
  close(b->prim_early_fd);
  b->prim_early_fd = -1;
}

// SHUNT_PATH_DISCOVERY_MS (path_discovery.h): on each rail with two or
// more shadows, ports balanced over the routers two hops out, before the
// shadows connect (their flow labels are theirs alone until then).
void spread_over_routers(Bundle* b) {
  const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
  if (wait_ms <= 0) return;
  struct Job {
    int rail;
    std::vector<int> paths;
    std::string lip, rip;
  };
  std::vector<Job> jobs;
  const uint32_t seed = label_seed(b);
  const uint32_t prim = sport_of(flow_label_for(seed, -1));  // the application QP's port
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    for (int r = 0; r < static_cast<int>(b->rails.size()); r++) {
      Job j{r, {}, {}, {}};
      for (int i = 0; i < static_cast<int>(b->paths.size()); i++)
        if (b->paths[i].rail == r) j.paths.push_back(i);
      if (j.paths.size() < 2 || !gid_v4(b->rails[r].lgid, &j.lip) || !gid_v4(b->rails[r].rgid, &j.rip)) continue;
      jobs.push_back(std::move(j));
    }
    ask_prim_router_early(b, prim);
  }
  for (auto& j : jobs) {
    const int want = 3 * static_cast<int>(j.paths.size());
    std::vector<uint16_t> ports;
    std::vector<std::string> hops;
    if (shared_hops(j.lip, j.rip, want, wait_ms, false, &ports, &hops) != 1) {  // no host agent: this bundle's own candidates
      ports = candidate_ports(j.lip, j.rip, want, seed);
      hops = hops_of_ports(j.lip, j.rip, ports, 2, wait_ms);
    }
    std::string spread;
    auto placed = pick_ports(std::move(ports), std::move(hops), static_cast<int>(j.paths.size()), prim, &spread);
    std::lock_guard g(b->mu);
    if (b->dead) return;
    if (placed.empty()) {
      event_shadows_hashed(b, j.rail);
      continue;
    }
    for (size_t k = 0; k < placed.size() && k < j.paths.size(); k++) {
      Path& p = b->paths[j.paths[k]];
      p.flow_label = placed[k].first, p.router = p.home = placed[k].second;
    }
    event_shadows_placed(b, j.rail, j.paths.size(), spread);
  }
}

// The application QP's router: discovery placed the shadows, not it.
// Asked every 2 s until a router answers, 10 times at most (none answers
// where the host agent probes from its port: discovery cannot bind it).
// Carrier steering judges paths on its spine by it, and split keeps the
// carrier's own bytes in the balance of the routers. From the failover
// worker, every round; its datagram is answered in a later round (up to
// 2 s), never waited for: a router's answer waits in the spine's queue
// with the traffic (up to 1 s in the bundles bench), and a failover must
// not wait behind it.
void ask_prim_router(Bundle* b) {
  const int64_t t = mono_ms();
  if (b->prim_router_fd >= 0) {
    std::string hop;
    const bool answered = hop_answer(b->prim_router_fd, &hop);
    if (!answered && t < b->prim_router_next_ms) return;
    close(b->prim_router_fd);
    b->prim_router_fd = -1;
    if (answered && !hop.empty()) {
      std::lock_guard l(b->lk);
      b->prim.router = hop;
      return;
    }
  }
  std::string lip, rip;
  uint16_t psport = 0;
  {
    std::lock_guard l(b->lk);
    if (b->prim.router.empty() && !b->prim.down() && path_sport(b->prim) && b->prim_router_tries < 10 &&
        t >= b->prim_router_next_ms && config().num(Param::path_discovery_ms) > 0 && gid_v4(b->lgid, &lip) &&
        gid_v4(b->rgid, &rip)) {
      psport = static_cast<uint16_t>(path_sport(b->prim));
      b->prim_router_next_ms = t + 2000;  // the answer's deadline, then the next try's time
      b->prim_router_tries++;
    }
  }
  if (psport) b->prim_router_fd = hop_send(lip, rip, psport, 2);
}

}  // namespace shunt::verbs::bundle
