// Shadow QPs: the rails a bundle has paths on, and creating, connecting and destroying its shadows.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/runtime.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

// The bundle's rails: [0] the application's NIC. Under b->mu.
void init_rails(Bundle* b) {
  if (!b->rails.empty()) return;
  BundleRail z;
  z.c = b->ctx;
  z.device = b->ctx->device;
  z.pd = b->pqp->pd;
  z.scq = b->pqp->send_cq;
  z.rcq = b->pqp->recv_cq;
  z.port = b->port;
  z.pkey = b->pkey;
  z.gid_index = b->rtr.ah_attr.grh.sgid_index;
  z.lgid = b->lgid;
  z.rgid = b->rgid;
  b->rails.push_back(std::move(z));
  b->gid_type = gid_type_of(b->pqp->context, b->port, b->rtr.ah_attr.grh.sgid_index);
}

// A rail of another NIC for the bundle (its mirrors of the application's
// PD and CQs); returns its index, or -1 with *err. Under b->mu.
int add_rail(Bundle* b, Rail* r, std::string* err) {
  for (size_t k = 1; k < b->rails.size(); k++)
    if (b->rails[k].r == r) return static_cast<int>(k);
  BundleRail x;
  x.r = r;
  x.c = r->rec;
  x.device = r->device;
  x.port = r->port;
  x.gid_index = r->gid_index;
  x.lgid = r->gid;
  const LoopAddr at{b->port, b->rtr.ah_attr.grh.sgid_index};
  if (!(x.pd = mirror_pd(b->pqp->pd, r, err)) || !(x.scq = mirror_cq(b->pqp->send_cq, r, at, err)) ||
      !(x.rcq = mirror_cq(b->pqp->recv_cq, r, at, err)))
    return -1;
  b->rails.push_back(std::move(x));
  return static_cast<int>(b->rails.size()) - 1;
}

ibv_qp* create_shadow(Bundle* b, int i, std::string* err, int rail) {
  ibv_qp_attr qa{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(b->pqp, &qa, IBV_QP_CAP, &init) != 0) {
    *err = std::string("ibv_query_qp: ") + strerror(errno);
    return nullptr;
  }
  int64_t limit = config().num(Param::test_shadow_limit);
  if (limit >= 0 && static_cast<int64_t>(b->paths.size()) >= limit) {
    *err = "ibv_create_qp: injected failure (SHUNT_TEST_SHADOW_LIMIT)";
    return nullptr;
  }
  const BundleRail& br = b->rails[rail];
  ibv_qp_init_attr ia{};
  ia.send_cq = br.scq;
  ia.recv_cq = br.rcq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = init.cap.max_send_wr + 2;  // + a fence
  // A shadow may become the carrier of two-sided traffic (failover): it
  // takes the application's receives then.
  ia.cap.max_recv_wr = init.cap.max_recv_wr ? init.cap.max_recv_wr : 1;
  ia.cap.max_send_sge = init.cap.max_send_sge ? init.cap.max_send_sge : 1;
  ia.cap.max_recv_sge = init.cap.max_recv_sge ? init.cap.max_recv_sge : 1;
  ia.cap.max_inline_data = init.cap.max_inline_data;
  ibv_qp* q = ibv_create_qp(br.pd, &ia);
  if (!q) {
    *err = br.device + ": ibv_create_qp: " + strerror(errno);
    return nullptr;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = br.pkey;
  a.port_num = br.port;
  a.qp_access_flags = b->access;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *err = std::string("shadow to INIT: ") + strerror(errno);
    ibv_destroy_qp(q);
    return nullptr;
  }
  Path p;
  p.qp = q;
  p.qpn = q->qp_num;
  p.rail = rail;
  p.pc = br.c;
  p.psn = random_psn();
  p.flow_label = flow_label_for(label_seed(b), i);
  b->paths.push_back(p);
  return q;
}

namespace {

// A shadow retries as the application's QP does: its ACK timeout and its
// retries (capped at 6, since rxe treats 7 as "forever" and a shadow's
// dead route must end in an error some time). Dead routes are found by the
// probes (SHUNT_PATH_DEAD_MS) and the stall watch, not by a shorter RC
// timeout: on a host whose CPU is shared (a loaded guest, one core per
// rank), a shadow that timed out sooner than the application's QP failed
// with "transport retry counter exceeded" on routes that were fine, and
// each such failure cost a replay and a renewal nobody needed. Where the
// application set no timeout (0: wait forever), about SHUNT_PATH_DEAD_MS
// over four tries.
void shadow_timeouts(const Bundle* b, ibv_qp_attr* a) {
  if (b->rts.timeout) {
    a->timeout = b->rts.timeout;
  } else {
    double per_try_us = static_cast<double>(config().num(Param::path_dead_ms)) * 1000.0 / 4.0;
    int t = 1;
    while (t < 31 && 4.096 * static_cast<double>(1u << (t + 1)) <= per_try_us * 1.5) t++;
    a->timeout = static_cast<uint8_t>(t);
  }
  a->retry_cnt = std::min<uint8_t>(b->rts.retry_cnt, 6);
}

}  // namespace

bool shadow_to_rts(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a = b->rts;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.psn;
  shadow_timeouts(b, &a);
  if (ibv_modify_qp(p.qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *err = std::string("shadow to RTS: ") + strerror(errno);
    return false;
  }
  return true;
}

// To RTR against the peer's half, and to RTS when the application's QP is
// there (a QP that only receives, like perftest's server, stays at RTR).
bool connect_shadow(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a = b->rtr;
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = p.remote_qpn;
  a.rq_psn = p.remote_psn;
  a.ah_attr.grh.flow_label = p.flow_label;
  if (p.rail) {
    const BundleRail& br = b->rails[p.rail];
    a.ah_attr.port_num = br.port;
    a.ah_attr.grh.sgid_index = static_cast<uint8_t>(br.gid_index);
    a.ah_attr.grh.dgid = br.rgid;
  }
  if (ibv_modify_qp(p.qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *err = std::string("shadow to RTR: ") + strerror(errno);
    return false;
  }
  return !b->have_rts || shadow_to_rts(b, p, err);
}

// Registers every shadow with the registry, so completions find their way.
void track_shadows(Bundle* b) {
  for (size_t i = 0; i < b->paths.size(); i++) {
    Path& p = b->paths[i];
    if (p.rec) continue;
    p.rec = track_qp(p.qp, false);
    if (p.rec) {
      p.rec->shadow_of = b;
      p.rec->path = static_cast<int>(i);
      p.rec->primary_qpn = b->pqp->qp_num;
      g_shadow_qps.fetch_add(1);
    }
  }
}

// Under b->mu and b->lk. keep: leave the records (with their counters) for
// the stats, as for a bundle that ran; else forget them (setup failed).
void destroy_shadows(Bundle* b, bool keep) {
  for (auto& p : b->paths) {
    if (!p.qp) continue;
    if (p.rec) g_shadow_qps.fetch_sub(1);
    retire_qp(p.qp);
    ibv_destroy_qp(p.qp);
    p.qp = nullptr;
  }
  if (!keep) b->paths.clear();
}

}  // namespace shunt::verbs::bundle
