// The data path's entry points: ibv_post_send, ibv_post_recv and ibv_poll_cq of a QP with a bundle.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>

#include "core/mono.h"
#include "core/runtime.h"

namespace shunt::verbs {

using namespace bundle;

std::atomic<int> g_shadow_qps{0};
std::atomic<uint64_t> g_stale_wcs{0};

std::atomic<int> g_stash_n{0};

bool bundle_active(const Bundle* b) { return b->active.load(std::memory_order_acquire); }

int bundle_post_send(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard l(b->lk);
  if (!b->active.load(std::memory_order_relaxed) || b->move == Move::gave_up) {
    if (b->move == Move::gave_up || !b->tracking.load(std::memory_order_relaxed)) return c->orig.post_send(qp, wr, bad);
    // Not active yet: on the application's QP, but numbered and kept from
    // the start, so a failover soon after activation can replay them.
    for (ibv_send_wr* w = wr; w; w = w->next)
      if (int rc = post_on(b, c, kPrimary, nullptr, w)) {
        *bad = w;
        return rc;
      }
    return 0;
  }
  // What waits (behind a fence, or through a failover) is bounded as the
  // application's send queue is: past its depth, a post fails as on a full queue.
  const size_t cap = b->primary->max_send_wr ? b->primary->max_send_wr : kMaxHeld;
  for (ibv_send_wr* w = wr; w; w = w->next) {
    if (split(b, c, w, nullptr)) continue;
    int target = b->held.empty() ? route(b, c, w) : kWait;
    if (target == kWait) {
      if (b->held.size() >= cap) {
        *bad = w;
        return ENOMEM;
      }
      hold(b, w);
      continue;
    }
    if (int rc = post_on(b, c, target, nullptr, w)) {
      *bad = w;
      return rc;
    }
  }
  return 0;
}

int bundle_post_recv(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard l(b->lk);
  if (!b->tracking.load(std::memory_order_relaxed) || b->move == Move::gave_up) return c->orig.post_recv(qp, wr, bad);
  size_t before = b->recvs.size();
  for (ibv_recv_wr* w = wr; w; w = w->next) b->recvs.push().take(w);
  if (b->rcarrier == kNone) return 0;  // moving: posted on the new carrier with the rest
  int rc = b->rcarrier == kPrimary ? c->orig.post_recv(qp, wr, bad) : post_recvs_on(b, P(b, b->rcarrier), wr, bad);
  if (rc) {  // forget the ones not posted
    size_t ok = 0;
    for (ibv_recv_wr* w = wr; w && w != *bad; w = w->next) ok++;
    while (b->recvs.size() > before + ok) b->recvs.pop_back();
  }
  return rc;
}

namespace {

// What the completion filter decided of one completion of a bundle's QP.
struct Verdict {
  bool drop = false;    // shunt's to handle: the application never sees it
  bool report = false;  // the bundle's mailbox has a report: wake the worker
  uint8_t kind = kApp;  // whose WR completed (a signaled one shunt numbered)
};

// An error completion on path p (null: a path not known): a failed path's
// errors are shunt's to handle; the first fails its path, and the failure
// goes to the mailbox. Under b->lk.
void on_error(Bundle* b, Path* p, int pi, const ibv_wc& w, Verdict* v) {
  if (!p || b->move == Move::gave_up) return;
  if (!p->down()) {
    if (!b->active.load(std::memory_order_relaxed)) return;
    After a;
    path_failed(b, pi, w.status, &a);
    for (auto [x, st] : a.down) b->mail.put({Report::Kind::path_down, static_cast<int16_t>(x), st});
    v->report = !a.down.empty();
  }
  v->drop = true;
  b->swallowed++;
}

// A signaled WR shunt numbered on path p completed, and every WR before
// it: a probe proves a renewed path (its return goes to the mailbox); a
// segment, and a flowlet that drained, time the path. Under b->lk.
void on_signaled(Bundle* b, Path* p, int pi, const ibv_wc& w, Verdict* v) {
  const Signaled& s = p->signaled.front();
  v->kind = s.kind;
  if (s.kind == kProbe) {
    if (unproven(p->life)) {
      b->mail.put({Report::Kind::path_up, static_cast<int16_t>(pi)});
      v->report = true;
    }
    p->step(LifeEvent::probe_done);
    p->proven_ms = mono_ms();  // (a probe's completion only: rare)
  }
  if (s.kind == kSeg && w.status == IBV_WC_SUCCESS) {  // how long the path took to carry it
    double lat = static_cast<double>(mono_ns() - s.t);
    p->seg_lat = p->seg_lat > 0 ? 0.8 * p->seg_lat + 0.2 * lat : lat;
  }
  p->done = s.seq;
  p->signaled.pop_front();
  while (!p->infl.empty() && p->infl.front().seq <= p->done) p->infl.pop_front();
  if (drained(*p) && p->flow_bytes > 0) {  // a flowlet ended: how fast did it drain?
    double x = static_cast<double>(mono_ns() - p->flow_start_ns) / static_cast<double>(p->flow_bytes);
    p->ns_per_byte = p->ns_per_byte > 0 ? 0.75 * p->ns_per_byte + 0.25 * x : x;
    p->flow_bytes = 0;
  }
  if (b->period_open && drained(*p) && bundle_drained(b)) close_period(b);
}

// One completion of path pi of b. Under b->lk.
Verdict judge(Bundle* b, int pi, const ibv_wc& w) {
  Verdict v;
  const bool known = pi == kPrimary || pi < static_cast<int>(b->paths.size());
  Path* p = known ? &P(b, pi) : nullptr;
  if (w.status != IBV_WC_SUCCESS) {
    on_error(b, p, pi, w, &v);
  } else if (w.opcode & IBV_WC_RECV) {
    if (b->tracking.load(std::memory_order_relaxed)) {
      if (!b->recvs.empty()) b->recvs.pop_front();
      b->consumed++;
    }
  } else if (p && p->down() && b->move != Move::gave_up) {
    // A late success on a path taken out of service without an error
    // (a stall): its WRs are shunt's to replay or to owe, by their copies.
    v.drop = true;
  } else if (p && !p->signaled.empty() && (pi != kPrimary || p->signaled.front().wr_id == w.wr_id)) {
    on_signaled(b, p, pi, w, &v);
  }
  return v;
}

// The bundle of a completion's QP (null: none, the application's as it
// is); *skip: shunt's own, of no bundle (a doorbell, a destroyed shadow's).
Bundle* owner(ContextRecord* c, QpRecord* r, const ibv_wc& w, bool* skip) {
  *skip = false;
  if (r && r->doorbell_pending) {  // shunt's doorbell: it woke the application, nothing to see
    r->doorbell_pending->store(false);
    *skip = true;
    return nullptr;
  }
  Bundle* b = r ? (r->shadow_of ? r->shadow_of : r->bundle.load(std::memory_order_acquire)) : nullptr;
  if (!r && g_retired_any.load(std::memory_order_relaxed) && is_retired(c, w.qp_num)) {
    g_stale_wcs.fetch_add(1, std::memory_order_relaxed);  // left behind by a destroyed shadow
    *skip = true;
  }
  return b;
}

}  // namespace

// Inside the application's ibv_poll_cq: never logs, never starts a thread.
// What it finds of the paths (a failure, a renewed path back) changes
// their state at once, under b->lk, and goes to the bundle's mailbox,
// which the failover worker reports.
int bundle_filter(ContextRecord* c, ibv_wc* wc, int n) {
  int out = 0;
  Bundle *touched = nullptr, *pending_flush = nullptr;
  for (int i = 0; i < n; i++) {
    QpRecord* r = find_qp_by_num(c, wc[i].qp_num);
    bool skip;
    Bundle* b = owner(c, r, wc[i], &skip);
    if (skip) continue;
    if (!b) {
      if (out != i) wc[out] = wc[i];
      out++;
      continue;
    }
    Verdict v;
    {
      std::lock_guard l(b->lk);
      v = judge(b, r->shadow_of ? r->path : kPrimary, wc[i]);
      if (!b->held.empty() && touched != b) {
        if (touched) pending_flush = touched;  // rare: two bundles in one batch
        touched = b;
      }
    }
    if (v.report) signal_worker(b);
    if (pending_flush) {
      std::lock_guard l(pending_flush->lk);
      flush_held(pending_flush, c);
      pending_flush = nullptr;
    }
    const bool own = v.kind == kFence || v.kind == kProbe || v.kind == kSeg;
    if (v.drop || (own && wc[i].status == IBV_WC_SUCCESS)) continue;
    wc[i].qp_num = b->pqp->qp_num;
    if (out != i) wc[out] = wc[i];
    out++;
  }
  if (touched) {
    std::lock_guard l(touched->lk);
    flush_held(touched, c);
  }
  return out;
}

int shadow_cq_depth(int cqe, int paths, int max_cqe) {
  if (cqe < 1 || paths < 1 || (max_cqe > 0 && cqe >= max_cqe)) return cqe;
  int64_t want = int64_t(cqe) * (1 + paths) + 4 * int64_t(paths) + 8;
  if (max_cqe > 0) want = std::min<int64_t>(want, max_cqe);
  return static_cast<int>(std::min<int64_t>(want, INT32_MAX));
}

int cq_depth_for(ibv_context* ctx, int cqe) {
  if (current_mode() != Mode::active || !ctx) return cqe;
  ibv_device_attr da{};
  int max_cqe = ibv_query_device(ctx, &da) == 0 ? da.max_cqe : 0;
  return shadow_cq_depth(cqe, static_cast<int>(config().num(Param::paths_per_rail)), max_cqe);
}

int bundle_unstash(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard g(g_stash_mu);
  int k = 0;
  if (!g_stash) return 0;
  for (auto it = g_stash->begin(); it != g_stash->end() && k < n;) {
    if (it->first != cq) {
      ++it;
      continue;
    }
    wc[k++] = it->second;
    it = g_stash->erase(it);
    g_stash_n.fetch_sub(1);
  }
  return k;
}

}  // namespace shunt::verbs
