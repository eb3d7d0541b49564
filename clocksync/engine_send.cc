// The probe engine's send path (engine.cc has the rest): which pairs are
// due in a round, their probes (follow-up, feedback and gossip) and their
// sending, one by one or batched per socket, and the kernel's send stamps
// matched back to them.
#include "clocksync/engine_impl.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <span>

namespace shunt::clocksync {

using namespace detail;

void ProbeEngine::drain_stamps(ProbeSocket& s, std::vector<Pending>& pend, SourcePath* own,
                               int rail) {
  s.drain_send_stamps([&](int64_t id, int64_t ns) {
    auto it = std::find_if(pend.begin(), pend.end(), [&](const Pending& x) { return x.id == id; });
    if (it == pend.end()) return;
    Pending pd = *it;
    pend.erase(it);
    PathState* ps = nullptr;
    if (own) {
      ps = &own->ps;
    } else if (pd.peer < int(peers_.size())) {
      Peer& p = *peers_[pd.peer];
      if (!pd.sp && size_t(rail) < p.paths.size()) ps = &p.paths[rail];
      for (auto& q : p.sources)
        if (pd.sp && q.get() == pd.sp) ps = &q->ps;
    }
    if (!ps) return;
    TxPair& tp = ps->tx[pd.seq % kRing];
    int64_t local = ts_.local(ns);
    // A stamp far from when we sent is not ours (counter out of step).
    if (tp.seq != pd.seq || std::llabs(local - tp.app) > 1'000'000'000) return;
    tp.tx[pd.idx] = local;
    ctr_.tx_stamps++;
  });
}

void ProbeEngine::send_due(int64_t now, bool deferred) {
  std::vector<bool> sent(socks_.size(), false);
  // A rail socket's pairs (each due peer's rail pair, then the answers of
  // reflected paths) go out in one system call per socket and round where
  // the kernel stamps them; a user-space stamp is taken right after its
  // own pair's call.
  std::vector<std::vector<Queued>> batch(socks_.size());
  auto rail_pair = [&](int peer_idx, const Out& o) {
    if (o.sock->mode() == StampMode::user) return send_pair(peer_idx, o, now);
    batch[size_t(o.rail)].emplace_back();
    prepare_pair(peer_idx, o, now, &batch[size_t(o.rail)].back());
  };
  for (auto& p : peers_) {
    if (p->next_send > now) continue;
    // The rails go out together every `turn` rounds: rail_every, but no
    // more than twice the peer's rails, so the clock estimate gets a pair
    // every other round on average at least. The thread wakes only for the
    // rounds where something is due: every `step` rounds, the greatest
    // common divisor of the cadences (4 with the defaults: rails and source
    // paths every 4th, spares every 12th; a peer with one rail, 2). A path
    // goes out in the round whose span of `step` rounds holds a multiple of
    // its cadence.
    int addressed = 0;
    for (auto& ps : p->paths) addressed += ps.remote.sin_addr.s_addr != 0;
    const int turn = std::clamp(2 * addressed, 1, rail_every(cfg_));
    int step = turn;
    for (auto& sp : p->sources)
      if (!sp->reflected) step = std::gcd(step, every_of(cfg_, *sp));
    auto due = [step](unsigned& round, int every) {
      const unsigned r = round % unsigned(every);
      round += unsigned(step);
      return r == 0 || r + unsigned(step) > unsigned(every);
    };
    if (due(p->rail_round, turn))
      for (size_t r = 0; r < p->paths.size(); r++)
        if (p->paths[r].remote.sin_addr.s_addr != 0) {
          rail_pair(p->index, {socks_[r].get(), &p->paths[r], &pending_[r], nullptr, int(r), true});
          sent[r] = true;
        }
    // Source paths after the rail paths' pairs, on the same schedule.
    for (auto& sp : p->sources) {
      if (sp->reflected) {
        // One answer to each pair of the peer's (both probes of a pair may
        // have come since our last round): its cadence, spare or not, is
        // the peer's to choose.
        if (!sp->owed) continue;
        sp->owed = false;
        rail_pair(p->index, {socks_[sp->rail].get(), &sp->ps, &pending_[sp->rail], sp.get(), sp->rail, false});
        sent[sp->rail] = true;
        continue;
      }
      if (!due(sp->round, every_of(cfg_, *sp))) continue;  // not its round
      if (p->paths[sp->rail].remote.sin_addr.s_addr == 0) continue;
      sp->ps.remote = p->paths[sp->rail].remote;  // add_peer may have renamed/readdressed it
      send_pair(p->index, {sp->sock.get(), &sp->ps, &sp->pending, nullptr, sp->rail, false}, now);
      if (!deferred && sp->sock->mode() != StampMode::user) drain_stamps(*sp->sock, sp->pending, sp.get(), sp->rail);
    }
    // Keep the schedule, with a little jitter so hosts do not phase-lock.
    p->round_ns = cfg_.interval_ns * step;
    p->next_send += p->round_ns;
    if (p->next_send <= now) p->next_send = now + p->round_ns;
    p->next_send += std::uniform_int_distribution<int64_t>(0, cfg_.interval_ns / 20)(jitter_) - cfg_.interval_ns / 40;
  }
  for (auto& b : batch) send_queued(b);
  // Software send stamps are queued by the time send() returns: collect them
  // now rather than in a wakeup of their own (hardware ones come later, on
  // POLLERR). While reads are deferred they wait for the next due time's
  // read, which finds them with the datagrams (EPOLLERR) before the next
  // pair needs them: a recvmmsg fewer per socket and round (on a one-CPU
  // soft-RoCE guest a system call costs tens of microseconds).
  if (deferred) return;
  for (size_t r = 0; r < socks_.size(); r++)
    if (sent[r] && socks_[r]->mode() != StampMode::user) drain_stamps(*socks_[r], pending_[r], nullptr, int(r));
}

void ProbeEngine::send_pair(int peer_idx, const Out& o, int64_t now) {
  Queued q;
  prepare_pair(peer_idx, o, now, &q);
  int64_t ids[2];
  o.sock->send_pair(o.ps->remote, {q.b[0].data(), q.n[0]}, {q.b[1].data(), q.n[1]}, ids);
  pair_sent(q, ids);
}

// Several pairs from one socket (qs: one rail socket's) in one system call,
// each pair's two datagrams back to back as send_pair sends them.
void ProbeEngine::send_queued(std::vector<Queued>& qs) {
  if (qs.empty()) return;
  std::vector<const sockaddr_in*> to;
  std::vector<std::span<const uint8_t>> data;
  for (const Queued& q : qs)
    for (int k = 0; k < 2; k++) {
      to.push_back(&q.o.ps->remote);
      data.push_back({q.b[k].data(), q.n[k]});
    }
  std::vector<int64_t> ids(to.size());
  qs.front().o.sock->send_many(to, data, ids.data());
  for (size_t k = 0; k < qs.size(); k++) pair_sent(qs[k], &ids[2 * k]);
  qs.clear();
}

void ProbeEngine::prepare_pair(int peer_idx, const Out& o, int64_t now, Queued* q) {
  Peer& p = *peers_[peer_idx];
  PathState& ps = *o.ps;
  Probe pr;
  pr.path = uint8_t(o.rail);
  pr.sender_id = self_id_;
  // A peer found by address does not know our id for it yet: 0 is "whoever
  // listens on this address" until its first probe tells us its id.
  pr.receiver_id = p.by_address && !p.id_confirmed ? 0 : p.id;
  pr.seq = ps.next_seq++;
  pr.tx_app_ns = now;
  const TxPair& prev = ps.tx[(pr.seq - 1) % kRing];
  if (prev.seq == pr.seq - 1 && prev.tx[0] && prev.tx[1]) {
    pr.fu_seq = prev.seq;
    pr.fu_tx0 = prev.tx[0];
    pr.fu_tx1 = prev.tx[1];
  }
  // Feedback: the two newest pairs we received from this peer on this path.
  const RxPair* top[2] = {nullptr, nullptr};  // newest first
  for (const RxPair& r : ps.rx) {
    if (r.seq == kNoSeq) continue;
    if (!top[0] || r.seq > top[0]->seq) {
      top[1] = top[0];
      top[0] = &r;
    } else if (!top[1] || r.seq > top[1]->seq) {
      top[1] = &r;
    }
  }
  // A pair heard but not taken first (path_probe), once: the peer proves
  // with it that it hears us.
  if (ps.heard.seq != kNoSeq) {
    pr.feedback[pr.n_feedback++] = {ps.heard.seq, ps.heard.rx[0], ps.heard.rx[1], ps.rx_count};
    ps.heard = RxPair{};
  }
  for (const RxPair* r : top)
    if (r && pr.n_feedback < kMaxFeedback) pr.feedback[pr.n_feedback++] = {r->seq, r->rx[0], r->rx[1], ps.rx_count};
  // Gossip: our direct estimates of other peers, a few per probe, in turn.
  if (o.gossip && peers_.size() > 1) {
    for (size_t k = 0; k < peers_.size() && pr.n_gossip < kMaxGossip; k++) {
      const Peer& q = *peers_[(p.gossip_cursor + k) % peers_.size()];
      const ClockModel& m = q.est.model();
      if (&q == &p || !m.valid) continue;
      Gossip& g = pr.gossip[pr.n_gossip++];
      g.peer_id = q.id;
      g.offset_ns = std::llround(m.offset_at(now));
      g.drift_ps_s = std::llround(m.drift * 1e12);
      g.bound_ns = uint32_t(std::min(4e9, m.bound_at(now)));
      g.age_ms = uint32_t(std::min<int64_t>(UINT32_MAX, (now - m.t_ref) / 1'000'000));
    }
    p.gossip_cursor = int((p.gossip_cursor + kMaxGossip) % peers_.size());
  }
  q->peer_idx = peer_idx;
  q->o = o;
  q->seq = pr.seq;
  q->now = now;
  q->n[0] = encode(pr, cfg_.key, q->b[0]);
  pr.idx = 1;
  q->n[1] = encode(pr, cfg_.key, q->b[1]);
  ps.tx[pr.seq % kRing] = TxPair{pr.seq, {0, 0}, now};
}

// After the pair left (ids[i]: its datagrams' stamp ids, -1 if not sent).
void ProbeEngine::pair_sent(const Queued& q, const int64_t ids[2]) {
  const Out& o = q.o;
  PathState& ps = *o.ps;
  TxPair& tp = ps.tx[q.seq % kRing];
  ProbeSocket& s = *o.sock;
  for (int i = 0; i < 2; i++) {
    if (ids[i] < 0) {
      ctr_.send_errors++;
      continue;
    }
    ctr_.sent++;
    ctr_.bytes_sent += q.n[i] + 28;
    if (s.mode() == StampMode::user) {
      tp.tx[i] = ts_.now();
      continue;
    }
    auto& pend = *o.pend;
    if (pend.size() >= kPendingMax) pend.erase(pend.begin());
    pend.push_back({ids[i], q.peer_idx, q.seq, i, o.sp});
  }
  ps.view.on_sent(q.now, q.seq);
}

}  // namespace shunt::clocksync
