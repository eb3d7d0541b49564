// The bundle's data path on a hand-built ibv_context: where each WR goes,
// the fence in front of a WR that returns to the application's QP, and what
// the application sees of the shadows' completions.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "interpose/stats_sources.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/probe_ask.h"
#include "interpose/verbs/registry.h"
#include "telemetry/stats_file.h"

using namespace shunt::verbs;

namespace {
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
std::vector<Posted> g_posted;
std::deque<ibv_wc> g_cq;  // what the fake device will return from poll

uint32_t g_refuse_qpn = 0;  // the next post to this QP fails (once)
int fake_post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
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
int fake_poll_cq(ibv_cq*, int n, ibv_wc* wc) {
  int k = 0;
  for (; k < n && !g_cq.empty(); k++) {
    wc[k] = g_cq.front();
    g_cq.pop_front();
  }
  return k;
}

// The device "completes" the k-th signaled WR posted on qpn.
void complete(uint32_t qpn, uint64_t wr_id, ibv_wc_opcode op = IBV_WC_RDMA_WRITE) {
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
}  // namespace

TEST(Bundle, OneSidedWorkRidesAShadowAndTwoSidedStaysOnTheApplicationsQp) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1), 0);
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_GE(g_posted[0].qpn, 501u);  // a shadow
  uint32_t shadow = g_posted[0].qpn;

  // The application's completion of that WRITE comes back as its own.
  complete(shadow, 1);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].qp_num, 500u);
  EXPECT_EQ(wc[0].wr_id, 1u);

  // The shadow has drained: a SEND goes straight to the application's QP.
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 2), 0);
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_EQ(g_posted[1].qpn, 500u);
  EXPECT_EQ(g_posted[1].opcode, IBV_WR_SEND);
}

// A destroyed QP's bundle leaves the report's live bundles, but its paths'
// bytes stay in it, summed per device, NIC and path: the metrics' counters
// of bundle paths never go backwards when a job destroys a QP.
TEST(Bundle, ADestroyedQpsBundleKeepsItsBytesInTheReport) {
  shunt::register_stats_sources();  // as libshunt.so's constructor does
  auto closed_bytes = [] {
    uint64_t n = 0;
    const auto snap = shunt::telemetry::stats_json();
    if (!snap.contains("closed_bundle_paths")) return n;
    for (const auto& c : snap["closed_bundle_paths"])
      if (c["device"].get<std::string>() == "bundle0") n += c["tx_bytes"].get<uint64_t>();
    return n;
  };
  auto live = [] {
    int n = 0;
    const auto snap = shunt::telemetry::stats_json();
    for (const auto& b : snap["bundles"])
      n += b["device"].get<std::string>() == "bundle0" && b["qpn"].get<uint32_t>() == 500;
    return n;
  };
  const uint64_t before = closed_bytes();
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, nullptr, 4096), 0);
  ASSERT_EQ(g_posted.size(), 1u);
  complete(g_posted[0].qpn, 1);
  ASSERT_EQ(r.poll().size(), 1u);
  EXPECT_EQ(live(), 1);
  EXPECT_EQ(closed_bytes(), before);
  untrack_qp(&r.app);  // the application destroyed its QP: the record keeps its bundle
  EXPECT_EQ(live(), 0);
  EXPECT_EQ(closed_bytes(), before + 4096);
}

TEST(Bundle, ASendAfterAnUnsignaledWriteWaitsBehindAFenceTheApplicationNeverSees) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 10), 0);  // unsignaled
  ASSERT_EQ(g_posted.size(), 1u);
  uint32_t shadow = g_posted[0].qpn;
  char msg[] = "hello";
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED | IBV_SEND_INLINE, 11, msg, 5), 0);
  memcpy(msg, "XXXXX", 5);  // the caller may reuse an inline buffer at once
  // The SEND waits; a zero-length signaled WRITE fences the shadow.
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_EQ(g_posted[1].qpn, shadow);
  EXPECT_EQ(g_posted[1].opcode, IBV_WR_RDMA_WRITE);
  EXPECT_EQ(g_posted[1].bytes, 0u);
  EXPECT_TRUE(g_posted[1].flags & IBV_SEND_SIGNALED);
  // A WRITE posted meanwhile keeps its place behind the SEND.
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 12), 0);
  EXPECT_EQ(g_posted.size(), 2u);

  // The fence completes: the application sees nothing of it, and the held
  // SEND (with the bytes it had when posted) and WRITE go out, in order.
  complete(shadow, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 4u);
  EXPECT_EQ(g_posted[2].qpn, 500u);
  EXPECT_EQ(g_posted[2].wr_id, 11u);
  EXPECT_EQ(g_posted[2].inline_data, "hello");
  EXPECT_GE(g_posted[3].qpn, 501u);
  EXPECT_EQ(g_posted[3].wr_id, 12u);
}

// A held WR whose post fails when its turn comes (the application's post
// returned 0 long before): the application gets an error completion for it,
// never a wait without end.
TEST(Bundle, AHeldWrThatCannotBePostedCompletesInErrorForTheApplication) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 20), 0);
  uint32_t shadow = g_posted[0].qpn;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 21), 0);  // waits for the shadow
  ASSERT_EQ(g_posted.size(), 1u);
  g_refuse_qpn = 500;
  complete(shadow, 20);
  auto wc = r.poll();  // the WRITE's own completion
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 20u);
  EXPECT_EQ(g_posted.size(), 1u);  // the WRITE_WITH_IMM was refused
  wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 21u);
  EXPECT_EQ(wc[0].status, IBV_WC_LOC_QP_OP_ERR);
  EXPECT_EQ(wc[0].qp_num, 500u);
  EXPECT_TRUE(r.poll().empty());
}

TEST(Bundle, FlowletMovesToTheNextShadowOnlyWhenTheCurrentOneDrained) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1), 0);
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 2), 0);
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_EQ(g_posted[0].qpn, g_posted[1].qpn);  // outstanding: same path
  complete(g_posted[0].qpn, 1);
  complete(g_posted[1].qpn, 2);
  EXPECT_EQ(r.poll().size(), 2u);
  ASSERT_EQ(r.post(IBV_WR_RDMA_READ, IBV_SEND_SIGNALED, 3), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  EXPECT_NE(g_posted[2].qpn, g_posted[1].qpn);  // drained: the next path
  EXPECT_GE(g_posted[2].qpn, 501u);

  auto j = bundle_json(*r.rec);
  EXPECT_EQ(j["state"], "active");
  uint64_t wrs = 0;
  for (const auto& p : j["paths"]) wrs += p["wrs"].get<uint64_t>();
  EXPECT_EQ(wrs, 3u);
}

TEST(Bundle, CompletionsOfOtherQpsPassUntouchedInOneBatch) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 1), 0);
  uint32_t shadow = g_posted[0].qpn;
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 2), 0);  // fence posted, SEND held
  complete(999, 7, IBV_WC_RECV);                           // some other QP's
  complete(shadow, 0);                                     // the fence
  complete(500, 5, IBV_WC_RECV);                           // the application's own receive
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 2u);
  EXPECT_EQ(wc[0].qp_num, 999u);
  EXPECT_EQ(wc[1].qp_num, 500u);
  EXPECT_EQ(wc[1].wr_id, 5u);
  EXPECT_EQ(g_posted.back().wr_id, 2u);  // the held SEND went out
  EXPECT_EQ(g_posted.back().qpn, 500u);
}

// rxe leaves a destroyed QP's completions in its CQ: those of shunt's
// shadows carry shunt's wr_ids, which the application would take for its own
// (libfabric takes them for pointers). Until a new QP takes the number.
TEST(Bundle, CompletionsADestroyedShadowLeftInTheCqNeverReachTheApplication) {
  Rig r;
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 1), 0);
  uint32_t shadow = g_posted[0].qpn;
  ASSERT_NE(shadow, 500u);
  uint64_t stale = g_stale_wcs.load();
  bundle_detach_for_test(r.rec);  // the application destroys its QP, shunt its shadows
  complete(shadow, 0xdead);
  complete(500, 5, IBV_WC_RECV);
  ibv_wc flushed{};
  flushed.qp_num = shadow == 501 ? 502 : 501;  // another destroyed shadow, with an error
  flushed.status = IBV_WC_WR_FLUSH_ERR;
  g_cq.push_back(flushed);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].qp_num, 500u);
  EXPECT_EQ(g_stale_wcs.load() - stale, 2u);
  ibv_qp fresh{};  // a QP created later with the same number is the application's
  fresh.context = r.ctx;
  fresh.qp_num = shadow;
  fresh.qp_type = IBV_QPT_RC;
  fresh.send_cq = fresh.recv_cq = &r.cq;
  ASSERT_NE(track_qp(&fresh, false), nullptr);
  complete(shadow, 77);
  wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 77u);
  untrack_qp(&fresh);
}

TEST(Bundle, FlowletAvoidsAPathWhoseFlowletsDrainSlowly) {
  Rig r;
  char buf[4096];
  // One flowlet per shadow: the first drains slowly, the others at once.
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf, sizeof buf), 0);
  uint32_t slow = g_posted.back().qpn;
  usleep(50000);
  complete(slow, 1);
  ASSERT_EQ(r.poll().size(), 1u);
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 2 + i, buf, sizeof buf), 0);
    EXPECT_NE(g_posted.back().qpn, slow);  // unmeasured paths go first
    complete(g_posted.back().qpn, 2 + i);
    ASSERT_EQ(r.poll().size(), 1u);
  }
  int on_slow = 0;
  for (int i = 0; i < 12; i++) {
    ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 10 + i, buf, sizeof buf), 0);
    on_slow += g_posted.back().qpn == slow;
    complete(g_posted.back().qpn, 10 + i);
    ASSERT_EQ(r.poll().size(), 1u);
  }
  // Only the every-fourth round-robin picks may land there.
  EXPECT_LE(on_slow, 3);
  auto j = bundle_json(*r.rec);
  double slowest = 0;
  for (const auto& p : j["paths"]) slowest = std::max(slowest, p["ns_per_byte"].get<double>());
  EXPECT_GT(slowest, 0);
}

namespace {
ibv_wc error_wc(uint32_t qpn, uint64_t wr_id, ibv_wc_status st) {
  ibv_wc w{};
  w.qp_num = qpn;
  w.wr_id = wr_id;
  w.status = st;
  return w;
}
// The rig's shadows' UDP source ports, in path order (what their probes are keyed by).
std::vector<uint16_t> shadow_ports(const Rig& r) {
  std::vector<uint16_t> port;
  const auto j = bundle_json(*r.rec);
  for (const auto& p : j["paths"]) port.push_back(p["udp_sport"].get<uint16_t>());
  return port;
}

size_t posted_on(uint32_t qpn) {
  return std::count_if(g_posted.begin(), g_posted.end(), [&](const Posted& p) { return p.qpn == qpn; });
}
}  // namespace

TEST(Bundle, AFailedShadowsWorkIsPostedAgainOnAnotherAndItsErrorsNeverShow) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 1, buf), 0);  // unsignaled
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 2, buf), 0);
  ASSERT_EQ(g_posted.size(), 2u);
  uint32_t dead = g_posted[0].qpn;
  ASSERT_EQ(g_posted[1].qpn, dead);  // one flowlet: the same shadow
  g_posted.clear();
  // The path dies: the first WR times out, the second is flushed.
  g_cq.push_back(error_wc(dead, 1, IBV_WC_RETRY_EXC_ERR));
  g_cq.push_back(error_wc(dead, 2, IBV_WC_WR_FLUSH_ERR));
  EXPECT_TRUE(r.poll().empty());
  // Both went again, in order, on one other shadow.
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_NE(g_posted[0].qpn, dead);
  EXPECT_EQ(g_posted[0].qpn, g_posted[1].qpn);
  EXPECT_EQ(g_posted[0].wr_id, 1u);
  EXPECT_EQ(g_posted[1].wr_id, 2u);
  EXPECT_FALSE(g_posted[0].flags & IBV_SEND_SIGNALED);
  EXPECT_TRUE(g_posted[1].flags & IBV_SEND_SIGNALED);
  // Its completion is the application's, once.
  complete(g_posted[1].qpn, 2);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].qp_num, 500u);
  // The dead path is never used again.
  for (int i = 0; i < 12; i++) {
    ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 100 + i, buf), 0);
    complete(g_posted.back().qpn, 100 + i);
    ASSERT_EQ(r.poll().size(), 1u);
  }
  EXPECT_EQ(posted_on(dead), 0u);
}

// Three SENDs in flight on the application's QP when it fails; the peer
// consumed the first two. The third is posted again on the new carrier, the
// second's completion (signaled, never seen) is owed, the errors never show.
TEST(Bundle, AMovedCarrierReplaysExactlyTheMessagesThePeerDidNotConsume) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 1, buf), 0);
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 2, buf), 0);
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE_WITH_IMM, IBV_SEND_SIGNALED, 3, buf), 0);
  ASSERT_EQ(posted_on(500), 3u);
  complete(500, 1, IBV_WC_SEND);
  ASSERT_EQ(r.poll().size(), 1u);
  g_cq.push_back(error_wc(500, 2, IBV_WC_RETRY_EXC_ERR));
  g_cq.push_back(error_wc(500, 3, IBV_WC_WR_FLUSH_ERR));
  // (the fake device has no peer: the move's second half runs by hand)
  g_posted.clear();
  ASSERT_TRUE(bundle_move_sends_for_test(r.rec, 1, 2));
  // Message 3 again on path 1 (QP 502), then a fence whose completion wakes
  // an application waiting in event mode for the owed one.
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_EQ(g_posted[0].qpn, 502u);
  EXPECT_EQ(g_posted[0].wr_id, 3u);
  EXPECT_EQ(g_posted[0].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(g_posted[1].qpn, 502u);
  EXPECT_EQ(g_posted[1].bytes, 0u);
  g_posted.clear();
  auto wc = r.poll();  // the owed completion of message 2; the errors are gone
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 2u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
  EXPECT_EQ(wc[0].opcode, IBV_WC_SEND);
  EXPECT_EQ(wc[0].qp_num, 500u);
  EXPECT_EQ(bundle_carrier_for_test(r.rec), 1);
  // New two-sided work goes to the new carrier too.
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 4, buf), 0);
  EXPECT_EQ(posted_on(500), 0u);
  EXPECT_EQ(posted_on(502), 1u);
}

TEST(Bundle, AMoveRefusesWhenMessagesItCannotReplayWereNotConsumed) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 1, buf), 0);
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 2, buf), 0);
  complete(500, 1, IBV_WC_SEND);
  complete(500, 2, IBV_WC_SEND);
  ASSERT_EQ(r.poll().size(), 2u);
  // Both completed here, so shunt kept no copies; a peer that says it
  // consumed none of them cannot be served exactly once.
  EXPECT_FALSE(bundle_move_sends_for_test(r.rec, 1, 0));
}

// A renewed path waits on probation until its probe completes; a rank that
// sits in its own TCP bootstrap polls nothing, so shunt's failover worker
// polls the CQ itself once the probe is overdue.
TEST(Bundle, ProbesCompleteWhileTheApplicationDoesNotPoll) {
  Rig r;
  complete(501, 0);  // the device will answer the probe on path 0 (QP 501)
  bundle_probe_for_test(r.rec, 0);
  ASSERT_EQ(posted_on(501), 1u);
  ASSERT_EQ(g_posted.back().bytes, 0u);
  bool cleared = false;
  for (int i = 0; i < 200 && !cleared; i++) {
    usleep(10000);
    cleared = !bundle_probation_for_test(r.rec, 0);
  }
  EXPECT_TRUE(cleared) << "nobody polled the probe's completion";
  EXPECT_TRUE(r.poll().empty());  // the probe never shows
}

// WRs that wait (behind a fence here; through a failover in general) are
// bounded by the application's send queue: past its depth a post fails with
// ENOMEM at the WR that did not fit, as a full send queue does.
TEST(Bundle, HeldWorkIsBoundedByTheApplicationsSendQueueDepth) {
  Rig r;
  r.rec->max_send_wr = 3;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 1, buf), 0);  // on a shadow, unsignaled
  for (uint64_t id = 2; id <= 4; id++) ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, id, buf), 0);
  EXPECT_EQ(posted_on(500), 0u);  // all three wait behind the fence
  ibv_sge sge{reinterpret_cast<uint64_t>(buf), 64, 1};
  ibv_send_wr w[2]{};
  for (int i = 0; i < 2; i++) {
    w[i].opcode = IBV_WR_SEND;
    w[i].send_flags = IBV_SEND_SIGNALED;
    w[i].wr_id = 5 + i;
    w[i].sg_list = &sge;
    w[i].num_sge = 1;
  }
  w[0].next = &w[1];
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(&r.app, &w[0], &bad), ENOMEM);
  EXPECT_EQ(bad, &w[0]);
  // Once the fence clears, the three held SENDs go out in order, and there
  // is room again.
  uint32_t shadow = g_posted[0].qpn;
  complete(shadow, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(posted_on(500), 3u);
  EXPECT_EQ(ibv_post_send(&r.app, &w[0], &bad), 0);
  EXPECT_EQ(posted_on(500), 5u);
}

// A path that retries forever never reports a dead route; the stall watch
// fails it when nothing completed for the stall time while the port kept
// retransmitting, and its work goes again on another path.
TEST(Bundle, AStalledPathFailsOnlyWhileItsPortRetransmits) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  uint32_t stuck = g_posted[0].qpn;
  g_posted.clear();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 1000, 2000, -1), 0);  // first look
  // Quiet for 2.5 s, but the port never retransmitted: a slow peer, no failure.
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 3500, 2000, -1), 0);
  EXPECT_TRUE(g_posted.empty());
  // It retransmitted within the stall: the path failed, the WRITE goes again elsewhere.
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 3600, 2000, 3400), 1);
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_NE(g_posted[0].qpn, stuck);
  EXPECT_EQ(g_posted[0].wr_id, 1u);
  // The stuck path's late completion never shows; the replay's does, once.
  complete(stuck, 1);
  complete(g_posted[0].qpn, 1);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(wc[0].qp_num, 500u);
}

// Every usable path stalled at once (queues that hold packets for seconds,
// or a route they all share): failing them would leave nowhere to go, so
// none fails; once one path completes again, the ones still stuck fail and
// their work goes there.
TEST(Bundle, PathsThatAllStallAtOnceAreKeptUntilOneProgresses) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[256 * 1024];
  // A small WRITE on the application's QP, a split one over the three shadows.
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf, 1024), 0);
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, 2, buf, sizeof buf, 0x100000), 0);
  std::set<uint32_t> used;
  for (auto& p : g_posted) used.insert(p.qpn);
  ASSERT_EQ(used.size(), 4u);  // every path carries work
  std::vector<Posted> first = g_posted;
  g_posted.clear();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 1000, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 3600, 2000, 3400), 0);  // all four stalled: kept
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 5000, 2000, 4900), 0);
  EXPECT_TRUE(g_posted.empty());
  EXPECT_EQ(bundle_json(*r.rec)["all_stalled"], 1);  // one such time, however long
  // One shadow completes its segment: a route works, the other three paths fail.
  uint32_t good = first.back().qpn;
  ASSERT_NE(good, 500u);
  complete(good, 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 5500, 2000, 5400), 3);
  EXPECT_TRUE(r.poll().empty());  // nothing of it reaches the application yet
}

// A shadow whose own probes got through and are now lost has failed,
// idle or not: its work goes elsewhere and nothing more is sent into it. A
// path whose probes never got through yet (just set up, or renewed on a
// new port) is not judged; nor are the last usable paths all at once.
TEST(Bundle, AShadowWhoseProbesAreLostFails) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  // Lost before they were ever seen alive: no verdict.
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], false}, {port[1], false}, {port[2], false}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 1);
  auto paths = bundle_json(*r.rec)["paths"];
  EXPECT_TRUE(paths[1]["down"].get<bool>());
  EXPECT_FALSE(paths[0]["down"].get<bool>());
  // Work goes to live paths only: the failed shadow gets none.
  char buf[64];
  for (uint64_t id = 1; id <= 6; id++) {
    ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, id, buf), 0);
    for (auto& p : g_posted) complete(p.qpn, p.wr_id);
    r.poll();
    for (auto& p : g_posted) EXPECT_NE(p.qpn, r.sh[1].qp_num);
    g_posted.clear();
  }
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[2], true}}), 0);  // unknown ports: no verdict
}

// A shadow that failed keeps its port until it is renewed, and that port
// is still probed: once its probes, lost since, get through again, the
// route is back and the renewal does not wait out its backoff.
TEST(Bundle, AFailedShadowIsRenewedOnceItsProbesComeBack) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 1);
  EXPECT_FALSE(bundle_renew_now_for_test(r.rec));
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 0);
  EXPECT_FALSE(bundle_renew_now_for_test(r.rec));  // still lost: the backoff holds
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_TRUE(bundle_renew_now_for_test(r.rec));  // back: renew now, once
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_FALSE(bundle_renew_now_for_test(r.rec));
}

// A path renewed while its route is still dead waits on probation, its
// probes lost; the route comes back, and then the path fails (its probe
// was stuck): its route is known to work, so it is renewed at once.
TEST(Bundle, APathRenewedIntoADeadRouteIsRenewedAgainOnceTheRouteIsBack) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 1);
  bundle_back_in_service_for_test(r.rec, 1);  // renewed: on probation, its probe in flight
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 1));
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_FALSE(bundle_renew_now_for_test(r.rec));  // not failed: nothing to renew
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 1000, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 3600, 2000, 3400), 1);  // its stuck probe
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_TRUE(bundle_renew_now_for_test(r.rec));
}

// A renewed path's stall clock starts at its renewal, not when the watch
// last saw it before it failed: else the port's retransmissions for other
// paths during the fault fail it as stalled before its probe completes.
TEST(Bundle, ARenewedPathsStallClockStartsAtItsRenewal) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 1000, 2000, -1), 0);  // the watch's look: all idle
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 1);
  bundle_back_in_service_for_test(r.rec, 1);  // renewed at about 5 s: its probe in flight
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 1));
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 5100, 2000, 5050), 0);  // 4 s after that look: not stalled
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 1));
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 6000, 2000, 5900), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 7200, 2000, 7100), 1);  // 2.1 s after it: its probe is stuck
}

// The application's own QP, its port known (shunt gave it a flow label),
// is judged by its probes like a shadow: lost, it fails and the two-sided
// work waits for the move to a shadow; but never with every other path
// lost at the same time.
TEST(Bundle, TheApplicationsQpWhoseProbesAreLostFails) {
  Rig r;
  const auto j = bundle_json(*r.rec);
  ASSERT_TRUE(j["primary"]["udp_sport"].is_number());
  const uint16_t prim = j["primary"]["udp_sport"].get<uint16_t>();
  std::vector<std::pair<uint16_t, bool>> alive{{prim, true}}, lost{{prim, false}};
  for (const auto& p : j["paths"]) {
    ASSERT_NE(p["udp_sport"].get<uint16_t>(), prim);
    alive.emplace_back(p["udp_sport"].get<uint16_t>(), true);
    lost.emplace_back(p["udp_sport"].get<uint16_t>(), false);
  }
  EXPECT_EQ(bundle_probes_for_test(r.rec, alive), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, lost), 0);  // all at once: nowhere to go, none fails
  EXPECT_FALSE(bundle_json(*r.rec)["primary_down"].get<bool>());
  alive[0].second = false;
  EXPECT_EQ(bundle_probes_for_test(r.rec, alive), 1);
  EXPECT_TRUE(bundle_json(*r.rec)["primary_down"].get<bool>());
  char buf[64];
  g_posted.clear();
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 9, buf), 0);
  EXPECT_EQ(posted_on(500), 0u);  // held for the move, never posted on the failed QP
}

// A completion the application has not polled yet is progress: the watch
// polls before it decides (the rank may be busy elsewhere).
TEST(Bundle, TheStallWatchPollsBeforeItDecides) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 7, buf), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 1000, 2000, -1), 0);
  complete(g_posted[0].qpn, 7);  // done on the device, not yet polled
  g_posted.clear();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, 3500, 2000, 3400), 0);
  EXPECT_TRUE(g_posted.empty());
  auto wc = r.poll();  // kept for the application
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
}

// A port's async event fails every path on it at once (no retry timeout,
// no stall to wait for): nothing more is posted there, and the work waits
// for a path to come back. Another port's or device's event touches nothing.
TEST(Bundle, APortEventFailsExactlyThePathsOnThatPort) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, 0, 1, buf), 0);
  EXPECT_EQ(bundle_port_event_for_test("bundle0", 2, false), 0);
  EXPECT_EQ(bundle_port_event_for_test("other0", 1, false), 0);
  g_posted.clear();
  EXPECT_EQ(bundle_port_event_for_test("bundle0", 1, false), 1);
  EXPECT_TRUE(g_posted.empty());  // the WRITE waits: no path is left to replay it on
  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 2, buf), 0);
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 3, buf), 0);
  EXPECT_TRUE(g_posted.empty());
  EXPECT_EQ(bundle_carrier_for_test(r.rec), -2);  // two-sided work waits for a move
  // The device's flushes of the failed paths never reach the application.
  g_cq.push_back(error_wc(500, 9, IBV_WC_WR_FLUSH_ERR));
  EXPECT_TRUE(r.poll().empty());
}

// SHUNT_SPREAD=split: a large WRITE_WITH_IMM goes out as plain WRITEs on
// every shadow at once, covering its bytes end to end; its tail (the
// application's immediate, signal and wr_id) waits until all completed, and
// a SEND posted meanwhile waits behind the tail. The application sees one
// completion, its own.
TEST(Bundle, SplitCutsALargeWriteOverEveryShadowAndTheMessageWaitsForAllOfIt) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[256 * 1024];
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, 7, buf, sizeof buf, 0x100000, 0x1234), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  uint64_t next = 0;
  std::vector<uint32_t> qpns;
  for (const auto& p : g_posted) {
    EXPECT_GE(p.qpn, 501u);
    EXPECT_EQ(p.opcode, IBV_WR_RDMA_WRITE);
    EXPECT_TRUE(p.flags & IBV_SEND_SIGNALED);
    EXPECT_EQ(p.laddr, reinterpret_cast<uint64_t>(buf) + next);  // end to end, local and remote alike
    EXPECT_EQ(p.raddr, 0x100000 + next);
    next += p.bytes;
    qpns.push_back(p.qpn);
  }
  EXPECT_EQ(next, sizeof buf - 4096);
  std::sort(qpns.begin(), qpns.end());
  EXPECT_EQ(std::unique(qpns.begin(), qpns.end()) - qpns.begin(), 3);  // one per shadow

  ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, 8, buf), 0);
  EXPECT_EQ(g_posted.size(), 3u);  // behind the tail
  complete(g_posted[0].qpn, 0);
  complete(g_posted[1].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  EXPECT_EQ(g_posted.size(), 3u);  // one segment still out: the tail waits
  complete(g_posted[2].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 5u);
  EXPECT_EQ(g_posted[3].qpn, 500u);
  EXPECT_EQ(g_posted[3].opcode, IBV_WR_RDMA_WRITE_WITH_IMM);
  EXPECT_EQ(g_posted[3].wr_id, 7u);
  EXPECT_EQ(g_posted[3].imm, 0x1234u);
  EXPECT_EQ(g_posted[3].bytes, 4096u);
  EXPECT_EQ(g_posted[3].raddr, 0x100000u + sizeof buf - 4096);
  EXPECT_EQ(g_posted[3].laddr, reinterpret_cast<uint64_t>(buf) + sizeof buf - 4096);
  EXPECT_EQ(g_posted[4].wr_id, 8u);
  EXPECT_EQ(g_posted[4].qpn, 500u);
  complete(500, 7);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 7u);
  EXPECT_EQ(bundle_json(*r.rec)["splits"], 1);

  // Below SHUNT_SPLIT_MIN_BYTES a WRITE stays where pin puts it.
  g_posted.clear();
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 9, buf, 32768), 0);
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_EQ(g_posted[0].qpn, 500u);
}

// The carrier's own bytes (here the tails) cross its router too: where
// discovery knows that router, the shadows on it take that much less of
// each head, so each router carries its shadows' shares of all the bytes
// (here a third on the carrier's router, one shadow of three), not a
// third of the heads plus every tail. Without the carrier's router known,
// the heads alone are shared.
TEST(Bundle, SplitCountsTheCarriersBytesInTheBalanceOfTheRouters) {
  static char buf[64 * 1024];
  auto carrier_router_part = [&](bool known) {
    Rig r;
    bundle_spread_for_test(r.rec, 2, 16384);
    bundle_router_for_test(r.rec, 0, "s1");
    bundle_router_for_test(r.rec, 1, "s2");
    bundle_router_for_test(r.rec, 2, "s2");
    if (known) bundle_router_for_test(r.rec, -1, "s1");
    std::map<uint32_t, uint64_t> by_qpn;
    for (uint64_t i = 1; i <= 40; i++) {
      g_posted.clear();
      EXPECT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, i, buf, sizeof buf, 0x100000 * i), 0);
      EXPECT_EQ(g_posted.size(), 3u);
      for (const auto& p : std::vector<Posted>(g_posted)) complete(p.qpn, 0);
      EXPECT_TRUE(r.poll().empty());  // the segments done: the tail goes
      complete(500, i);
      EXPECT_EQ(r.poll().size(), 1u);
      for (const auto& p : g_posted) by_qpn[p.qpn] += p.bytes;
    }
    const double all = static_cast<double>(by_qpn[500] + by_qpn[501] + by_qpn[502] + by_qpn[503]);
    EXPECT_EQ(all, 40.0 * sizeof buf);
    return static_cast<double>(by_qpn[500] + by_qpn[501]) / all;
  };
  const double unknown = carrier_router_part(false), known = carrier_router_part(true);
  EXPECT_NEAR(unknown, (60.0 / 3 + 4) / 64, 0.005);  // a third of the heads and every tail
  EXPECT_NEAR(known, 1.0 / 3, 0.01);
}

// A segment's path fails: that segment goes again (on the application's
// QP, where the tail goes too, in order after it); the error never shows.
TEST(Bundle, ASplitSegmentOnAFailedPathGoesAgainBeforeTheTail) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, 3, buf, sizeof buf, 0x200000), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  const Posted lost = g_posted[1];
  g_cq.push_back(error_wc(lost.qpn, 0, IBV_WC_RETRY_EXC_ERR));
  complete(g_posted[0].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 4u);
  EXPECT_EQ(g_posted[3].qpn, 500u);  // the lost segment, as it was, at once
  EXPECT_EQ(g_posted[3].raddr, lost.raddr);
  EXPECT_EQ(g_posted[3].bytes, lost.bytes);
  complete(g_posted[2].qpn, 0);  // the last segment still out
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 5u);
  EXPECT_EQ(g_posted[4].qpn, 500u);  // then the tail, behind the lost segment
  EXPECT_EQ(g_posted[4].wr_id, 3u);
  EXPECT_EQ(g_posted[4].bytes, 4096u);
  complete(500, 0);  // the segment (shunt's own)
  complete(500, 3);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 3u);
  EXPECT_EQ(wc[0].status, IBV_WC_SUCCESS);
}

// Each split starts on the next shadow: the device sends segments in the
// order they were posted, so a path always first would always complete
// first, and latency steering would take it for the fast one.
TEST(Bundle, EachSplitStartsOnTheNextShadow) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  std::vector<uint32_t> first;
  for (uint64_t i = 0; i < 3; i++) {
    const size_t from = g_posted.size();
    ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, i + 1, buf, sizeof buf, 0x100000 * (i + 1)), 0);
    ASSERT_EQ(g_posted.size(), from + 3);
    first.push_back(g_posted[from].qpn);
    uint64_t covered = 0;
    for (size_t k = from; k < from + 3; k++) covered += g_posted[k].bytes;
    EXPECT_EQ(covered, sizeof buf - 4096);  // still the whole head, whichever path starts
  }
  std::sort(first.begin(), first.end());
  EXPECT_EQ(std::unique(first.begin(), first.end()) - first.begin(), 3);  // each shadow started one
}

// The next large WRITE need not wait for the last one's tail: its segments
// go at once (each path keeps its order), its tail queues behind the first
// one's; a WRITE into the range an unfinished split still writes waits.
TEST(Bundle, SplitsPipelineButNeverOverlapAnUnfinishedOne) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[128 * 1024];
  auto big = [&](uint64_t id, uint64_t raddr) {
    return r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, id, buf, sizeof buf, raddr);
  };
  ASSERT_EQ(big(1, 0x100000), 0);
  ASSERT_EQ(g_posted.size(), 3u);
  ASSERT_EQ(big(2, 0x200000), 0);  // elsewhere: out at once
  ASSERT_EQ(g_posted.size(), 6u);
  for (size_t i = 3; i < 6; i++) EXPECT_GE(g_posted[i].raddr, 0x200000u);
  ASSERT_EQ(big(3, 0x100000 + 4096), 0);  // into the first one's range: waits
  EXPECT_EQ(g_posted.size(), 6u);
  // The first group completes (each path completes in order): its tail goes,
  // the second's waits for its segments, the third WRITE behind it.
  for (size_t i = 0; i < 3; i++) complete(g_posted[i].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  ASSERT_EQ(g_posted.size(), 7u);
  EXPECT_EQ(g_posted[6].wr_id, 1u);
  EXPECT_EQ(g_posted[6].qpn, 500u);
  for (size_t i = 3; i < 6; i++) complete(g_posted[i].qpn, 0);
  EXPECT_TRUE(r.poll().empty());
  // The second tail, then the third WRITE's segments (the first split is done).
  ASSERT_EQ(g_posted.size(), 11u);
  EXPECT_EQ(g_posted[7].wr_id, 2u);
  EXPECT_EQ(g_posted[7].qpn, 500u);
  for (size_t i = 8; i < 11; i++) EXPECT_GE(g_posted[i].qpn, 501u);
  EXPECT_EQ(g_posted[8].raddr, 0x100000u + 4096);
  EXPECT_EQ(bundle_json(*r.rec)["splits"], 3);
}

// SHUNT_SPREAD=auto: each busy period (here one message, posted while the
// bundle was drained, to its completion) is split or pinned; after each
// mode was tried three times, large WRITEs go the way whose periods moved
// their bytes faster, split when the carrier is the slow one, pinned when
// the spread is, until the 16th choice tries the other mode again.
namespace {
// One 128 KiB WRITE_WITH_IMM, completed `slow_ms` after its post if it went
// the slow way (split or not); returns whether it was split.
bool auto_period(Rig& r, uint64_t id, bool split_slow, int slow_ms) {
  static char buf[128 * 1024];
  const size_t from = g_posted.size();
  EXPECT_EQ(r.post_remote(IBV_WR_RDMA_WRITE_WITH_IMM, id, buf, sizeof buf, 0x100000), 0);
  const bool split = g_posted.size() == from + 3;
  EXPECT_TRUE(split || (g_posted.size() == from + 1 && g_posted[from].qpn == 500u)) << g_posted.size() - from;
  if (split == split_slow) usleep(slow_ms * 1000);
  if (split) {
    for (size_t i = from; i < from + 3; i++) complete(g_posted[i].qpn, 0);
    EXPECT_TRUE(r.poll().empty());
    EXPECT_EQ(g_posted.size(), from + 4);  // the tail
  }
  complete(500, id);
  auto wc = r.poll();
  EXPECT_EQ(wc.size(), 1u);
  return split;
}
}  // namespace

TEST(Bundle, AutoSplitsWhenTheCarrierIsSlowerAndPinsWhenItIsFaster) {
  for (bool split_slow : {false, true}) {
    Rig r;
    bundle_spread_for_test(r.rec, 3, 65536);
    std::string modes;
    for (uint64_t i = 1; i <= 17; i++) modes += auto_period(r, i, split_slow, 15) ? 's' : 'p';
    // Tried in turn, then the faster, the 16th choice the other.
    EXPECT_EQ(modes, split_slow ? "spspsppppppppppsp" : "spspspsssssssssps") << "split slow: " << split_slow;
    auto j = bundle_json(*r.rec);
    EXPECT_EQ(j["spread"], "auto");
    EXPECT_EQ(j["auto"]["now"], split_slow ? "pin" : "split");
    EXPECT_GT(j["auto"][split_slow ? "split_ns_per_kib" : "pin_ns_per_kib"].get<double>(),
              2 * j["auto"][split_slow ? "pin_ns_per_kib" : "split_ns_per_kib"].get<double>());
  }
}

// A probed bundle's worker asks the agent about its paths' probes when the
// engine's count of liveness changes moved, after registering new ports,
// and every 5 s regardless; every 100 ms where it cannot read the count.
TEST(BundleProbeAsk, AsksWhenTheCountMovesNotEveryRound) {
  ProbeAsk a;
  EXPECT_TRUE(a.due(0, 5u));  // the first look
  int asked = 0;
  for (int64_t t = 50; t < 5000; t += 50) asked += a.due(t, 5u);
  EXPECT_EQ(asked, 0);  // nothing changed: no asking for 5 s
  EXPECT_TRUE(a.due(5000, 5u));  // every 5 s regardless
  EXPECT_TRUE(a.due(5050, 6u));  // the count moved
  EXPECT_FALSE(a.due(5100, 6u));
  a.ports_registered();
  EXPECT_TRUE(a.due(5150, 6u));  // new ports: their first verdicts
  EXPECT_FALSE(a.due(5200, 6u));
  a.unanswered(5200);
  EXPECT_TRUE(a.due(5300, 6u));  // no answer: soon again
  EXPECT_FALSE(a.due(5350, 6u));
  // Without the count: every 100 ms.
  ProbeAsk b;
  asked = 0;
  for (int64_t t = 0; t < 1000; t += 50) asked += b.due(t, std::nullopt);
  EXPECT_EQ(asked, 10);
  // The count readable again after a gap: asked at once.
  EXPECT_TRUE(b.due(1000, 7u));
  EXPECT_FALSE(b.due(1050, 7u));
}

// The application's CQs get room for its shadows' completions (perftest's
// rdma_cm CQs hold one entry, shared by its QP and 4 shadows).
TEST(Bundle, TheApplicationsCqHasRoomForItsShadows) {
  EXPECT_GE(shadow_cq_depth(1, 4, 32767), 5 + 4 * 2);           // each of 5 QPs, and shunt's own WRs
  EXPECT_EQ(shadow_cq_depth(256, 4, 32767), 256 * 5 + 16 + 8);
  EXPECT_EQ(shadow_cq_depth(20000, 4, 32767), 32767);           // never past the device's limit
  EXPECT_EQ(shadow_cq_depth(32767, 4, 32767), 32767);
  EXPECT_EQ(shadow_cq_depth(40000, 4, 32767), 40000);           // never less than asked
  EXPECT_EQ(shadow_cq_depth(64, 0, 32767), 64);                 // no shadows
  EXPECT_EQ(shadow_cq_depth(1 << 30, 16, 0), INT32_MAX);        // no overflow
}

// The answering end asks the host agent once per join: an agent that took
// the question and has not answered yet is slow (asked again), not absent.
TEST(PathDiscovery, ASlowAgentIsAskedAgainAnAbsentOneIsNot) {
  std::string path = "/tmp/shunt-unit-agent-" + std::to_string(getpid()) + ".sock";
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", path.c_str());
  unlink(path.c_str());
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(listen(fd, 4), 0);  // takes connections, never answers
  std::vector<uint16_t> ports;
  std::vector<std::string> hops;
  EXPECT_EQ(shared_hops_via(path, "10.0.0.1", "10.0.0.2", 8, 100, true, &ports, &hops), -1);
  close(fd);
  unlink(path.c_str());
  EXPECT_EQ(shared_hops_via(path, "10.0.0.1", "10.0.0.2", 8, 100, true, &ports, &hops), 0);
  EXPECT_TRUE(ports.empty());
}

// Path discovery's choice: shadows spread evenly over the routers that
// answered, in candidate order within each, unknown ports last; with fewer
// than two routers known, the first candidates as without discovery.
TEST(PathDiscovery, PicksPortsBalancedOverTheRoutersThatAnswered) {
  using V = std::vector<int>;
  // 6 of the first 8 candidates hash to s1: the hash alone would give 6:2.
  std::vector<std::string> hops = {"s1", "s1", "s2", "s1", "s1", "s1", "s2", "s1", "s2", "", "s2", "s1"};
  V pick = balanced_pick(hops, 8);
  EXPECT_EQ(pick, (V{0, 2, 1, 6, 3, 8, 4, 10}));
  int s1 = 0, s2 = 0;
  for (int k : pick) (hops[k] == "s1" ? s1 : s2)++;
  EXPECT_EQ(s1, 4);
  EXPECT_EQ(s2, 4);
  EXPECT_EQ(balanced_pick({"s1", "", "s2", "s2", "s2"}, 4), (V{0, 2, 3, 4}));  // s1 has one: the rest from s2
  EXPECT_EQ(balanced_pick({"s1", "", "s2"}, 3), (V{0, 2, 1}));                 // unknown last
  EXPECT_EQ(balanced_pick({"", "s1", "", "s1"}, 2), (V{0, 1}));                // one router: unchanged
  EXPECT_EQ(balanced_pick({"", "", ""}, 2), (V{0, 1}));
}

// The host agent's discovery cache: one round of datagrams per (local, peer)
// serves every bundle that asks within the TTL; askers during the round hear
// "pending" and start no second round; more candidates, or an old entry,
// start a round on fresh ports.
TEST(PathDiscovery, WaitsLongerForASecondRouterBehindAQueue) {
  // Started at 1000 ms with wait_ms 100: the cap is 10 x 100 after the start.
  EXPECT_EQ(discovery_deadline(1000, 100, 0, 1000), 1100);  // nobody out there: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 1, 1002), 2000);  // one router: up to the cap for another
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1002), 1100);  // both at once: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1060), 1100);  // the second in time: the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1095), 1118);  // just in time: a quarter more for its burst
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1040), 1100);  // and never less than the base wait
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1600), 1750);  // one from behind a queue: a quarter more
  EXPECT_EQ(discovery_deadline(1000, 100, 2, 1950), 2000);  // never past the cap
}

TEST(PathDiscovery, OneRoundServesEveryBundleOfAHostTowardsAPeer) {
  int rounds = 0;
  std::vector<std::vector<uint16_t>> asked;
  std::vector<std::function<void()>> queued;
  HopCache cache(
      [&](const std::string& l, const std::string& p, const std::vector<uint16_t>& ports) {
        EXPECT_EQ(l, "10.0.0.1");
        EXPECT_EQ(p, "10.0.1.1");
        rounds++;
        asked.push_back(ports);
        std::vector<std::string> hops;
        for (uint16_t port : ports) hops.push_back(port & 1 ? "s1" : "s2");
        return hops;
      },
      [&](std::function<void()> w) { queued.push_back(std::move(w)); }, 60'000);
  // The first asker starts a round; it and a second asker wait for it.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 12, 1000));
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 12, 1010));
  ASSERT_EQ(queued.size(), 1u);
  queued[0]();
  EXPECT_EQ(rounds, 1);
  ASSERT_EQ(asked[0].size(), 12u);
  for (uint16_t p : asked[0]) {
    EXPECT_GT(p, 0xC000);  // the port of flow label p & 0x3fff, which is not 0
    EXPECT_EQ(std::count(asked[0].begin(), asked[0].end(), p), 1);
  }
  // Every bundle now gets the same answer, without a datagram more.
  auto a = cache.get("10.0.0.1", "10.0.1.1", 12, 1200), b = cache.get("10.0.0.1", "10.0.1.1", 8, 30'000);
  ASSERT_TRUE(a && b);
  EXPECT_EQ(a->ports, asked[0]);
  EXPECT_EQ(b->ports, asked[0]);
  EXPECT_EQ(a->hops.size(), 12u);
  EXPECT_EQ(a->hops[0], asked[0][0] & 1 ? "s1" : "s2");
  EXPECT_EQ(queued.size(), 1u);
  // Another peer is another round.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.2.1", 12, 1300));
  EXPECT_EQ(queued.size(), 2u);
  // A bundle with more shadows needs more candidates: a new round, new ports.
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 24, 2000));
  ASSERT_EQ(queued.size(), 3u);
  queued[2]();
  ASSERT_EQ(asked.size(), 2u);
  EXPECT_EQ(asked[1].size(), 24u);
  EXPECT_NE(asked[1], asked[0]);
  // Past the TTL the answers may be stale (a spine gone): a new round.
  EXPECT_TRUE(cache.get("10.0.0.1", "10.0.1.1", 24, 61'000));
  EXPECT_FALSE(cache.get("10.0.0.1", "10.0.1.1", 24, 62'001));
  EXPECT_EQ(queued.size(), 4u);
}
