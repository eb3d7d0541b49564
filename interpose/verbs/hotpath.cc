// The patched ctx->ops entries. They run on every WR and completion, so:
// no lock, no allocation, no logging, no locked instruction in the common
// case; a cached or lock-free lookup and a few counter adds, then the
// provider's own function.
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/rails.h"
#include "interpose/verbs/registry.h"

#include <sched.h>

#include <functional>
#include <mutex>

namespace shunt::verbs {

namespace {
std::atomic<int> g_next_shard{0};
__attribute__((tls_model("initial-exec"))) thread_local int tl_shard = -1;

// One-entry cache of the last QP this thread posted to. g_qp_generation
// moves on every destroy, so a cached record of a destroyed QP (whose
// address may come back for a new one) is never used.
struct QpCache {
  const ibv_qp* qp = nullptr;
  uint64_t gen = 0;
  QpRecord* rec = nullptr;
};
__attribute__((tls_model("initial-exec"))) thread_local QpCache tl_qp;
__attribute__((tls_model("initial-exec"))) thread_local unsigned tl_mirror_skip = 0;

inline QpRecord* lookup_qp(const ibv_qp* qp) {
  uint64_t gen = qp_generation();
  if (tl_qp.qp == qp && tl_qp.gen == gen) return tl_qp.rec;
  QpRecord* r = find_qp(qp);
  tl_qp = {qp, gen, r};
  return r;
}

inline QpStats& stats_for(QpRecord* r, ContextRecord* c) { return r ? r->s : c->untracked; }

void count_send(QpStats& s, const ibv_send_wr* wr, const ibv_send_wr* stop, bool sig_all) {
  int sh = thread_shard();
  bool ex = sh < kShards;
  HotCounters& h = s.hot[sh];
  uint64_t bytes = 0, sig = 0;
  for (; wr && wr != stop; wr = wr->next) {
    bump(h.send_wrs[static_cast<unsigned>(wr->opcode) & (kWrOpcodes - 1)], 1, ex);
    sig += sig_all || (wr->send_flags & IBV_SEND_SIGNALED);
    for (int i = 0; i < wr->num_sge; i++) bytes += wr->sg_list[i].length;
  }
  bump(h.send_bytes, bytes, ex);
  if (sig) bump(h.sig_sends, sig, ex);
}

uint64_t count_recv(const ibv_recv_wr* wr, const ibv_recv_wr* stop) {
  uint64_t n = 0;
  for (; wr && wr != stop; wr = wr->next) n++;
  return n;
}
}  // namespace

int thread_shard() {
  int s = tl_shard;
  if (__builtin_expect(s < 0, 0)) {
    s = g_next_shard.fetch_add(1, std::memory_order_relaxed);
    if (s > kShards) s = kShards;
    tl_shard = s;
  }
  return s;
}

int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  QpRecord* r = lookup_qp(qp);
  ContextRecord* c = r ? r->ctx : find_context(qp->context);
  Bundle* b = r ? r->bundle.load(std::memory_order_acquire) : nullptr;
  int ret = b ? bundle_post_send(b, c, qp, wr, bad) : c->orig.post_send(qp, wr, bad);
  QpStats& s = stats_for(r, c);
  count_send(s, wr, ret ? *bad : nullptr, r && r->sq_sig_all);
  if (ret) add(s.send_post_errors, 1);
  return ret;
}

int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  QpRecord* r = lookup_qp(qp);
  ContextRecord* c = r ? r->ctx : find_context(qp->context);
  Bundle* b = r ? r->bundle.load(std::memory_order_acquire) : nullptr;
  int ret = b ? bundle_post_recv(b, c, qp, wr, bad) : c->orig.post_recv(qp, wr, bad);
  QpStats& s = stats_for(r, c);
  int sh = thread_shard();
  bump(s.hot[sh].recv_wrs, count_recv(wr, ret ? *bad : nullptr), sh < kShards);
  if (ret) add(s.recv_post_errors, 1);
  return ret;
}

int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  ContextRecord* c = find_context(srq->context);
  int ret = c->orig.post_srq_recv(srq, wr, bad);
  add(c->srq_recv_wrs, count_recv(wr, ret ? *bad : nullptr));
  return ret;
}

namespace {
// A failover drains CQs itself (the application may not be polling): while
// it does, every poll of the application takes g_cq_mu, and the drain
// starts only once no poll that missed the flag is still running.
std::atomic<int> g_polls{0}, g_drainers{0};
std::mutex g_cq_mu;
}  // namespace

int poll_body(ContextRecord* c, ibv_cq* cq, int n, ibv_wc* wc, bool owed_first) {
  int owed = 0;
  if (owed_first && __builtin_expect(g_stash_n.load(std::memory_order_relaxed) > 0, 0))
    owed = bundle_unstash(cq, n, wc);
  int got = 0;
  if (owed < n) {
    got = c->orig.poll_cq(cq, n - owed, wc + owed);
    if (got < 0) return owed ? owed : got;
    if (got > 0 && (g_shadow_qps.load(std::memory_order_relaxed) > 0 || g_retired_any.load(std::memory_order_relaxed)))
      got = bundle_filter(c, wc + owed, got);
    // The bundles' paths on other NICs: their CQs are polled at every call
    // while completions are expected there, else at every 16th (an empty
    // poll of a second CQ at every call cost soft-RoCE jobs ~7%). A drain
    // (owed_first false) polls them every time: it must leave them empty.
    if (__builtin_expect(g_mirror_cqs.load(std::memory_order_relaxed) > 0, 0) && owed + got < n &&
        (!owed_first || g_rail_expect.load(std::memory_order_relaxed) > 0 || (++tl_mirror_skip & 15) == 0))
      got += poll_mirrors(cq, n - owed - got, wc + owed + got);
  }
  got += owed;
  if (got <= 0) return got;
  int sh = thread_shard();
  bool ex = sh < kShards;
  QpRecord* r = nullptr;
  uint32_t last_qpn = UINT32_MAX;
  for (int i = owed; i < got; i++) {  // (owed ones were counted when shunt polled them, or are shunt's own)
    const ibv_wc& w = wc[i];
    if (w.qp_num != last_qpn) {  // completions of one QP come in runs
      r = find_qp_by_num(c, w.qp_num);
      last_qpn = w.qp_num;
    }
    QpStats& s = stats_for(r, c);
    HotCounters& h = s.hot[sh];
    bump(h.completions, 1, ex);
    if (w.status != IBV_WC_SUCCESS) {
      add(s.wc_status[static_cast<unsigned>(w.status) & (kWcStatuses - 1)], 1);
    } else if (w.opcode & IBV_WC_RECV) {
      bump(h.recv_completions, 1, ex);
      bump(h.recv_bytes, w.byte_len, ex);
    } else {
      bump(h.send_done, 1, ex);
    }
  }
  return got;
}

int poll_cq(ibv_cq* cq, int n, ibv_wc* wc) {
  ContextRecord* c = find_context(cq->context);
  if (__builtin_expect(g_shadow_qps.load(std::memory_order_relaxed) == 0, 1)) return poll_body(c, cq, n, wc, true);
  g_polls.fetch_add(1);
  if (g_drainers.load()) {
    g_polls.fetch_sub(1);
    std::lock_guard l(g_cq_mu);
    return poll_body(c, cq, n, wc, true);
  }
  int got = poll_body(c, cq, n, wc, true);
  g_polls.fetch_sub(1);
  return got;
}

void drain_cq(ContextRecord* c, ibv_cq* cq, const std::function<void(const ibv_wc&)>& keep) {
  g_drainers.fetch_add(1);
  while (g_polls.load() > 0) sched_yield();
  {
    std::lock_guard l(g_cq_mu);
    ibv_wc wc[16];
    for (int k = 0; k < 100000; k++) {
      int got = poll_body(c, cq, 16, wc, false);
      for (int i = 0; i < got; i++) keep(wc[i]);
      if (got < 16) break;
    }
  }
  g_drainers.fetch_sub(1);
}

int req_notify_cq(ibv_cq* cq, int solicited_only) {
  ContextRecord* c = find_context(cq->context);
  add(c->notify_calls, 1);
  return c->orig.req_notify_cq(cq, solicited_only);
}

}  // namespace shunt::verbs
