// The probe engine's receive path (engine.cc has the rest): probes read,
// checked and sorted to their peer and path, gossip kept, and on each path
// the replay window, liveness and the one-way delays that feed the peer's
// clock estimate (path_probe).
#include "clocksync/engine_impl.h"

#include <arpa/inet.h>

#include <algorithm>
#include <functional>
#include <span>

#include "core/log.h"

namespace shunt::clocksync {

using namespace detail;

int ProbeEngine::receive(ProbeSocket& s, int rail, SourcePath* own) {
  static_assert(ProbeSocket::kMaxDatagram > kMaxProbeSize);
  const bool ignore = !probing_.load() || quiet(ts_.now());
  return s.recv_all(256, [&](std::span<const uint8_t> d, const sockaddr_in& from, int64_t rx_ns) {
    if (ignore) return;
    ctr_.received++;
    Probe pr;
    DecodeStatus st = d.size() > kMaxProbeSize ? DecodeStatus::short_or_long : decode(d, cfg_.key, &pr);
    if (st == DecodeStatus::bad_tag) {
      ctr_.dropped_auth++;
      // Most often a host of the job that made a key of its own; said once
      // per address (a flood of forged ones stops at the bound).
      if (bad_key_from_.size() < 256 && bad_key_from_.insert(from.sin_addr.s_addr).second) {
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
        log::warn("clocksync: probes from {} fail this job's key: every host of a job needs the same "
                  "SHUNT_JOB_KEY (or SHUNT_JOB_KEY_FILE on a shared file system)",
                  ip);
      }
      return;
    }
    if (st != DecodeStatus::ok || rx_ns == 0 || pr.path != rail ||
        (pr.receiver_id != 0 && pr.receiver_id != self_id_)) {
      ctr_.dropped_malformed++;
      return;
    }
    if (own)
      handle_source(*own, pr, from, ts_.local(rx_ns));
    else
      handle(rail, pr, from, ts_.local(rx_ns));
  });
}

ProbeEngine::Peer* ProbeEngine::find_peer(uint64_t id, const sockaddr_in& from, int rail) {
  for (auto& p : peers_)
    if (p->id == id) return p.get();
  // A peer known only by address (add_peer from a connection) learns its id here.
  for (auto& p : peers_)
    if (!p->id_confirmed && size_t(rail) < p->paths.size() &&
        p->paths[rail].remote.sin_addr.s_addr == from.sin_addr.s_addr) {
      p->id = id;
      return p.get();
    }
  return nullptr;
}

void ProbeEngine::handle(int rail, const Probe& pr, const sockaddr_in& from, int64_t rx) {
  Peer* p = find_peer(pr.sender_id, from, rail);
  if (!p || size_t(rail) >= p->paths.size()) {
    ctr_.dropped_unknown++;
    return;
  }
  if (from.sin_port != htons(cfg_.port)) {
    // From another port than the probe port: one of the peer's source paths.
    // We answer it (reflected) from our probe port to that port.
    SourcePath* sp = nullptr;
    size_t n = 0;
    for (auto& q : p->sources) {
      if (!q->reflected) continue;
      n++;
      if (q->rail == rail && q->ps.remote.sin_port == from.sin_port &&
          q->ps.remote.sin_addr.s_addr == from.sin_addr.s_addr)
        sp = q.get();
    }
    if (!sp) {
      if (n >= kMaxSourcePaths) {
        ctr_.dropped_unknown++;
        return;
      }
      auto q = std::make_unique<SourcePath>(cfg_.pair_tol_ns);
      q->peer = p->index;
      q->rail = rail;
      q->port = ntohs(from.sin_port);
      q->reflected = true;
      q->ps.remote = from;
      q->ps.next_seq = random_seq();
      q->last_rx = rx;
      sp = q.get();
      p->sources.push_back(std::move(q));
    }
    // Answered when heard but not taken too: the answer's feedback is how
    // the peer proves it hears us (path_probe).
    const Taken t = path_probe(*p, sp->ps, sp->filter, pr, rx, false);
    if (t == Taken::yes) sp->last_rx = rx;
    if (t != Taken::dropped) sp->owed = true;
    return;
  }
  if (path_probe(*p, p->paths[rail], p->filter, pr, rx, true) != Taken::yes) return;
  // Gossip about hosts we also probe.
  for (int k = 0; k < pr.n_gossip; k++) {
    const Gossip& g = pr.gossip[k];
    if (g.peer_id == self_id_ || g.peer_id == p->id) continue;
    auto it = std::find_if(p->heard.begin(), p->heard.end(), [&](const Heard& h) { return h.id == g.peer_id; });
    if (it == p->heard.end()) {
      if (p->heard.size() >= size_t(cfg_.max_peers)) continue;
      it = p->heard.insert(p->heard.end(), Heard{});
    }
    *it = Heard{g.peer_id, double(g.offset_ns), double(g.drift_ps_s) * 1e-12, double(g.bound_ns),
                pr.tx_app_ns, rx};
  }
}

namespace {
// Whether `pr` names, in its feedback, a pair of ours on this path that is
// among our last kRing and that no probe taken so far had named: it was
// made after the peer received that pair, so it is no replay. Our sequence
// numbers start at random (random_seq), so no earlier probe can name one.
bool names_new_pair(const PathState& ps, const Probe& pr) {
  for (int k = 0; k < pr.n_feedback; k++) {
    const Feedback& f = pr.feedback[k];
    if (f.seq == kNoSeq || (ps.fwd_any && f.seq <= ps.last_fwd)) continue;
    if (ps.tx[f.seq % kRing].seq == f.seq) return true;
  }
  return false;
}
}  // namespace

// A probe that passed the checks, on one path: receive and replay
// bookkeeping, liveness, and the one-way delays its stamps complete. `clock`:
// the samples also feed the peer's clock estimate (rail paths only).
//
// Replays: the window is the peer's newest pair taken and the kRing before
// it; a pair in it is taken once, a pair up to kMaxAhead past it advances
// it. Any other pair (an older one, a restarted peer's, one far ahead:
// every probe is authenticated, so a peer's or a replay) is taken only if
// it names a pair of ours no probe had named yet (names_new_pair), and the
// window then starts over at it. Else it is heard, not taken: our next
// pair's feedback names it, the restarted peer's answer names that pair,
// and the window moves there, a send round or two after the restart. So
// no sequence number, however large, holds the window, and a replayed
// probe (which names only pairs already named, or none of ours) is never
// taken outside the window.
ProbeEngine::Taken ProbeEngine::path_probe(Peer& pe, PathState& ps, PairFilter& filter, const Probe& pr,
                                           int64_t rx, bool clock) {
  Peer* p = &pe;
  RxPair& slot = ps.rx[pr.seq % kRing];
  const bool in_window = ps.rx_any && pr.seq + kRing > ps.rx_max && pr.seq <= ps.rx_max + kMaxAhead;
  if (!in_window) {
    if (!names_new_pair(ps, pr)) {
      if (ps.heard.seq != pr.seq) ps.heard = RxPair{pr.seq, {0, 0}};
      ps.heard.rx[pr.idx] = rx;
      ctr_.dropped_replay++;
      return Taken::heard;
    }
    ps.rx.fill(RxPair{});
    ps.rx_any = false;
    ps.rev_any = false;
    ps.heard = RxPair{};
    ps.view.on_peer_restart();
  } else if (slot.seq == pr.seq && slot.rx[pr.idx] != 0) {
    ctr_.dropped_replay++;
    return Taken::dropped;
  }
  p->id_confirmed = true;
  if (p->last_heard && rx - p->last_heard > silent_gap(cfg_)) p->resumed_at = std::max(p->resumed_at, rx);
  p->last_heard = std::max(p->last_heard, rx);
  if (slot.seq != pr.seq) slot = RxPair{pr.seq, {0, 0}};
  slot.rx[pr.idx] = rx;
  ps.rx_max = ps.rx_any ? std::max(ps.rx_max, pr.seq) : pr.seq;
  ps.rx_any = true;
  ps.rx_count++;
  ps.view.on_received(rx, pr.seq);
  const ClockModel& m = p->est.model();

  // Reverse sample: the peer's send stamps of its previous pair and our receive stamps.
  if (pr.fu_seq != kNoSeq && (!ps.rev_any || pr.fu_seq > ps.last_rev)) {
    const RxPair& r = ps.rx[pr.fu_seq % kRing];
    if (r.seq == pr.fu_seq) {
      ps.last_rev = pr.fu_seq;
      ps.rev_any = true;
      if (clock && r.rx[0]) {
        p->naive_r = r.rx[0] - pr.fu_tx0;
        p->naive_r_t = r.rx[0];
        p->have_r = true;
      }
      if (auto d = filter.accept({pr.fu_tx0, pr.fu_tx1, r.rx[0], r.rx[1]})) {
        if (clock) p->est.add_reverse({r.rx[0], *d});
        if (m.valid) ps.view.add_delay(rx, false, double(*d) + m.offset_at(r.rx[0]));
      }
    }
  }
  // Forward samples: the peer's receive stamps of our pairs, oldest first.
  int order[kMaxFeedback] = {0, 1};
  if (pr.n_feedback == 2 && pr.feedback[1].seq < pr.feedback[0].seq) std::swap(order[0], order[1]);
  for (int k = 0; k < kMaxFeedback; k++) {
    if (order[k] >= pr.n_feedback) continue;
    const Feedback& f = pr.feedback[order[k]];
    if (f.seq == kNoSeq || (ps.fwd_any && f.seq <= ps.last_fwd)) continue;
    const TxPair& t = ps.tx[f.seq % kRing];
    if (t.seq != f.seq || !t.tx[0] || !t.tx[1]) continue;
    ps.last_fwd = f.seq;
    ps.fwd_any = true;
    ps.view.on_feedback(rx, f.rx_count, f.seq);
    if (clock && f.rx0) {
      p->naive_f = f.rx0 - t.tx[0];
      p->naive_f_t = t.tx[0];
      p->have_f = true;
    }
    if (auto d = filter.accept({t.tx[0], t.tx[1], f.rx0, f.rx1})) {
      if (clock) p->est.add_forward({t.tx[0], *d});
      if (m.valid) ps.view.add_delay(rx, true, double(*d) - m.offset_at(t.tx[0]));
    }
    // The queue detector takes every pair, queued ones above all (the pair
    // filter keeps those that met no queue): the lesser of its two delays,
    // against the clock model once it exists, else raw (the offset is
    // constant enough over seconds; PathView rebases the detector on the
    // model when it appears).
    if (f.rx0 && f.rx1) {
      const double raw = double(std::min(f.rx0 - t.tx[0], f.rx1 - t.tx[1]));
      const std::function<double(int64_t)> offset = [&m](int64_t at) { return m.offset_at(at); };
      ps.view.add_queue_sample(rx, raw, m.valid ? &offset : nullptr);
    }
  }
  return Taken::yes;
}

}  // namespace shunt::clocksync
