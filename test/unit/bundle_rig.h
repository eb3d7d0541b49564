// The bundle's unit tests' rig: a hand-built ibv_context whose "device"
// records every WR posted and returns the completions a test queues, an
// application QP with three shadows bundled over it, and the helpers the
// bundle_*_test.cc files share. Test-only; inline, so that each file that
// includes it shares one fake device.
#pragma once
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <errno.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/registry.h"

namespace shunt::verbs::bundle_rig {
struct Posted {
  uint32_t qpn;
  ibv_wr_opcode opcode;
  unsigned flags;
  uint64_t wr_id;
  uint32_t bytes;
  std::string inline_data;
  uint64_t laddr = 0, raddr = 0;  // the first SGE's address, the remote address
  uint32_t imm = 0;
};
inline std::vector<Posted> g_posted;
inline std::deque<ibv_wc> g_cq;  // what the fake device will return from poll

inline uint32_t g_refuse_qpn = 0;  // the next post to this QP fails (once)
inline int fake_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  if (g_refuse_qpn && qp->qp_num == g_refuse_qpn) {
    g_refuse_qpn = 0;
    *bad = wr;
    return ENOMEM;
  }
  for (; wr; wr = wr->next) {
    Posted p{qp->qp_num, wr->opcode, wr->send_flags, wr->wr_id, 0, {}};
    if (wr->num_sge) p.laddr = wr->sg_list[0].addr;
    p.raddr = wr->wr.rdma.remote_addr;
    p.imm = wr->imm_data;
    for (int i = 0; i < wr->num_sge; i++) {
      p.bytes += wr->sg_list[i].length;
      if (wr->send_flags & IBV_SEND_INLINE)
        p.inline_data.append(reinterpret_cast<const char*>(wr->sg_list[i].addr), wr->sg_list[i].length);
    }
    g_posted.push_back(p);
  }
  return 0;
}
inline int fake_poll_cq(ibv_cq*, int n, ibv_wc* wc) {
  int k = 0;
  for (; k < n && !g_cq.empty(); k++) {
    wc[k] = g_cq.front();
    g_cq.pop_front();
  }
  return k;
}

// The device "completes" the k-th signaled WR posted on qpn.
inline void complete(uint32_t qpn, uint64_t wr_id, ibv_wc_opcode op = IBV_WC_RDMA_WRITE) {
  ibv_wc w{};
  w.qp_num = qpn;
  w.wr_id = wr_id;
  w.status = IBV_WC_SUCCESS;
  w.opcode = op;
  g_cq.push_back(w);
}

struct Rig {
  verbs_context vctx{};
  ibv_context* ctx = &vctx.context;
  ibv_qp app{}, sh[3]{};
  ibv_cq cq{};
  QpRecord* rec = nullptr;
  Rig() {
    vctx.sz = sizeof vctx;
    ctx->ops.post_send = fake_post_send;
    ctx->ops.poll_cq = fake_poll_cq;
    app.context = ctx;
    app.qp_num = 500;
    app.qp_type = IBV_QPT_RC;
    app.send_cq = app.recv_cq = &cq;
    cq.context = ctx;
    for (int i = 0; i < 3; i++) {
      sh[i].context = ctx;
      sh[i].qp_num = 501 + i;
      sh[i].qp_type = IBV_QPT_RC;
    }
    g_posted.clear();
    g_cq.clear();
    EXPECT_TRUE(patch_context(ctx, "bundle0"));
    rec = track_qp(&app, false);
    bundle_attach_for_test(rec, {&sh[0], &sh[1], &sh[2]});
  }
  ~Rig() {
    bundle_detach_for_test(rec);
    untrack_qp(&app);
    unpatch_context(ctx);
  }
  int post(ibv_wr_opcode op, unsigned flags, uint64_t id, void* buf = nullptr, uint32_t len = 64) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf), len, 1};
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.send_flags = flags;
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(&app, &wr, &bad);
  }
  // A one-sided WR of len bytes of buf to remote address raddr (rkey 9).
  int post_remote(ibv_wr_opcode op, uint64_t id, void* buf, uint32_t len, uint64_t raddr, uint32_t imm = 0) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf), len, 1};
    ibv_send_wr wr{};
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr_id = id;
    wr.imm_data = imm;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.wr.rdma.remote_addr = raddr;
    wr.wr.rdma.rkey = 9;
    ibv_send_wr* bad = nullptr;
    return ibv_post_send(&app, &wr, &bad);
  }
  std::vector<ibv_wc> poll() {
    ibv_wc wc[16];
    int n = ibv_poll_cq(&cq, 16, wc);
    return std::vector<ibv_wc>(wc, wc + std::max(n, 0));
  }
};

inline ibv_wc error_wc(uint32_t qpn, uint64_t wr_id, ibv_wc_status st) {
  ibv_wc w{};
  w.qp_num = qpn;
  w.wr_id = wr_id;
  w.status = st;
  return w;
}
// The rig's shadows' UDP source ports, in path order (what their probes are keyed by).
inline std::vector<uint16_t> shadow_ports(const Rig& r) {
  std::vector<uint16_t> port;
  const auto j = bundle_json(*r.rec);
  for (const auto& p : j["paths"]) port.push_back(p["udp_sport"].get<uint16_t>());
  return port;
}

inline size_t posted_on(uint32_t qpn) {
  return std::count_if(g_posted.begin(), g_posted.end(), [&](const Posted& p) { return p.qpn == qpn; });
}
}  // namespace shunt::verbs::bundle_rig
