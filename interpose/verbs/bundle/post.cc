// Posting: a WR onto a path (keys mirrored for another rail), fences, the held queue, owed completions and SHUNT_SPREAD=auto's periods.
#include "interpose/verbs/bundle/parts.h"

#include "core/mono.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

// Completions shunt owes the application (a WR the peer executed on a path
// that then failed), returned by the next ibv_poll_cq of their CQ.
std::mutex g_stash_mu;
std::deque<std::pair<ibv_cq*, ibv_wc>>* g_stash = nullptr;

namespace {

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    default: return IBV_WC_SEND;
  }
}

}  // namespace

void stash(ibv_cq* cq, const ibv_wc& w) {
  std::lock_guard g(g_stash_mu);
  if (!g_stash) g_stash = new std::deque<std::pair<ibv_cq*, ibv_wc>>;
  g_stash->emplace_back(cq, w);
  g_stash_n.fetch_add(1);
}

void owe(Bundle* b, const Copy& cp, ibv_wc_status st) {
  if (cp.own) return;
  ibv_wc w{};
  w.wr_id = cp.wr.wr_id;
  w.status = st;
  w.opcode = wc_opcode(cp.wr.opcode);
  w.qp_num = b->pqp->qp_num;
  if (cp.wr.opcode == IBV_WR_RDMA_READ)
    for (int i = 0; i < cp.wr.num_sge; i++)
      w.byte_len += (cp.more.empty() ? cp.sge[i] : cp.more[i]).length;
  stash(b->pqp->send_cq, w);
  b->synthesized++;
}

namespace {

// Another NIC's keys: a WR posted on a rail path carries the lkeys of the
// MRs' mirrors there and, one-sided, the peer's rkey on its NIC of the
// rail. false: a key has no mirror (an rkey the peer has not told yet is
// noted, for the failover worker to ask). Under b->lk.
bool lkeys_on(const Bundle* b, int rail, const ibv_sge* in, int n, ibv_sge* out) {
  if (n > kMaxRailSge) return false;
  for (int i = 0; i < n; i++) {
    out[i] = in[i];
    if (!mirror_lkey(b->pqp->context, in[i].lkey, b->rails[rail].r, &out[i].lkey)) return false;
  }
  return true;
}

bool keys_on(Bundle* b, int rail, const ibv_send_wr* w, ibv_send_wr* out, ibv_sge* sg) {
  *out = *w;
  out->next = nullptr;
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  if (!(w->send_flags & IBV_SEND_INLINE) && w->num_sge > 0) {
    if (!lkeys_on(b, rail, w->sg_list, w->num_sge, sg)) return false;
    out->sg_list = sg;
  }
  uint32_t* rkey = nullptr;
  switch (w->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      if (len) rkey = &out->wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: rkey = &out->wr.atomic.rkey; break;
    default: break;
  }
  if (!rkey) return true;
  auto& m = b->rails[rail].rkeys;
  auto it = m.find(*rkey);
  if (it == m.end()) {
    b->need_rkeys = true;
    return false;
  }
  *rkey = it->second;
  return true;
}

}  // namespace

// Whether w can go on path pi as it is (always on the application's NIC).
bool fits(Bundle* b, int pi, const ibv_send_wr* w) {
  const Path& p = pi == kPrimary ? b->prim : b->paths[pi];
  if (!p.rail) return true;
  ibv_send_wr t;
  ibv_sge sg[kMaxRailSge];
  return keys_on(b, p.rail, w, &t, sg);
}

// Posts receives on path p, one by one with their keys on a rail path.
int post_recvs_on(Bundle* b, Path& p, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (!p.rail) return p.pc->orig.post_recv(p.qp, wr, bad);
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    ibv_recv_wr t = *w;
    ibv_sge sg[kMaxRailSge];
    t.next = nullptr;
    if (!lkeys_on(b, p.rail, w->sg_list, w->num_sge, sg)) {
      *bad = w;
      return EINVAL;
    }
    t.sg_list = sg;
    ibv_recv_wr* x = nullptr;
    if (int rc = p.pc->orig.post_recv(p.qp, &t, &x)) {
      *bad = w;
      return rc;
    }
    rail_expect(1);
  }
  return 0;
}

namespace {

constexpr uint64_t kAutoFirst = 3;     // periods each mode is tried before either is chosen
constexpr uint64_t kAutoExplore = 16;  // then every this many-th choice tries the other mode
constexpr double kAutoMargin = 0.05;   // the other mode takes over only when this much faster

}  // namespace

// Nothing of the bundle in flight or waiting. Under b->lk.
bool bundle_drained(const Bundle* b) {
  if (!b->held.empty() || !drained(b->prim)) return false;
  for (const auto& p : b->paths)
    if (!drained(p)) return false;
  return true;
}

void open_period(Bundle* b) {
  b->period_open = true;
  b->period_mode = -1;
  b->period_start_ns = mono_ns();
  b->period_bytes = 0;
}

// The bundle drained: the period's ns per byte goes to its mode's average
// (a period without a large WRITE tells neither). Under b->lk.
void close_period(Bundle* b) {
  b->period_open = false;
  if (b->period_mode < 0 || b->period_bytes == 0) return;
  const double x = static_cast<double>(mono_ns() - b->period_start_ns) / static_cast<double>(b->period_bytes);
  double& a = b->auto_npb[b->period_mode];
  a = a > 0 ? 0.7 * a + 0.3 * x : x;
  b->auto_periods[b->period_mode]++;
}

// The mode of a period that has a large WRITE to place: each mode first
// kAutoFirst times (split first), then the faster one (the one chosen last
// time unless the other is kAutoMargin faster), except every
// kAutoExplore-th choice, which tries the other: the faster mode changes
// with what else crosses the fabric. Under b->lk.
int auto_choose(Bundle* b) {
  const uint64_t n = ++b->auto_choices;
  if (b->auto_periods[0] < kAutoFirst || b->auto_periods[1] < kAutoFirst)
    return b->auto_periods[1] <= b->auto_periods[0] ? 1 : 0;
  int best = b->auto_best >= 0 ? b->auto_best : (b->auto_npb[1] < b->auto_npb[0] ? 1 : 0);
  if (b->auto_npb[1 - best] < b->auto_npb[best] * (1 - kAutoMargin)) best = 1 - best;
  if (best != b->auto_best)
    b->mail.put({Report::Kind::spread_mode, 0, best, static_cast<float>(1024 * b->auto_npb[1]),
                 static_cast<float>(1024 * b->auto_npb[0])});
  b->auto_best = best;
  return n % kAutoExplore == 0 ? 1 - best : best;
}

int post_on(Bundle* b, ContextRecord* c, int target, Copy* from, ibv_send_wr* w) {
  bool sig = signaled(b, *w);
  ibv_send_wr one;
  ibv_send_wr* post = w;
  if (w->next || (sig && !(w->send_flags & IBV_SEND_SIGNALED))) {  // post this WR alone, as asked
    one = *w;
    one.next = nullptr;
    if (sig) one.send_flags |= IBV_SEND_SIGNALED;
    post = &one;
  }
  ibv_send_wr* bad = nullptr;
  Path& p = P(b, target);
  bool starts = p.posted == p.done;
  if (b->spread_auto && !b->period_open) open_period(b);
  ibv_send_wr tw;
  ibv_sge tsg[kMaxRailSge];
  if (p.rail) {
    if (!keys_on(b, p.rail, post, &tw, tsg)) return EINVAL;
    post = &tw;
  }
  int rc = (p.pc ? p.pc : c)->orig.post_send(p.qp, post, &bad);
  if (rc) return rc;
  if (p.rail && sig) rail_expect(1);
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  const ibv_wr_opcode op = w->opcode;
  const uint64_t wr_id = w->wr_id;
  if (starts) p.flow_start_ns = mono_ns(), p.flow_bytes = 0;
  if (b->period_open) b->period_bytes += len;
  p.posted++;
  Copy& cp = p.infl.push();
  if (from) {
    cp = std::move(*from);  // w pointed into *from: not used below
  } else {
    cp.take(w);
    cp.cseq = 0;
    cp.posted = false;
    cp.own = false;
    cp.group = 0;
  }
  cp.seq = p.posted;
  if (!cp.posted && consumes(op)) cp.cseq = ++b->cseq;
  cp.posted = true;
  if (sig) p.signaled.push() = {p.posted, cp.own ? kSeg : kApp, wr_id, cp.own ? mono_ns() : 0};
  p.last_signaled = sig;
  b->last = target;
  p.wrs++;
  p.bytes += len;
  if (target == kPrimary) {
    b->to_primary++;
    return 0;
  }
  p.flow_bytes += len;
  if (p.rec) {  // the path's own counters, as for any QP (the shared shard)
    bump_locked(p.rec->s.hot[kShards].send_wrs[static_cast<unsigned>(op) & (kWrOpcodes - 1)], 1);
    bump_locked(p.rec->s.hot[kShards].send_bytes, len);
  }
  return 0;
}

namespace {

// Shunt's own zero-byte WR (fences, probes): a WRITE, no rkey is checked
// (C9-88), but the responder still wants the QP's remote write access; a
// READ where the peer's QP allows only reads; none where it allows neither
// (an application of SENDs only, like ibv_rc_pingpong).
int own_opcode(const Bundle* b) {
  int a = b->peer_access >= 0 ? b->peer_access : b->access;
  if (a & IBV_ACCESS_REMOTE_WRITE) return IBV_WR_RDMA_WRITE;
  if (a & IBV_ACCESS_REMOTE_READ) return IBV_WR_RDMA_READ;
  return -1;
}

}  // namespace

// Makes sure the path will report when it drains.
void fence(Bundle* b, ContextRecord* c, int path) {
  Path& p = P(b, path);
  if (p.last_signaled || p.down()) return;
  const int op = own_opcode(b);
  if (op < 0) return;
  ibv_send_wr f{};
  ibv_send_wr* bad = nullptr;
  f.opcode = static_cast<ibv_wr_opcode>(op);
  f.send_flags = IBV_SEND_SIGNALED;
  if ((p.pc ? p.pc : c)->orig.post_send(p.qp, &f, &bad) != 0) return;
  if (p.rail) rail_expect(1);
  p.posted++;
  p.signaled.push() = {p.posted, kFence, 0};
  p.last_signaled = true;
  b->fences++;
}

void hold(Bundle* b, const ibv_send_wr* w) {
  Copy& h = b->held.push();
  h.take(w);
  h.cseq = 0;
  h.posted = false;
  h.own = false;
  h.group = 0;
  b->held_total++;
}

int next_live(Bundle* b, int from) {
  int n = static_cast<int>(b->paths.size());
  for (int k = 1; k <= n; k++) {
    int i = ((from % n) + n + k) % n;
    if (usable(b->paths[i])) return i;
  }
  return kNone;
}

// At a drain point: the path whose flowlets drained fastest per byte
// lately (an unmeasured one first), so paths through a congested spine get
// less; every fourth pick goes round robin, to keep every estimate fresh.
int next_flowlet_path(Bundle* b) {
  int n = static_cast<int>(b->paths.size());
  int from = b->last < 0 ? b->cur : b->last;
  int best = next_live(b, from);
  if (best == kNone || b->picks++ % 4 == 3) return best;
  for (int k = 1; k <= n; k++) {
    int i = (from + k) % n;
    if (usable(b->paths[i]) && b->paths[i].ns_per_byte < b->paths[best].ns_per_byte) best = i;
  }
  return best;
}

}  // namespace shunt::verbs::bundle
