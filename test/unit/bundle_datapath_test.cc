// The bundle's data path on a hand-built ibv_context: where each WR goes,
// the fence in front of a WR that returns to the application's QP, and what
// the application sees of the shadows' completions.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "interpose/stats_sources.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/registry.h"
#include "telemetry/stats_file.h"
#include "test/unit/bundle_rig.h"

using namespace shunt::verbs;
using namespace shunt::verbs::bundle_rig;

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
