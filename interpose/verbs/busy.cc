#include "interpose/verbs/busy.h"

#include <arpa/inet.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <random>
#include <string>

#include "interpose/verbs/rails.h"
#include "interpose/verbs/registry.h"
#include "telemetry/rhythm.h"

namespace shunt::verbs {

namespace {
// Sampler state of one QP record. Agent thread only.
struct Seen {
  int64_t at_ms = -1;
  uint64_t sent = 0;    // sig_sends at the last look
  uint64_t err = 0;     // error completions at the last look
  uint64_t offset = 0;  // outstanding WRs written off (an error completion ends a QP's sends)
  bool active = false, was_active = false;  // had work (or sent) at this look, at the one before
  int64_t stretch_from = -1, stretch_to = -1;  // the current stretch of work: from the look before its first, to its last
};

// A stretch of work out on a QP that lasted ms: into its transfer histogram.
void transfer_done(const QpRecord& r, int64_t ms) {
  size_t i = 0;
  while (i < telemetry::kTransferBucketsMs.size() && ms > telemetry::kTransferBucketsMs[i]) i++;
  r.transfers[i].fetch_add(1, std::memory_order_relaxed);
  r.transfer_ms.fetch_add(static_cast<uint64_t>(ms), std::memory_order_relaxed);
}
std::atomic<uint64_t> g_step_ends{0};

uint64_t errors(const QpStats& s) {
  uint64_t n = 0;
  for (const auto& e : s.wc_status) n += get(e);
  return n;
}
}  // namespace

int sample_busy(int64_t now_ms) {
  // By position: for_each_qp visits the records in the order they were
  // made, and they are never freed nor reordered.
  static auto* seen = new std::vector<Seen>;  // never freed: exit races the agent thread
  int busy = 0;
  size_t i = 0;
  for_each_qp([&](const QpRecord& r) {
    if (i == seen->size()) seen->push_back(Seen{});
    Seen& s = (*seen)[i++];
    if (r.destroyed.load(std::memory_order_relaxed) || r.shadow_of || r.type != IBV_QPT_RC) {
      s.active = s.was_active = false;
      return;
    }
    const uint64_t sent = total(r.s, [](const HotCounters& h) -> auto& { return h.sig_sends; });
    const uint64_t ok = total(r.s, [](const HotCounters& h) -> auto& { return h.send_done; });
    const uint64_t err = errors(r.s);
    // After an error completion the QP's sends are flushed or never
    // complete: what is out then is written off, so the QP is not busy for good.
    if (err != s.err) s.offset = sent > ok ? sent - ok : 0;
    s.err = err;
    const uint64_t out = sent > ok + s.offset ? sent - ok - s.offset : 0;
    if (s.at_ms >= 0 && out > 0 && now_ms > s.at_ms) {
      r.busy_ms.fetch_add(static_cast<uint64_t>(now_ms - s.at_ms), std::memory_order_relaxed);
    }
    const bool active = out > 0 || sent != s.sent;
    // A stretch begins at the look before its first (a look after a long
    // idle gap: 20 ms before it), as busy time is credited.
    if (active) {
      if (!s.active) s.stretch_from = s.at_ms >= 0 && now_ms - s.at_ms <= 100 ? s.at_ms : now_ms - 20;
      s.stretch_to = now_ms;
    } else if (s.active && s.stretch_from >= 0) {
      transfer_done(r, std::max<int64_t>(0, s.stretch_to - s.stretch_from));
    }
    s.was_active = s.active;
    s.active = active;
    busy += s.active;
    s.at_ms = now_ms;
    s.sent = sent;
  });
  // Every QP idle after some had work: the end of a step's communication;
  // those that had work at the look before finished last.
  static bool was_busy = false;  // agent thread only
  if (busy == 0 && was_busy) {
    g_step_ends.fetch_add(1, std::memory_order_relaxed);
    size_t j = 0;
    for_each_qp([&](const QpRecord& r) {
      if (j < seen->size() && (*seen)[j++].was_active) r.last_steps.fetch_add(1, std::memory_order_relaxed);
    });
  }
  was_busy = busy > 0;
  telemetry::process_rhythm().look(now_ms, busy > 0);
  return busy;
}

namespace {
// A GID as an address: the IPv4 of an IPv4-mapped GID (RoCE v2), else the
// IPv6 text; "" for a GID that is no IP address (link-local InfiniBand).
void gid_text(const ibv_gid& g, char* out, size_t n) {
  out[0] = 0;
  if (std::string v4; gid_v4(g, &v4))
    snprintf(out, n, "%s", v4.c_str());
  else if (g.raw[0] != 0xfe || (g.raw[1] & 0xc0) != 0x80)  // fe80::/10 says nothing of the route
    inet_ntop(AF_INET6, g.raw, out, static_cast<socklen_t>(n));
}
}  // namespace

void note_addresses(QpRecord* r, const ibv_qp_attr* attr, int mask) {
  if (!r || !r->qp || !(mask & IBV_QP_AV) || !attr->ah_attr.is_global) return;
  gid_text(attr->ah_attr.grh.dgid, r->peer_addr, sizeof r->peer_addr);
  ibv_gid sgid{};
  if (ibv_query_gid(r->qp->context, attr->ah_attr.port_num ? attr->ah_attr.port_num : 1, attr->ah_attr.grh.sgid_index,
                    &sgid) == 0)
    gid_text(sgid, r->local_addr, sizeof r->local_addr);
}

uint64_t step_ends() { return g_step_ends.load(std::memory_order_relaxed); }

int64_t busy_next_ms(int64_t now_ms, int busy_qps, int64_t idle_ms) {
  // Quick for a while after the last activity: a job between two steps has
  // nothing out for a moment, and a look a second later would miss the next
  // step's transfers whole.
  static int64_t last_active = -1;  // agent thread only
  if (busy_qps > 0) last_active = now_ms;
  if (last_active < 0 || now_ms - last_active > 10000) return now_ms + idle_ms;
  static thread_local std::minstd_rand rng{std::random_device{}()};
  return now_ms + 12 + static_cast<int64_t>(rng() % 17);  // 12..28 ms: no lock-step with the job's rhythm
}

}  // namespace shunt::verbs
