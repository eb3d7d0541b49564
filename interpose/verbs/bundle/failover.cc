// Failover: a failed path's work posted again elsewhere, and the two halves of a carrier move (receives, then sends).
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>

#include <cstring>

#include "core/mono.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

namespace {

// The path's WRs in flight from index `from` on go back to the front of the
// held queue, in order, to be posted again on live paths; an atomic gets
// its error instead (it may have executed). Then the path has nothing in
// flight. Returns how many WRs are to be posted again. Under b->lk.
size_t requeue(Bundle* b, int pi, size_t from) {
  Path& p = P(b, pi);
  size_t again = 0, atomics = 0;
  for (auto& g : b->groups)  // its segments go again ahead of every tail: no longer waited for here
    std::erase_if(g.segs, [pi](const auto& x) { return x.first == pi; });
  for (size_t i = p.infl.size(); i-- > from;) {
    ibv_wr_opcode op = p.infl[i].wr.opcode;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      owe(b, p.infl[i], IBV_WC_RETRY_EXC_ERR);
      atomics++;
      continue;
    }
    b->replayed_bytes += p.infl[i].bytes();
    b->held.push_front() = std::move(p.infl[i]);
    again++;
  }
  if (atomics) event_atomics_failed(b, atomics);
  b->replayed += again;
  p.infl.clear();
  p.signaled.clear();
  p.done = p.posted;
  if (b->last == pi) b->last = kPrimary;
  return again;
}

// A shadow's WRs after its last known completion are posted again. A
// one-sided WR may have executed already: WRITE and READ are simply
// executed again, and no WR the peer can observe has followed it (the fence).
void replay_local(Bundle* b, int pi) { requeue(b, pi, 0); }

// A failure that counts: the path's, the bundle's, and its rail's. Under
// b->lk, after b->fail_ms was set.
void count_failure(Bundle* b, Path& p) {
  p.fails++;
  b->failovers++;
  b->rail_fail_ms[p.rail] = b->fail_ms;
}

}  // namespace

// A path failed (an error completion on it). Under b->lk.
void path_failed(Bundle* b, int pi, int status, After* a, bool counted) {
  Path& p = P(b, pi);
  if (p.down()) return;
  p.step(LifeEvent::fail);
  b->fail_ms = mono_ms();
  if (counted) count_failure(b, p);
  a->down.emplace_back(pi, status);
  if (pi == b->carrier)
    b->move = next(b->move, MoveEvent::fail);  // two-sided work waits for the peer's agreement
  else
    replay_local(b, pi);
}

std::vector<int> down_list(Bundle* b) {
  std::lock_guard l(b->lk);
  std::vector<int> d;
  for (size_t i = 0; i < b->paths.size(); i++)
    if (b->paths[i].down()) d.push_back(static_cast<int>(i));
  return d;
}

void mark_down(Bundle* b, ContextRecord* c, const json& list) {
  if (!list.is_array()) return;
  std::lock_guard l(b->lk);
  After a;
  for (const auto& x : list) {
    if (!x.is_number_integer()) continue;
    int i = x.get<int>();
    if (i < 0 || i >= static_cast<int>(b->paths.size()) || b->paths[i].down() || i == b->carrier) continue;
    path_failed(b, i, -1, &a);
  }
  flush_held(b, c);
}

// Polls the bundle's CQs empty (shunt's own completions and the bookkeeping
// of every path as usual); what the application must see is kept for its
// next poll, in order. What the completion filter found on the way is
// reported here, on this thread, as it was found.
void drain(Bundle* b) {
  usleep(2000);  // a completion the device was making as the QP changed state
  drain_cq(b->ctx, b->pqp->send_cq, [&](const ibv_wc& w) { stash(b->pqp->send_cq, w); });
  if (b->pqp->recv_cq != b->pqp->send_cq) drain_cq(b->ctx, b->pqp->recv_cq, [&](const ibv_wc& w) { stash(b->pqp->recv_cq, w); });
  if (report_mail(b)) wake_worker(b);
}

// Stops the carrier: no more two-sided work on it, its QP to the error
// state, and every completion it made polled. Returns the old carrier.
int begin_move(Bundle* b, bool planned) {
  int from;
  {
    std::lock_guard l(b->lk);
    b->move = next(b->move, MoveEvent::start);
    from = b->carrier;
    Path& o = P(b, from);
    if (!o.down() && planned) o.step(LifeEvent::stop);
    else if (!o.down()) o.step(LifeEvent::fail), b->fail_ms = mono_ms(), count_failure(b, o);
    b->rcarrier = kNone;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(P(b, from).qp, &a, IBV_QP_STATE);
  drain(b);
  return from;
}

// The old carrier's receives that were not consumed go to the new carrier,
// in order. Returns how many messages this side consumed, or -1.
int64_t move_receives(Bundle* b, int to) {
  std::lock_guard l(b->lk);
  Path& t = P(b, to);
  for (size_t i = 0; i < b->recvs.size(); i++) {
    ibv_recv_wr* bad = nullptr;
    if (int rc = post_recvs_on(b, t, b->recvs[i].get(), &bad)) {
      event_receive_unmoved(b, to, rc);
      return -1;
    }
  }
  b->rcarrier = to;
  return static_cast<int64_t>(b->consumed);
}

// The peer consumed `peer_consumed` messages: the old carrier's WRs up to
// the last of those executed there (their completions are owed), the rest
// are posted again on the new carrier, which takes two-sided work from now.
bool move_sends(Bundle* b, int from, int to, uint64_t peer_consumed, json* info) {
  bool pending_bell = false;
  std::unique_lock l(b->lk);
  Path& o = P(b, from);
  size_t cut = 0;
  for (size_t i = 0; i < o.infl.size(); i++)
    if (o.infl[i].cseq && o.infl[i].cseq <= peer_consumed) cut = i + 1;
  uint64_t expect = b->cseq > peer_consumed ? b->cseq - peer_consumed : 0, have = 0;
  for (size_t i = cut; i < o.infl.size(); i++)
    if (o.infl[i].cseq > peer_consumed) have++;
  if (have != expect) {
    *info = {{"error", "messages " + std::to_string(peer_consumed + 1) + ".." + std::to_string(b->cseq) +
                           " are not all known to shunt (posted before the bundle was active?)"}};
    return false;
  }
  uint64_t owed = 0;
  for (size_t i = 0; i < cut; i++)
    if (signaled(b, o.infl[i].wr)) owe(b, o.infl[i], IBV_WC_SUCCESS), owed++;
  size_t again = requeue(b, from, cut);
  b->carrier = to;
  // The new carrier may have failed while the two sides agreed on it: then
  // its work waits for the next move.
  b->move = next(b->move, MoveEvent::done);
  if (P(b, to).down()) b->move = next(b->move, MoveEvent::fail);
  b->moves++;
  flush_held(b, b->ctx);
  if (owed) {  // a real completion wakes an application waiting in event mode
    Path& t = P(b, to);
    t.last_signaled = false;
    fence(b, b->ctx, to);
    // No fence (the peer's QP allows no remote access): the doorbell, where
    // the CQ has one, lands a completion of shunt's on it instead.
    if (!t.last_signaled && b->pqp->send_cq->channel) pending_bell = true;
  }
  *info = {{"replayed", again}, {"completed", owed}, {"peer_consumed", peer_consumed}};
  l.unlock();
  if (pending_bell) ring_doorbell(b->pqp->send_cq);
  return true;
}

// Nothing can carry the work: the application gets the errors it would
// have had (flushed WRs and receives), and the bundle stops.
void give_up(Bundle* b, const std::string& why) {
  {
    std::lock_guard l(b->lk);
    if (b->move == Move::gave_up) return;
    b->move = next(b->move, MoveEvent::give_up);
    auto flush = [&](Path& p) {
      for (size_t i = 0; i < p.infl.size(); i++)
        if (signaled(b, p.infl[i].wr)) owe(b, p.infl[i], IBV_WC_WR_FLUSH_ERR);
      p.infl.clear();
      p.signaled.clear();
      p.done = p.posted;
    };
    flush(b->prim);
    for (auto& p : b->paths) flush(p);
    for (size_t i = 0; i < b->held.size(); i++)
      if (signaled(b, b->held[i].wr)) owe(b, b->held[i], IBV_WC_WR_FLUSH_ERR);
    b->held.clear();
    b->groups.clear();
    for (size_t i = 0; i < b->recvs.size(); i++) {
      ibv_wc w{};
      w.wr_id = b->recvs[i].wr.wr_id;
      w.status = IBV_WC_WR_FLUSH_ERR;
      w.opcode = IBV_WC_RECV;
      w.qp_num = b->pqp->qp_num;
      stash(b->pqp->recv_cq, w);
    }
    b->recvs.clear();
    b->active.store(false);
  }
  {
    std::lock_guard g(b->mu);
    set_phase(b, Phase::failed, why);
  }
  event_gave_up(b, why);  // the failures seen before, first
}

// give_up on a thread of its own (callers hold locks it takes).
void start_give_up(Bundle* b, std::string why) {
  start_job("bundle give-up", [b, why = std::move(why)] {
    std::lock_guard m(b->move_mu);  // see watch_commit
    if (alive(b)) give_up(b, why);
  });
}

}  // namespace shunt::verbs::bundle
