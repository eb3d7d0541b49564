// A bundle's life: made at INIT, labelled at RTR, set up at RTS, destroyed with the application's QP.
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>

#include "core/runtime.h"

namespace shunt::verbs {

using namespace bundle;

bool bundle_label_primary(QpRecord* r, const ibv_qp_attr* attr, int mask, ibv_qp_attr* out) {
  if (!r || r->type != IBV_QPT_RC || r->shadow_of || current_mode() != Mode::active) return false;
  if (!(mask & IBV_QP_STATE) || attr->qp_state != IBV_QPS_RTR || !(mask & IBV_QP_AV) || !attr->ah_attr.is_global)
    return false;
  Bundle* b = r->bundle.load();  // made at INIT where bundles are on
  if (!b) return false;
  uint32_t fl = attr->ah_attr.grh.flow_label;
  bool set = false;
  if (!fl) {
    ibv_gid g;
    uint8_t port = (mask & IBV_QP_PORT) ? attr->port_num : b->port;
    if (ibv_query_gid(r->qp->context, port, attr->ah_attr.grh.sgid_index, &g) != 0) return false;
    fl = flow_label_for(label_seed(r->qp->qp_num, g), -1);  // the shadows' are i >= 0
    *out = *attr;
    out->ah_attr.grh.flow_label = fl;
    set = true;
  }
  std::lock_guard m(b->mu);
  std::lock_guard l(b->lk);
  b->prim.flow_label = fl;
  return set;
}

void bundle_unlabel_primary(QpRecord* r) {
  Bundle* b = r ? r->bundle.load() : nullptr;
  if (!b) return;
  std::lock_guard m(b->mu);
  std::lock_guard l(b->lk);
  b->prim.flow_label = 0;
}

void bundle_on_modify(QpRecord* r, const ibv_qp_attr* attr, int mask) {
  if (!r || r->type != IBV_QPT_RC || r->shadow_of || current_mode() != Mode::active) return;
  const Config& c = config();
  if (c.num(Param::paths_per_rail) == 0 || c.str(Param::job_key).empty()) {
    if (c.num(Param::paths_per_rail) != 0) event_no_job_key();
    return;
  }
  Bundle* b = r->bundle.load();
  if (!b) {
    if (!(mask & IBV_QP_STATE) || attr->qp_state != IBV_QPS_INIT) return;
    b = new Bundle;
    b->primary = r;
    b->pqp = r->qp;
    b->ctx = r->ctx;
    // Two-sided work can move to a shadow only with the application's own
    // receive queue (no SRQ): then shunt keeps its receives from now.
    b->tracking.store(r->qp->srq == nullptr);
    b->prim.qp = r->qp;
    b->prim.qpn = r->qp->qp_num;
    b->prim.rec = r;
    b->prim.pc = r->ctx;
    {
      std::lock_guard g(g_mu);
      if (!g_bundles) g_bundles = new std::vector<Bundle*>;
      g_bundles->push_back(b);
    }
    g_shadow_qps.fetch_add(1);  // the poll path counts this QP's receives
    r->bundle.store(b, std::memory_order_release);
  }
  bool start = false;
  {
    std::lock_guard g(b->mu);
    if (mask & IBV_QP_ACCESS_FLAGS) b->access = attr->qp_access_flags;
    if (mask & IBV_QP_PORT) b->port = attr->port_num;
    if (mask & IBV_QP_PKEY_INDEX) b->pkey = attr->pkey_index;
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR) {
      b->rtr = *attr;
      b->rqpn = attr->dest_qp_num;
      b->have_rtr = true;
      std::string err;
      if (!(attr->ah_attr.is_global)) {
        set_phase(b, Phase::primary_only, "no GRH (not RoCE v2)");
      } else if (ibv_query_gid(b->pqp->context, b->port, attr->ah_attr.grh.sgid_index, &b->lgid) != 0) {
        set_phase(b, Phase::primary_only, "cannot read the local GID");
      } else {
        b->rgid = attr->ah_attr.grh.dgid;
        if (!register_owner(b, &err)) set_phase(b, Phase::primary_only, err);
        else b->registered = true;
      }
    }
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && b->have_rtr && !b->started) {
      b->rts = *attr;
      b->have_rts = true;
      std::string err;
      for (auto& p : b->paths)  // joined while the QP was at RTR
        if (!shadow_to_rts(b, p, &err)) {
          event_stopped(b, err);
          b->active.store(false);
          break;
        }
      if (b->registered && initiates(b)) {
        b->started = true;
        start = true;
        set_phase(b, Phase::setting_up);
      } else if (b->registered) {
        set_phase(b, Phase::waiting_peer);
      }
    }
  }
  if (start && !start_job("bundle setup", [b] { run_setup(b); },
                           [b](const std::string& why) { fall_back(b, "setup failed: " + why); }))
    fall_back(b, "no thread for its setup");
}

void bundle_on_destroy(QpRecord* r) {
  Bundle* b = r ? r->bundle.load() : nullptr;
  if (!b) return;
  bool probed;
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    b->dead = true;
  }
  report_mail(b);    // what the completion filter found, while the QP lives
  signal_worker(b);  // a worker still asleep ends now
  {
    // A failover round or a peer's request under way finishes first (it
    // sees `dead` next): none may use a shadow or a CQ after this.
    std::lock_guard mm(b->move_mu);
    std::lock_guard g(b->mu);
    std::lock_guard l(b->lk);
    b->active.store(false);
    b->tracking.store(false);
    destroy_shadows(b, true);
    b->held.clear();
    b->recvs.clear();
    b->prim.infl.clear();
    if (!b->dir_file.empty()) unlink(b->dir_file.c_str());
    settle_prim_router(b, false);
    probed = b->probed;
  }
  g_shadow_qps.fetch_sub(1);
  if (probed) drop_probe_paths(b);
  watch_resync(true);  // its device's event context goes with its last bundle
}

}  // namespace shunt::verbs
