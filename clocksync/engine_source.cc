// The probe engine's source paths (engine.h, SourcePathStats; engine.cc
// has the rest): ours added, removed, made spare and looked up, the answers
// they receive, and the peer's reflected paths forgotten once idle.
#include "clocksync/engine_impl.h"

#include <arpa/inet.h>

#include <algorithm>
#include <string>

#include "core/log.h"

namespace shunt::clocksync {

using namespace detail;

int ProbeEngine::add_source_path(std::string_view peer, int rail, uint16_t src_port, std::string* err) {
  auto fail = [&](std::string why) {
    if (err) *err = std::move(why);
    return 0;
  };
  if (rail < 0 || size_t(rail) >= cfg_.local_addrs.size())
    return fail("no rail " + std::to_string(rail) + " (" + std::to_string(cfg_.local_addrs.size()) + " rails)");
  if (src_port == cfg_.port) return fail("source port " + std::to_string(src_port) + " is the probe port");
  // Bound before taking the lock (the engine thread keeps running meanwhile).
  auto sock = std::make_unique<ProbeSocket>();
  std::string why;
  if (!sock->open(cfg_.local_addrs[rail], src_port, cfg_.want_hw, &why, /*reuse_addr=*/false))
    return fail(why);
  int id;
  {
    std::lock_guard lk(mu_);
    Peer* p = nullptr;
    for (auto& q : peers_)
      if (q->name == peer) p = q.get();
    if (!p) return fail("unknown peer " + std::string(peer));
    if (size_t(rail) >= p->paths.size() || p->paths[rail].remote.sin_addr.s_addr == 0)
      return fail("peer " + p->name + " has no address on rail " + std::to_string(rail));
    size_t n = 0;
    for (auto& q : p->sources) n += !q->reflected;
    if (n >= kMaxSourcePaths)
      return fail("peer " + p->name + " has " + std::to_string(n) + " source paths, the most allowed");
    auto sp = std::make_unique<SourcePath>(cfg_.pair_tol_ns);
    id = sp->id = next_source_id_++;
    sp->peer = p->index;
    sp->rail = rail;
    sp->port = sock->port();
    sp->sock = std::move(sock);
    sp->ps.remote = p->paths[rail].remote;
    // Its queue is judged against the rail path's base and noise: the same
    // two hosts, probed since the peer was added, likely before the job
    // that asks for this path loaded the fabric.
    sp->ps.view.seed_queue(ts_.now(), p->paths[rail].view);
    sp->ps.next_seq = random_seq();
    sp->round = unsigned(id);  // the source paths take turns over the rounds
    log::info("clocksync: source path {} to {} rail {} from {}:{}", id, p->name, rail,
              cfg_.local_addrs[rail], sp->port);
    watch(sp->sock->fd(), kSourceTag | uint32_t(id));
    p->sources.push_back(std::move(sp));
  }
  return id;
}

bool ProbeEngine::remove_source_path(int id) {
  // Out of the epoll set, then closed, under the lock: the engine thread
  // finds a source path's events by id, so one that came before this finds
  // nothing.
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (size_t k = 0; k < p->sources.size(); k++)
      if (!p->sources[k]->reflected && p->sources[k]->id == id) {
        unwatch(p->sources[k]->sock->fd());
        p->sources.erase(p->sources.begin() + long(k));
        return true;
      }
  return false;
}

bool ProbeEngine::set_source_path_spare(int id, bool spare) {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (auto& sp : p->sources) {
      if (sp->reflected || sp->id != id) continue;
      if (sp->spare == spare) return true;
      const int before = every_of(cfg_, *sp);
      sp->spare = spare;
      if (every_of(cfg_, *sp) < before) {
        const int64_t now = ts_.now();
        sp->grace_every = now < sp->grace_until ? std::max(sp->grace_every, before) : before;
        sp->grace_until = now + cfg_.dead_ns * before;
        sp->round = 0;  // its pair in the next round
      }
      return true;
    }
  return false;
}

std::optional<SourcePathStats> ProbeEngine::source_path(int id) const {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (auto& sp : p->sources)
      if (!sp->reflected && sp->id == id)
        return SourcePathStats{sp->id, sp->rail, sp->port, false, sp->spare, sp->ps.view.stats(ts_.now())};
  return std::nullopt;
}

void ProbeEngine::handle_source(SourcePath& sp, const Probe& pr, const sockaddr_in& from, int64_t rx) {
  // Only the peer it goes to answers a source path, from its probe port.
  Peer& p = *peers_[sp.peer];
  if (from.sin_port != htons(cfg_.port) || find_peer(pr.sender_id, from, sp.rail) != &p) {
    ctr_.dropped_unknown++;
    return;
  }
  path_probe(p, sp.ps, sp.filter, pr, rx, false);
}

void ProbeEngine::forget_reflected(Peer& p, size_t k) {
  SourcePath* sp = p.sources[k].get();
  auto& pend = pending_[sp->rail];
  pend.erase(std::remove_if(pend.begin(), pend.end(), [&](const Pending& x) { return x.sp == sp; }),
             pend.end());
  p.sources.erase(p.sources.begin() + long(k));
}

}  // namespace shunt::clocksync
