// The inline ibv_post_send/ibv_post_recv/ibv_poll_cq of <infiniband/verbs.h>
// jump through ctx->ops; these tests build an ibv_context by hand with a
// trivial "provider" and check that, once patched, the inline calls reach
// shunt, then the provider, exactly once each, and are counted exactly.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "interpose/verbs/busy.h"
#include "interpose/verbs/registry.h"

using namespace shunt::verbs;

namespace {
std::atomic<int> g_sends;
int g_recvs, g_polls, g_notifies, g_srq_recvs;
int g_fail_at = -1;  // post_send fails at this WR index
ibv_wc g_wcs[8];
int g_nwcs;

int fake_post_send(ibv_qp*, ibv_send_wr* wr, ibv_send_wr** bad) {
  int i = 0;
  for (; wr; wr = wr->next, i++) {
    if (i == g_fail_at) {
      *bad = wr;
      return ENOMEM;
    }
    g_sends++;
  }
  return 0;
}
int fake_post_recv(ibv_qp*, ibv_recv_wr* wr, ibv_recv_wr**) {
  for (; wr; wr = wr->next) g_recvs++;
  return 0;
}
int fake_poll_cq(ibv_cq*, int n, ibv_wc* wc) {
  g_polls++;
  int k = std::min(n, g_nwcs);
  memcpy(wc, g_wcs, sizeof(ibv_wc) * k);
  return k;
}
int fake_notify(ibv_cq*, int) { return ++g_notifies, 0; }
int fake_srq_recv(ibv_srq*, ibv_recv_wr*, ibv_recv_wr**) { return ++g_srq_recvs, 0; }
ibv_qp* fake_create_qp_ex(ibv_context*, ibv_qp_init_attr_ex*) { return nullptr; }

struct FakeDevice {
  verbs_context vctx{};
  ibv_context* ctx = &vctx.context;
  ibv_qp qp{};
  ibv_cq cq{};
  ibv_srq srq{};
  FakeDevice(uint32_t qpn) {
    vctx.sz = sizeof vctx;
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->ops.post_send = fake_post_send;
    ctx->ops.post_recv = fake_post_recv;
    ctx->ops.poll_cq = fake_poll_cq;
    ctx->ops.req_notify_cq = fake_notify;
    ctx->ops.post_srq_recv = fake_srq_recv;
    vctx.create_qp_ex = fake_create_qp_ex;
    qp.context = ctx;
    qp.qp_num = qpn;
    qp.qp_type = IBV_QPT_RC;
    cq.context = ctx;
    srq.context = ctx;
    g_sends = g_recvs = g_polls = g_notifies = g_srq_recvs = 0;
    g_fail_at = -1;
    g_nwcs = 0;
  }
};

template <typename F>
uint64_t hot(const QpStats& s, F f) {
  return total(s, f);
}

ibv_send_wr write_wr(ibv_sge* sge, ibv_send_wr* next = nullptr) {
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = sge;
  wr.num_sge = 1;
  wr.next = next;
  return wr;
}
}  // namespace

TEST(HotPath, InlinePostSendReachesPatchedOpsThenProvider) {
  auto d = std::make_unique<FakeDevice>(101);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  EXPECT_NE(d->ctx->ops.post_send, fake_post_send);
  QpRecord* r = track_qp(&d->qp, false);
  ASSERT_NE(r, nullptr);

  ibv_sge sge[2] = {{0, 4096, 0}, {0, 100, 0}};
  ibv_send_wr second = write_wr(&sge[1]);
  second.opcode = IBV_WR_SEND;
  ibv_send_wr first = write_wr(&sge[0], &second);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(&d->qp, &first, &bad), 0);  // the inline from verbs.h
  EXPECT_EQ(g_sends, 2);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_wrs[IBV_WR_RDMA_WRITE]; }), 1u);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_wrs[IBV_WR_SEND]; }), 1u);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_bytes; }), 4196u);

  unpatch_context(d->ctx);
  EXPECT_EQ(d->ctx->ops.post_send, fake_post_send);
  EXPECT_EQ(d->ctx->ops.poll_cq, fake_poll_cq);
  EXPECT_EQ(d->vctx.create_qp_ex, fake_create_qp_ex);
  EXPECT_EQ(ibv_post_send(&d->qp, &first, &bad), 0);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_bytes; }), 4196u) << "an unpatched context is not counted";
  untrack_qp(&d->qp);
}

TEST(HotPath, FailedPostCountsOnlyWrsBeforeBadWr) {
  auto d = std::make_unique<FakeDevice>(102);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  ibv_sge sge[3] = {{0, 10, 0}, {0, 20, 0}, {0, 40, 0}};
  ibv_send_wr c = write_wr(&sge[2]), b = write_wr(&sge[1], &c), a = write_wr(&sge[0], &b);
  ibv_send_wr* bad = nullptr;
  g_fail_at = 1;
  EXPECT_EQ(ibv_post_send(&d->qp, &a, &bad), ENOMEM);
  EXPECT_EQ(bad, &b) << "the provider's bad_wr reaches the application";
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_wrs[IBV_WR_RDMA_WRITE]; }), 1u);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_bytes; }), 10u);
  EXPECT_EQ(get(r->s.send_post_errors), 1u);
  untrack_qp(&d->qp);
  unpatch_context(d->ctx);
}

TEST(HotPath, PollCqCountsCompletionsErrorsAndReceivedBytesPerQp) {
  auto d = std::make_unique<FakeDevice>(103);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  g_nwcs = 4;
  memset(g_wcs, 0, sizeof g_wcs);
  for (int i = 0; i < 4; i++) g_wcs[i].qp_num = 103, g_wcs[i].wr_id = 7 + i;
  g_wcs[0].opcode = IBV_WC_RDMA_WRITE;
  g_wcs[1].opcode = IBV_WC_RECV, g_wcs[1].byte_len = 512;
  g_wcs[2].opcode = IBV_WC_RECV_RDMA_WITH_IMM, g_wcs[2].byte_len = 1024;
  g_wcs[3].status = IBV_WC_RETRY_EXC_ERR;
  ibv_wc out[16];
  EXPECT_EQ(ibv_poll_cq(&d->cq, 16, out), 4);
  EXPECT_EQ(out[3].status, IBV_WC_RETRY_EXC_ERR);
  EXPECT_EQ(out[2].wr_id, 9u) << "completions reach the application unchanged";
  EXPECT_EQ(g_polls, 1);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.completions; }), 4u);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.recv_completions; }), 2u);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.recv_bytes; }), 1536u);
  EXPECT_EQ(get(r->s.wc_status[IBV_WC_RETRY_EXC_ERR]), 1u);
  // Batch semantics: asking for fewer returns fewer.
  EXPECT_EQ(ibv_poll_cq(&d->cq, 2, out), 2);
  untrack_qp(&d->qp);
  unpatch_context(d->ctx);
}

TEST(HotPath, RecvNotifyAndSrqReachProvider) {
  auto d = std::make_unique<FakeDevice>(104);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  ibv_recv_wr w2{}, w1{};
  w1.next = &w2;
  ibv_recv_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_recv(&d->qp, &w1, &bad), 0);
  EXPECT_EQ(g_recvs, 2);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.recv_wrs; }), 2u);
  EXPECT_EQ(ibv_req_notify_cq(&d->cq, 0), 0);
  EXPECT_EQ(g_notifies, 1);
  EXPECT_EQ(ibv_post_srq_recv(&d->srq, &w1, &bad), 0);
  EXPECT_EQ(g_srq_recvs, 1);
  ContextRecord* c = find_context(d->ctx);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(get(c->srq_recv_wrs), 2u);
  untrack_qp(&d->qp);
  unpatch_context(d->ctx);
}

TEST(HotPath, QpCreatedBehindShuntsBackIsCountedPerDevice) {
  auto d = std::make_unique<FakeDevice>(105);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  ibv_sge sge{0, 64, 0};
  ibv_send_wr wr = write_wr(&sge);
  ibv_send_wr* bad = nullptr;
  EXPECT_EQ(ibv_post_send(&d->qp, &wr, &bad), 0);
  EXPECT_EQ(g_sends, 1);
  EXPECT_EQ(hot(find_context(d->ctx)->untracked, [](const HotCounters& h) -> auto& { return h.send_bytes; }), 64u);
  unpatch_context(d->ctx);
}

TEST(HotPath, ExtendedCreateQpIsHookedAndRestored) {
  auto d = std::make_unique<FakeDevice>(106);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  EXPECT_NE(d->vctx.create_qp_ex, fake_create_qp_ex);
  ibv_qp_init_attr_ex attr{};
  EXPECT_EQ(ibv_create_qp_ex(d->ctx, &attr), nullptr);  // reaches the fake through the hook
  unpatch_context(d->ctx);
  EXPECT_EQ(d->vctx.create_qp_ex, fake_create_qp_ex);
}

TEST(HotPath, DestroyedQpNumberNoLongerMatches) {
  auto d = std::make_unique<FakeDevice>(107);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  ContextRecord* c = find_context(d->ctx);
  EXPECT_EQ(find_qp_by_num(c, 107), r);
  untrack_qp(&d->qp);
  EXPECT_EQ(find_qp_by_num(c, 107), nullptr);
  EXPECT_EQ(find_qp(&d->qp), nullptr);
  EXPECT_TRUE(r->destroyed.load());
  unpatch_context(d->ctx);
}

TEST(HotPath, CountsStayExactWithMoreThreadsThanShards) {
  auto d = std::make_unique<FakeDevice>(108);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  constexpr int kThreads = kShards * 2 + 3, kPosts = 20000;
  std::vector<std::thread> ts;
  for (int t = 0; t < kThreads; t++)
    ts.emplace_back([&] {
      ibv_sge sge{0, 3, 0};
      ibv_send_wr wr = write_wr(&sge);
      ibv_send_wr* bad = nullptr;
      for (int i = 0; i < kPosts; i++) ibv_post_send(&d->qp, &wr, &bad);
    });
  for (auto& t : ts) t.join();
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_wrs[IBV_WR_RDMA_WRITE]; }),
            uint64_t{kThreads} * kPosts);
  EXPECT_EQ(hot(r->s, [](const HotCounters& h) -> auto& { return h.send_bytes; }), uint64_t{kThreads} * kPosts * 3);
  untrack_qp(&d->qp);
  unpatch_context(d->ctx);
}

// Busy time (busy.h): signaled sends and send completions are counted on the
// hot path; a look credits the time since the last one to a QP with a
// signaled WR out, and to no other.
TEST(HotPath, BusyTimeCountsOnlyWhileASignaledSendIsOut) {
  auto d = std::make_unique<FakeDevice>(131);
  ASSERT_TRUE(patch_context(d->ctx, "fake0"));
  QpRecord* r = track_qp(&d->qp, false);
  ASSERT_NE(r, nullptr);
  auto sig = [&] { return hot(r->s, [](const HotCounters& h) -> auto& { return h.sig_sends; }); };
  auto done = [&] { return hot(r->s, [](const HotCounters& h) -> auto& { return h.send_done; }); };
  sample_busy(1000);  // the first look only sets the start
  ibv_sge sge{0, 1 << 20, 0};
  ibv_send_wr unsig = write_wr(&sge);
  ibv_send_wr* bad = nullptr;
  ASSERT_EQ(ibv_post_send(&d->qp, &unsig, &bad), 0);
  EXPECT_EQ(sig(), 0u);
  EXPECT_EQ(sample_busy(1020), 0) << "nothing signaled is out";
  EXPECT_EQ(r->busy_ms.load(), 0u) << "an unsignaled WR says nothing of when it ends";
  ibv_send_wr s = write_wr(&sge);
  s.send_flags = IBV_SEND_SIGNALED;
  ASSERT_EQ(ibv_post_send(&d->qp, &s, &bad), 0);
  EXPECT_EQ(sig(), 1u);
  sample_busy(1040);
  sample_busy(1065);
  EXPECT_EQ(r->busy_ms.load(), 45u) << "busy from the look before the post: the share of looks is what counts";
  g_wcs[0] = ibv_wc{};
  g_wcs[0].qp_num = 131;
  g_wcs[0].opcode = IBV_WC_RDMA_WRITE;
  g_nwcs = 1;
  ibv_wc wc[4];
  ASSERT_EQ(ibv_poll_cq(&d->cq, 4, wc), 1);
  g_nwcs = 0;
  EXPECT_EQ(done(), 1u);
  const uint64_t ends = step_ends();
  sample_busy(1100);
  EXPECT_EQ(r->busy_ms.load(), 45u) << "nothing out at this look: the time since the last is not busy";
  EXPECT_EQ(step_ends(), ends + 1) << "every QP idle after work: a step's communication ended";
  EXPECT_EQ(r->last_steps.load(), 1u) << "and this QP had work at the look before";
  EXPECT_EQ(sample_busy(2000), 0) << "idle: the sampler may slow down";
  // An error completion writes off what is out: the QP is not busy for good.
  ASSERT_EQ(ibv_post_send(&d->qp, &s, &bad), 0);
  ASSERT_EQ(ibv_post_send(&d->qp, &s, &bad), 0);
  g_wcs[0].status = IBV_WC_RETRY_EXC_ERR;
  g_nwcs = 1;
  ASSERT_EQ(ibv_poll_cq(&d->cq, 4, wc), 1);
  g_nwcs = 0;
  sample_busy(2100);
  sample_busy(2200);
  EXPECT_EQ(r->busy_ms.load(), 45u);
  untrack_qp(&d->qp);
  unpatch_context(d->ctx);
}

// The QPs that finish a step's communication last are its critical path:
// of two QPs out together, only the one still out at the last busy look
// counts the step (last_steps); the other finished earlier.
TEST(HotPath, TheQpThatFinishesLastCountsTheStep) {
  auto d1 = std::make_unique<FakeDevice>(141), d2 = std::make_unique<FakeDevice>(142);
  ASSERT_TRUE(patch_context(d1->ctx, "fake1"));
  ASSERT_TRUE(patch_context(d2->ctx, "fake2"));
  QpRecord* r1 = track_qp(&d1->qp, false);
  QpRecord* r2 = track_qp(&d2->qp, false);
  ASSERT_NE(r1, nullptr);
  ASSERT_NE(r2, nullptr);
  ibv_sge sge{0, 4096, 0};
  ibv_send_wr s = write_wr(&sge);
  s.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ibv_wc wc[4];
  auto complete = [&](FakeDevice& d, uint32_t qpn) {
    g_wcs[0] = ibv_wc{};
    g_wcs[0].qp_num = qpn;
    g_wcs[0].opcode = IBV_WC_RDMA_WRITE;
    g_nwcs = 1;
    ASSERT_EQ(ibv_poll_cq(&d.cq, 4, wc), 1);
    g_nwcs = 0;
  };
  sample_busy(5000);
  sample_busy(5020);  // nothing out: no step yet
  const uint64_t ends = step_ends(), l1 = r1->last_steps.load(), l2 = r2->last_steps.load();
  for (int step = 0; step < 3; step++) {
    const int64_t t = 6000 + step * 1000;
    ASSERT_EQ(ibv_post_send(&d1->qp, &s, &bad), 0);
    ASSERT_EQ(ibv_post_send(&d2->qp, &s, &bad), 0);
    EXPECT_EQ(sample_busy(t), 2);
    complete(*d1, 141);  // the first one's part is done
    EXPECT_EQ(sample_busy(t + 20), 1);
    complete(*d2, 142);
    EXPECT_EQ(sample_busy(t + 40), 0);
    EXPECT_EQ(sample_busy(t + 500), 0) << "a compute stretch: no step ends while idle";
  }
  EXPECT_EQ(step_ends(), ends + 3);
  EXPECT_EQ(r1->last_steps.load(), l1);
  EXPECT_EQ(r2->last_steps.load(), l2 + 3);
  // Their transfer times: from 20 ms before the first look with work (the
  // look before was long ago) to the last such look: 20 and 40 ms a step.
  EXPECT_EQ(r1->transfers[1].load(), 3u) << "<= 25 ms";
  EXPECT_EQ(r2->transfers[2].load(), 3u) << "<= 50 ms";
  EXPECT_EQ(r1->transfer_ms.load(), 60u);
  EXPECT_EQ(r2->transfer_ms.load(), 120u);
  untrack_qp(&d1->qp);
  untrack_qp(&d2->qp);
  unpatch_context(d1->ctx);
  unpatch_context(d2->ctx);
}
