// Spreading: a large WRITE split over the paths, and the route of each WR (flowlet, split or the carrier).
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/mono.h"
#include "core/runtime.h"


namespace shunt::verbs::bundle {

namespace {

// Whether split group g's segments have all completed (a failed path's
// were requeued, ahead of the tail: no longer the group's).
bool group_done(Bundle* b, uint64_t g) {
  for (const auto& x : b->groups) {
    if (x.id != g) continue;
    for (const auto& [pi, seq] : x.segs)
      if (P(b, pi).done < seq) return false;
    return true;
  }
  return true;
}

void forget_group(Bundle* b, uint64_t g) {
  for (auto it = b->groups.begin(); it != b->groups.end(); ++it)
    if (it->id == g) {
      b->groups.erase(it);
      return;
    }
}

// The bytes [off, off + len) of an SGE list, as SGEs into out; their count.
int cut_sges(const ibv_sge* in, int n, uint64_t off, uint64_t len, ibv_sge* out) {
  int k = 0;
  for (int i = 0; i < n && len; i++) {
    uint64_t l = in[i].length;
    if (off >= l) {
      off -= l;
      continue;
    }
    uint64_t take = std::min<uint64_t>(l - off, len);
    out[k++] = {in[i].addr + off, static_cast<uint32_t>(take), in[i].lkey};
    len -= take;
    off = 0;
  }
  return k;
}

constexpr uint64_t kSplitTail = 4096;    // what the application's own WR keeps
constexpr uint64_t kMinSegment = 8192;  // the head has at least this per path

// Whether w may be split, by what needs no path: its opcode and flags, its
// length (into *len_out), the held queue and the groups still writing.
// Under b->lk.
bool may_split(Bundle* b, const ibv_send_wr* w, const Copy* slot, uint64_t* len_out) {
  if (!b->split || (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)) return false;
  if ((w->send_flags & IBV_SEND_INLINE) || w->num_sge < 1 || w->num_sge > kMaxRailSge) return false;
  if (two_sided_waits(b->move)) return false;
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  if (len < b->split_min || len < kSplitTail + 2 * kMinSegment) return false;
  if (!slot)
    for (size_t i = 0; i < b->held.size(); i++)
      if (!b->held[i].group) return false;  // an application WR waits: keep the order
  const uint64_t ra = w->wr.rdma.remote_addr;
  for (const auto& g : b->groups)
    if (g.rkey == w->wr.rdma.rkey && ra < g.raddr + g.len && g.raddr < ra + len) return false;
  *len_out = len;
  return true;
}

// The usable shadows w fits on, into on, rotated to start on the next path;
// their count, or 0: not split (too few for the length, or auto chose pin).
// After a failure, only those proven since (every path is probed then,
// and a live one answers within a round trip): a path behind the same
// fault holds its segment, and with it the message's tail, until its own
// failure is found a second or more later. Until two are proven, for a
// stall time at most, nothing is split. Under b->lk.
int split_paths(Bundle* b, const ibv_send_wr* w, uint64_t len, int* on) {
  int k = 0, proven = 0;
  for (size_t i = 0; i < b->paths.size() && k < 64; i++) {
    const Path& p = b->paths[i];
    if (!usable(p) || !fits(b, static_cast<int>(i), w)) continue;
    on[k] = static_cast<int>(i);
    if (p.proven_ms >= b->fail_ms) std::swap(on[proven++], on[k]);  // the proven ones first
    k++;
  }
  if (b->fail_ms && proven < k) {
    if (proven >= 2) k = proven;
    else if (mono_ms() - b->fail_ms < config().num(Param::stall_ms)) return 0;
  }
  k = static_cast<int>(std::min<uint64_t>(k, (len - kSplitTail) / kMinSegment));
  if (k < 2) return 0;
  if (b->spread_auto) {  // split or pin: chosen once per busy period
    if (!b->period_open) open_period(b);
    if (b->period_mode < 0) b->period_mode = auto_choose(b);
    if (b->period_mode == 0) return 0;
  }
  // Each split starts on the next path: the device sends the segments in
  // the order they were posted, so the first path's segment is out first
  // and completes first whatever its share. Always from path 0, latency
  // steering took that for a fast path and grew its share to the bound.
  std::rotate(on, on + static_cast<int>(b->group_ids % static_cast<uint64_t>(k)), on + k);
  return k;
}

// Sets the k paths' shares for this split; their sum. Under b->lk.
// Each path's share of the head follows how long its segments take to
// complete against the others' (mostly the queue they wait in): a path
// through a busier spine gets less, one through an idle spine more, until
// the queues even out; paths behind the same queue keep their shares.
// Shares stay within 1/4..4 of their mean, so no path's estimate goes stale.
// With SHUNT_STEER=queue the failover worker steers the shares by the
// paths' forward queues instead (steer_tick), and they stay where it left
// them (equal at first) while the probes know too little: segment
// latencies on a loaded host walk the shares as far as the bounds before
// any queue is known; SHUNT_STEER=off keeps them equal.
double set_shares(Bundle* b, const int* on, int k) {
  double raw = 0, sum = 0, lsum = 0;
  int ln = 0;
  const bool latency = b->steer && !b->steer_queue;
  if (latency)
    for (int j = 0; j < k; j++)
      if (b->paths[on[j]].seg_lat > 0) lsum += b->paths[on[j]].seg_lat, ln++;
  const bool by_latency = latency && ln == k;
  for (int j = 0; j < k; j++) {
    Path& p = b->paths[on[j]];
    if (by_latency) p.share *= std::pow(lsum / ln / p.seg_lat, 0.25);
    raw += p.share;
  }
  for (int j = 0; j < k; j++) {
    Path& p = b->paths[on[j]];
    sum += p.share = std::clamp(p.share * k / raw, 0.25, 4.0);
  }
  return sum;
}

// The head bytes each of the k paths should take, into want. Under b->lk.
// The carrier's own bytes (the tails, whatever is not split) cross its
// router as well: the shadows there take that much less of the head,
// so that each router carries its paths' shares of all the bundle's
// bytes, not of the heads only. A message like this one brings the
// carrier its part of the bundle's bytes so far (c: the tails, and
// messages too small to split); the routers' shares apply to head + c,
// and the carrier's router's shadows give up c between them. Two split
// jobs whose application QPs met on one spine had that spine full and
// the other at 88% without it (bench/bundles.sh). Where the carrier's
// router is not known, shares alone.
void head_wants(Bundle* b, const int* on, int k, uint64_t len, uint64_t head, double sum, double* want) {
  const Path& cp = P(b, b->carrier);
  const int crail = b->carrier == kPrimary ? 0 : cp.rail;
  uint64_t all = b->prim.bytes;
  for (const auto& p : b->paths) all += p.bytes;
  // Counted from the first split with this carrier: until the shadows
  // were up every byte went on the application's QP.
  if (b->bal_carrier != b->carrier || b->bal_all > all) {
    b->bal_carrier = b->carrier;
    b->bal_all = all;
    b->bal_carrier_bytes = cp.bytes;
  }
  const uint64_t cbytes = cp.bytes - std::min(cp.bytes, b->bal_carrier_bytes);
  all -= b->bal_all;
  double on_router = 0;
  auto there = [&](const Path& p) { return !cp.router.empty() && p.router == cp.router && p.rail == crail; };
  for (int j = 0; j < k; j++)
    if (there(b->paths[on[j]])) on_router += b->paths[on[j]].share;
  // (auto: the tail alone; its pinned periods put whole messages on the
  // carrier, and those are no part of a split's balance)
  const double c = on_router <= 0 || !all ? 0
                   : b->spread_auto ? static_cast<double>(len - head)
                                    : static_cast<double>(len) * static_cast<double>(cbytes) / static_cast<double>(all);
  for (int j = 0; j < k; j++) {
    const Path& p = b->paths[on[j]];
    const double fair = static_cast<double>(head) * p.share / sum;
    double n = (static_cast<double>(head) + c) * p.share / sum - (there(p) ? c * p.share / on_router : 0);
    want[j] = std::clamp(n, fair / 4, fair * 4);
  }
}

// Posts the head's segments on the k paths, as group grp; the bytes posted
// (0: none, not split). Under b->lk.
uint64_t post_segments(Bundle* b, ContextRecord* c, const ibv_send_wr* w, const int* on, int k, const double* want,
                       uint64_t len, uint64_t head, SplitGroup* grp_out) {
  SplitGroup& grp = *grp_out;
  const uint64_t ra = w->wr.rdma.remote_addr;
  uint64_t off = 0;
  const int last = b->last;
  grp.id = ++b->group_ids;
  grp.raddr = ra;
  grp.len = len;
  grp.rkey = w->wr.rdma.rkey;
  for (int j = 0; j < k; j++) {
    uint64_t n = static_cast<uint64_t>(want[j]) & ~uint64_t(63);
    n = std::max<uint64_t>(n, 64);
    if (j + 1 == k || off + n > head) n = head - off;
    if (n == 0) break;
    ibv_sge sg[kMaxRailSge];
    ibv_send_wr s{};
    s.opcode = IBV_WR_RDMA_WRITE;
    s.send_flags = IBV_SEND_SIGNALED;
    s.sg_list = sg;
    s.num_sge = cut_sges(w->sg_list, w->num_sge, off, n, sg);
    s.wr.rdma.remote_addr = w->wr.rdma.remote_addr + off;
    s.wr.rdma.rkey = w->wr.rdma.rkey;
    Copy seg;
    seg.take(&s);
    seg.own = true;
    if (post_on(b, c, on[j], &seg, seg.get()) != 0) break;  // the tail takes what is left
    grp.segs.emplace_back(on[j], b->paths[on[j]].posted);
    off += n;
  }
  b->last = last;  // the group orders what follows, not the last segment's path
  return off;
}

// The tail: w's bytes from off on, with its opcode, immediate, flags and
// wr_id, into *slot or the back of the held queue; the group counted and
// kept. Under b->lk.
void hold_tail(Bundle* b, const ibv_send_wr* w, Copy* slot, uint64_t off, uint64_t len, SplitGroup* grp_in) {
  SplitGroup& grp = *grp_in;
  ibv_sge sg[kMaxRailSge];
  ibv_send_wr t = *w;
  t.next = nullptr;
  t.sg_list = sg;
  t.num_sge = cut_sges(w->sg_list, w->num_sge, off, len - off, sg);
  t.wr.rdma.remote_addr = w->wr.rdma.remote_addr + off;
  Copy tail;
  tail.take(&t);
  tail.group = grp.id;
  *(slot ? slot : &b->held.push()) = std::move(tail);
  b->splits++;
  b->segments += grp.segs.size();
  b->groups.push_back(std::move(grp));
}

}  // namespace

// SHUNT_SPREAD=split: w, an RDMA WRITE or WRITE_WITH_IMM of at least
// SHUNT_SPLIT_MIN_BYTES, goes out as segments on every usable shadow at
// once: plain WRITEs, shunt's own (signaled, never seen), one split group.
// Its last kSplitTail bytes, with the application's opcode, immediate,
// flags and wr_id (the tail), wait in the held queue until every segment
// of the group has completed, and then go where pin puts them. So the peer
// sees the message, and the application the WRITE's completion, only after
// all of its data landed; whatever the application posts after it waits
// behind the tail as on one QP, except the next split: its segments may go
// while earlier tails wait (their paths keep each path's order; a WRITE
// may land before an earlier message is seen, as when pin or flowlet put
// it on another path), but not when it writes where an earlier group
// still does. The tail goes into *slot (w's own held copy, at the front)
// or, null, at the back of the held queue, behind tails only. false: not
// split, nothing done. Under b->lk.
bool split(Bundle* b, ContextRecord* c, const ibv_send_wr* w, Copy* slot) {
  uint64_t len = 0;
  if (!may_split(b, w, slot, &len)) return false;
  int on[64];
  const int k = split_paths(b, w, len, on);
  if (k < 2) return false;
  const double sum = set_shares(b, on, k);
  const uint64_t head = len - kSplitTail;
  double want[64];
  head_wants(b, on, k, len, head, sum, want);
  SplitGroup grp;
  const uint64_t off = post_segments(b, c, w, on, k, want, len, head, &grp);
  if (off == 0) return false;
  hold_tail(b, w, slot, off, len, &grp);
  return true;
}

namespace {

// A usable path w can go on as it is (its keys known there), or kNone.
int fitting_path(Bundle* b, const ibv_send_wr* w) {
  for (size_t i = 0; i < b->paths.size(); i++)
    if (usable(b->paths[i]) && fits(b, static_cast<int>(i), w)) return static_cast<int>(i);
  return kNone;
}

}  // namespace

// Where w goes: kPrimary or a path; kWait: it waits (a fence, or a move of
// the carrier).
int route(Bundle* b, ContextRecord* c, const ibv_send_wr* w) {
  int target;
  if (two_sided(w->opcode)) {
    if (two_sided_waits(b->move) || P(b, b->carrier).down() || !fits(b, b->carrier, w)) return kWait;
    target = b->carrier;
  } else if (!b->flowlet && !two_sided_waits(b->move) && usable(P(b, b->carrier)) && fits(b, b->carrier, w)) {
    target = b->carrier;  // pin: with the two-sided work, never fenced
  } else {
    if (b->flowlet && (b->last == kPrimary || drained(P(b, b->last)))) b->cur = next_flowlet_path(b);
    if (b->cur < 0 || !usable(b->paths[b->cur])) b->cur = next_live(b, b->cur < 0 ? 0 : b->cur);
    target = b->cur;
    if (target != kNone && !fits(b, target, w)) target = fitting_path(b, w);
    if (target == kNone) {  // every shadow failed: the carrier takes it all
      b->cur = 0;
      if (two_sided_waits(b->move) || P(b, b->carrier).down() || !fits(b, b->carrier, w)) return kWait;
      target = b->carrier;
    }
  }
  if (target != b->last && b->last != kPrimary && !drained(P(b, b->last))) {
    fence(b, c, b->last);
    return kWait;
  }
  return target;
}

void flush_held(Bundle* b, ContextRecord* c) {  // under b->lk
  while (!b->held.empty()) {
    Copy& h = b->held.front();
    ibv_send_wr* w = h.get();
    if (h.group && !group_done(b, h.group)) return;  // a split's tail waits for its segments
    if (!h.posted && !h.group && split(b, c, w, &h)) continue;  // the front is its tail now
    int target = route(b, c, w);
    if (target == kWait) return;
    if (h.group) forget_group(b, h.group), h.group = 0;
    if (int rc = post_on(b, c, target, &h, w)) {
      // Its post returned 0 long ago: the application learns of it as it
      // would of a WR its device failed, by an error completion, not by a
      // wait that never ends.
      b->mail.put({Report::Kind::held_failed, 0, rc});
      owe(b, h, IBV_WC_LOC_QP_OP_ERR);
    }
    b->held.pop_front();
  }
}

}  // namespace shunt::verbs::bundle
