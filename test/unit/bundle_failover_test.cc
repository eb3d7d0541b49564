// The bundle's failover on a hand-built ibv_context: a failed path's work
// posted again elsewhere, the carrier's move and its replay, what fails a
// path (errors, stalls, lost probes, port events) and its renewal.
#include <gtest/gtest.h>
#include <infiniband/verbs.h>

#include <errno.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/event_log.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/threads.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/parts.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/probe_ask.h"
#include "interpose/verbs/registry.h"
#include "test/unit/bundle_rig.h"

using namespace shunt::verbs;
using namespace shunt::verbs::bundle_rig;

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

namespace {
// The log, written to a file of the test's while it lives.
struct LogFile {
  std::string path = "/tmp/shunt-bundle-log-test-" + std::to_string(getpid());
  LogFile() {
    unlink(path.c_str());
    shunt::log::configure(shunt::LogLevel::info, path);
  }
  ~LogFile() {
    shunt::log::configure(shunt::LogLevel::warn, "");
    unlink(path.c_str());
  }
  std::string text() const {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }
};
}  // namespace

// The completion filter runs inside the application's ibv_poll_cq: a path
// failure it sees changes the path at once (its work goes again elsewhere,
// nothing more is posted to it), but its report only waits in the bundle's
// mailbox: nothing is logged, no event made, no thread started on the
// polling thread. The worker's first step of a round reports it, with the
// line and the event the filter once made itself.
TEST(Bundle, APathFailureSeenInPollIsReportedByTheWorkerNotThePollingThread) {
  LogFile log;
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  const uint32_t dead = g_posted[0].qpn;
  const int path = static_cast<int>(dead - r.sh[0].qp_num);
  g_posted.clear();
  const uint64_t downs = shunt::telemetry::event_count("path_down");
  const size_t threads = shunt::live_threads();
  g_cq.push_back(error_wc(dead, 1, IBV_WC_RETRY_EXC_ERR));
  EXPECT_TRUE(r.poll().empty());
  EXPECT_TRUE(bundle_json(*r.rec)["paths"][path]["down"].get<bool>());
  ASSERT_EQ(g_posted.size(), 1u);
  EXPECT_NE(g_posted[0].qpn, dead);
  EXPECT_EQ(g_posted[0].wr_id, 1u);
  uint64_t dropped = 1;
  EXPECT_EQ(bundle_mail_for_test(r.rec, &dropped), 1u);
  EXPECT_EQ(dropped, 0u);
  EXPECT_EQ(log.text().find("failed ("), std::string::npos) << log.text();
  EXPECT_EQ(shunt::telemetry::event_count("path_down"), downs);
  EXPECT_EQ(shunt::live_threads(), threads);
  // The worker's report.
  EXPECT_EQ(bundle_report_mail_for_test(r.rec), 1u);
  const std::string line = "bundle0 QP 500: path " + std::to_string(path) + " failed (" +
                           ibv_wc_status_str(IBV_WC_RETRY_EXC_ERR) + ")";
  EXPECT_NE(log.text().find(line), std::string::npos) << log.text();
  EXPECT_EQ(shunt::telemetry::event_count("path_down"), downs + 1);
  EXPECT_EQ(bundle_mail_for_test(r.rec, &dropped), 0u);
  EXPECT_EQ(bundle_report_mail_for_test(r.rec), 0u);  // once
}

// The worker's thread starts at activation, asleep: the filter only wakes
// it, and it reports the failure a moment later.
TEST(Bundle, TheWorkerStartedAtActivationReportsWhatThePollFound) {
  LogFile log;
  Rig r;
  bundle_start_worker_for_test(r.rec);
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  const uint32_t dead = g_posted[0].qpn;
  const int path = static_cast<int>(dead - r.sh[0].qp_num);
  const uint64_t downs = shunt::telemetry::event_count("path_down");
  const size_t threads = shunt::live_threads();
  g_cq.push_back(error_wc(dead, 1, IBV_WC_RETRY_EXC_ERR));
  EXPECT_TRUE(r.poll().empty());
  EXPECT_EQ(shunt::live_threads(), threads);  // the poll started none
  for (int i = 0; i < 200 && shunt::telemetry::event_count("path_down") == downs; i++) usleep(10000);
  EXPECT_EQ(shunt::telemetry::event_count("path_down"), downs + 1);
  EXPECT_NE(log.text().find("bundle0 QP 500: path " + std::to_string(path) + " failed ("), std::string::npos)
      << log.text();
}

// The mailbox has a fixed size, whoever fails to read it: past it, a report
// is dropped and counted, and the reader says how many in one line. Here
// nobody reads it while a path fails and comes back 40 times (81 reports).
TEST(Bundle, TheMailboxIsBoundedAndCountsWhatItDropped) {
  LogFile log;
  Rig r;
  const uint32_t qpn = r.sh[1].qp_num;
  const uint64_t downs = shunt::telemetry::event_count("path_down");
  const uint64_t ups = shunt::telemetry::event_count("path_up");
  g_cq.push_back(error_wc(qpn, 1, IBV_WC_RETRY_EXC_ERR));
  EXPECT_TRUE(r.poll().empty());
  for (int k = 0; k < 40; k++) {
    bundle_back_in_service_for_test(r.rec, 1);  // renewed: its probe out
    ASSERT_TRUE(bundle_probation_for_test(r.rec, 1));
    complete(qpn, 0);  // the probe completes: the path is back
    g_cq.push_back(error_wc(qpn, 1, IBV_WC_RETRY_EXC_ERR));  // and fails again
    EXPECT_TRUE(r.poll().empty());
    EXPECT_TRUE(bundle_json(*r.rec)["paths"][1]["down"].get<bool>());
  }
  uint64_t dropped = 0;
  EXPECT_EQ(bundle_mail_for_test(r.rec, &dropped), 64u);  // its slots
  EXPECT_EQ(dropped, 17u);
  EXPECT_EQ(bundle_report_mail_for_test(r.rec), 81u);
  // The first 64 in order: down, then up and down again 31 times, and up.
  EXPECT_EQ(shunt::telemetry::event_count("path_down"), downs + 32);
  EXPECT_EQ(shunt::telemetry::event_count("path_up"), ups + 32);
  EXPECT_NE(log.text().find("bundle0 QP 500: 17 reports of its paths"), std::string::npos) << log.text();
  EXPECT_EQ(bundle_mail_for_test(r.rec, &dropped), 0u);
  EXPECT_EQ(dropped, 0u);
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

// Completes every probe shunt posted (its zero-length WRITEs), as a
// device whose routes work would, and polls; returns how many.
size_t answer_probes(Rig& r) {
  size_t n = 0;
  for (const auto& p : g_posted)
    if (p.bytes == 0) complete(p.qpn, p.wr_id), n++;
  g_posted.clear();
  r.poll();
  return n;
}

// A path that retries forever never reports a dead route; the stall watch
// fails it when nothing completed for the stall time while the port kept
// retransmitting, and another path showed that a route to the peer works:
// idle paths probed as witnesses once the work was held for half a stall.
// Its work goes again on another path.
TEST(Bundle, AStalledPathFailsOnlyWhileItsPortRetransmits) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  uint32_t stuck = g_posted[0].qpn;
  g_posted.clear();
  const int64_t t = shunt::mono_ms();  // (the witnesses' answers are timed by the real clock)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);  // first look
  // Quiet for 2.5 s, but the port never retransmitted: a slow peer, no failure, no witness.
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 2500, 2000, -1), 0);
  EXPECT_TRUE(g_posted.empty());
  // It retransmitted within the stall: witnesses go out, and once one answered, the path fails.
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 2600, 2000, t + 2400), 0);
  EXPECT_EQ(answer_probes(r), 2u);  // two idle shadows on the rail (the rig's three)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 2900, 2000, t + 2400), 1);
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
  EXPECT_EQ(bundle_json(*r.rec)["witness_probes"], 1);
}

// A peer that answers on no path (its host starved of CPU: a job's start
// on soft-RoCE guests did that) holds a path's work as a dead route would,
// its port retransmitting; with no other path to show a working route the
// path is kept, however long, and its work completes there once the peer
// is back: no failover. Witnesses go out once, when the work was held for
// half a stall; one that answers fails the path only a grace later (the
// held path's own retransmission gets through in it).
TEST(Bundle, AStalledPathIsKeptWhileNoOtherPathReachesThePeer) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  const uint32_t held = g_posted[0].qpn;
  g_posted.clear();
  const int64_t t = shunt::mono_ms();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 900, 2000, t + 500), 0);
  EXPECT_TRUE(g_posted.empty());  // held less than half a stall: no witness yet
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 1100, 2000, t + 500), 0);
  std::vector<Posted> witnesses = g_posted;
  ASSERT_EQ(witnesses.size(), 2u);
  for (const auto& w : witnesses) EXPECT_EQ(w.bytes, 0u);
  g_posted.clear();
  for (int64_t at = t + 2100; at <= t + 6000; at += 250)  // stalled; nobody answers
    EXPECT_EQ(bundle_check_stalls_for_test(r.rec, at, 2000, at - 100), 0);
  EXPECT_TRUE(g_posted.empty());  // once only
  EXPECT_EQ(bundle_json(*r.rec)["all_stalled"], 0);  // (the witnesses are out)
  // The peer is back: the held work completes and so do the witnesses.
  complete(held, 1);
  for (const auto& w : witnesses) complete(w.qpn, w.wr_id);
  auto wc = r.poll();
  ASSERT_EQ(wc.size(), 1u);
  EXPECT_EQ(wc[0].wr_id, 1u);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 6300, 2000, t + 6200), 0);
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 0);
  EXPECT_FALSE(bundle_probation_for_test(r.rec, 1));
}

// A witness that answers while the path's work stays held fails the path,
// but only a grace (an eighth of a stall here: the rig's QP sets no ACK
// timeout) after the answer.
TEST(Bundle, AStalledPathFailsAGraceAfterAWitnessAnswered) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  g_posted.clear();
  const int64_t t = shunt::mono_ms() - 3000;  // (the answers come at the real clock's now)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 1100, 2000, t + 500), 0);
  ASSERT_EQ(g_posted.size(), 2u);
  EXPECT_EQ(answer_probes(r), 2u);
  const int64_t a = shunt::mono_ms();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 100, 2000, a), 0);  // too fresh
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 300, 2000, a), 1);
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 1);
}

// A witness that answers late (a slow peer) fails nothing by itself: the
// rule that fails a probe left unanswered while another answered is for
// probes after a failure (on starved guests witnesses failed so with no
// fault, and each failure probed every path again). Once a path did fail,
// it applies to the witness too.
TEST(Bundle, AWitnessThatAnswersLateFailsNothingByItself) {
  Rig r;
  char buf[64];
  ASSERT_EQ(r.post(IBV_WR_RDMA_WRITE, IBV_SEND_SIGNALED, 1, buf), 0);
  g_posted.clear();
  const int64_t t = shunt::mono_ms() - 3000;  // (the probes are timed by the real clock)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 1100, 2000, t + 500), 0);
  ASSERT_EQ(g_posted.size(), 2u);
  complete(g_posted[0].qpn, g_posted[0].wr_id);  // one witness answers, the other not yet
  g_posted.clear();
  r.poll();
  const int64_t a = shunt::mono_ms();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 600, 2000, -1), 0);  // the late one is kept
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 900, 2000, -1), 0);
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 0);
  // The held work's path fails (its port retransmits); the late witness
  // then sits behind the same fault, and fails at the next look.
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 1000, 2000, a + 950), 1);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 1250, 2000, a + 950), 1);
}

// A link that goes dark for less than a stall at a time, again and again:
// each loss holds the path's work for an ACK timeout, never for a stall.
// Three such hiccups within five stall times fail it as flapping; spread
// out, or without the port retransmitting, they are no failure.
TEST(Bundle, APathHeldUpThreeTimesWithinFiveStallsFailsAsFlapping) {
  Rig r;
  char buf[64];
  int64_t t = 1000;
  uint64_t id = 1;
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  // After an idle look, one SEND out for four looks (the last three find
  // nothing more done), then done.
  auto hiccup = [&](bool retransmits, int64_t gap) {
    t += gap;
    EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
    EXPECT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, id, buf), 0);
    EXPECT_EQ(g_posted.back().qpn, 500u);  // two-sided work: on the carrier, the application's QP
    const uint32_t q = g_posted.back().qpn;
    const int64_t retx = retransmits ? t + 100 : -1;
    int n = 0;
    for (int k = 0; k < 4; k++, t += 250) n += bundle_check_stalls_for_test(r.rec, t, 2000, retx);
    complete(q, id++);
    r.poll();
    return n + bundle_check_stalls_for_test(r.rec, t, 2000, retx);
  };
  EXPECT_EQ(hiccup(false, 250), 0);
  EXPECT_EQ(hiccup(false, 250), 0);
  EXPECT_EQ(hiccup(false, 250), 0);  // slow, but nothing retransmitted: no hiccup
  EXPECT_EQ(hiccup(true, 250), 0);
  EXPECT_EQ(hiccup(true, 9000), 0);  // the first one is out of the window by the third
  EXPECT_EQ(hiccup(true, 9000), 0);
  EXPECT_EQ(hiccup(true, 250), 0);
  EXPECT_EQ(hiccup(true, 250), 1);  // three within ten seconds
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 1);
}

// A rank busy elsewhere leaves its completions in the CQ: its work looks
// held for as long, while the port retransmits for other QPs (a job's
// start). That is no hiccup: the watch drains the CQ before it counts one.
TEST(Bundle, CompletionsTheApplicationHasNotPolledAreNoHiccup) {
  Rig r;
  char buf[64];
  int64_t t = 1000;
  uint64_t id = 1;
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  for (int i = 0; i < 5; i++) {
    t += 250;
    EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
    ASSERT_EQ(r.post(IBV_WR_SEND, IBV_SEND_SIGNALED, id, buf), 0);
    complete(g_posted.back().qpn, id);  // done at once, not polled for a second
    for (int k = 0; k < 4; k++, t += 250) EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, t), 0);
    auto wc = r.poll();
    ASSERT_EQ(wc.size(), 1u);
    EXPECT_EQ(wc[0].wr_id, id++);
    EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, t), 0);
  }
  EXPECT_EQ(bundle_json(*r.rec)["failovers"], 0);
}

// After a failure every path is probed. One whose probe goes unanswered
// for a quarter stall, with nothing of its work done since, while another
// path answered, sits behind the same fault: it fails then, not a second or more later when its own probes
// are lost. Not while no other path answered, nor one whose work moved.
TEST(Bundle, APathSilentAfterAFailureWhileAnotherAnswersFails) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[256 * 1024];
  g_posted.clear();
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, 1, buf, sizeof buf, 0x100000), 0);
  std::map<uint32_t, uint64_t> seg;
  for (const auto& p : g_posted) seg[p.qpn] = p.wr_id;
  ASSERT_EQ(seg.size(), 3u);  // a segment on each shadow
  const int64_t t = shunt::mono_ms();  // (the probes are timed by the real clock)
  complete(501, seg[501]);
  r.poll();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  g_posted.clear();
  bundle_probe_all_for_test(r.rec);
  std::map<uint32_t, uint64_t> probe;
  for (const auto& p : g_posted) probe[p.qpn] = p.wr_id;
  ASSERT_EQ(probe.size(), 3u);
  // (No retransmission yet: with a long ACK timeout the first comes late.)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 600, 2000, -1), 0);  // no other path answered
  complete(501, probe[501]);  // path 0 answers
  complete(502, seg[502]);    // path 1's work moves on, its probe behind it
  r.poll();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 300, 2000, -1), 0);  // too early
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 700, 2000, -1), 1);
  auto paths = bundle_json(*r.rec)["paths"];
  EXPECT_FALSE(paths[0]["down"].get<bool>());
  EXPECT_FALSE(paths[1]["down"].get<bool>());
  EXPECT_TRUE(paths[2]["down"].get<bool>());
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

// A path whose probes are lost while its work keeps completing is kept:
// the completions prove that its route carries packets (probes lost or late
// behind the path's own traffic in a full queue). Once none completed for
// two looks of the stall watch, it fails by its lost probes as before.
TEST(Bundle, APathWhoseWorkCompletesIsKeptThoughItsProbesAreLost) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  bundle_spread_for_test(r.rec, 2, 65536);
  static char buf[256 * 1024];
  const int64_t t = 100000;
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}, t), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  ASSERT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, 2, buf, sizeof buf, 0x100000), 0);
  std::set<uint32_t> used;
  for (auto& p : g_posted) used.insert(p.qpn), complete(p.qpn, p.wr_id);
  ASSERT_TRUE(used.count(r.sh[1].qp_num));
  g_posted.clear();
  r.poll();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 250, 2000, -1), 0);  // this look finds its work done
  bool spared = false;
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}, t + 400, &spared), 0);
  EXPECT_TRUE(spared);
  EXPECT_FALSE(bundle_json(*r.rec)["paths"][1]["down"].get<bool>());
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}, t + 750, &spared), 1);
  EXPECT_FALSE(spared);
  EXPECT_TRUE(bundle_json(*r.rec)["paths"][1]["down"].get<bool>());
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
  const int64_t t = shunt::mono_ms() - 5000;  // (the witnesses' answers come at the real clock's now)
  g_posted.clear();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 2100, 2000, t + 2000), 0);  // stuck: the others are asked
  EXPECT_EQ(answer_probes(r), 2u);
  const int64_t a = shunt::mono_ms();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 300, 2000, a), 1);  // its stuck probe
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_TRUE(bundle_renew_now_for_test(r.rec));
}

// A failure's renewal prefers the routers that paths of the bundle were
// proven through since the failure: from the far side of a dark spine-to-
// leaf link, that spine answers path discovery like any other.
TEST(Bundle, ARenewalPrefersRoutersProvenSinceTheLastFailure) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  bundle_router_for_test(r.rec, 0, "s1");
  bundle_router_for_test(r.rec, 1, "s2");
  bundle_router_for_test(r.rec, 2, "s1");
  using V = std::vector<std::string>;
  EXPECT_EQ(bundle_proven_routers_for_test(r.rec, 0, {}), (V{"s1", "s2"}));  // no failure yet
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  usleep(2000);  // (a millisecond clock)
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], false}, {port[1], true}, {port[2], true}}), 1);
  EXPECT_EQ(bundle_proven_routers_for_test(r.rec, 0, {0}), V{});  // nothing seen to work since
  bundle_back_in_service_for_test(r.rec, 1);  // probed: its probe completes
  bundle_back_in_service_for_test(r.rec, 2);  // probed: its probe is lost
  complete(502, 0);
  r.poll();
  EXPECT_FALSE(bundle_probation_for_test(r.rec, 1));
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 2));
  EXPECT_EQ(bundle_proven_routers_for_test(r.rec, 0, {0}), V{"s2"});
  EXPECT_EQ(bundle_proven_routers_for_test(r.rec, 0, {0, 1}), V{});  // a path being renewed proves nothing
  EXPECT_EQ(bundle_proven_routers_for_test(r.rec, 1, {0}), V{});     // another rail's routers
}

// After a failure a split goes only to the paths proven since (their probe
// completed): a path behind the same fault would hold its segment, and the
// message's tail with it, until its own failure is found. Until two are
// proven nothing is split: the carrier takes the whole WRITE.
TEST(Bundle, AfterAFailureSplitsGoOnlyToPathsProvenSince) {
  Rig r;
  bundle_spread_for_test(r.rec, 2, 65536);
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  static char buf[256 * 1024];
  uint64_t id = 1;
  // One WRITE: the QPs it went on (a split's segments, or the whole WRITE
  // on the carrier); the segments complete and the tail follows.
  auto write = [&] {
    g_posted.clear();
    EXPECT_EQ(r.post_remote(IBV_WR_RDMA_WRITE, id, buf, sizeof buf, 0x100000 * id), 0);
    id++;
    std::vector<Posted> segs = g_posted;
    std::set<uint32_t> on;
    for (const auto& p : segs) {
      on.insert(p.qpn);
      if (p.qpn != 500u) complete(p.qpn, p.wr_id);
    }
    r.poll();
    return on;
  };
  using S = std::set<uint32_t>;
  EXPECT_EQ(write(), (S{501, 502, 503}));  // no failure yet: every shadow
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  usleep(2000);  // (a millisecond clock)
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], false}, {port[1], true}, {port[2], true}}), 1);
  EXPECT_EQ(write(), S{500});  // none proven since: the carrier
  auto prove = [&](uint32_t qpn) {
    ASSERT_FALSE(g_posted.empty());
    EXPECT_EQ(g_posted.back().qpn, qpn);
    complete(qpn, g_posted.back().wr_id);
    r.poll();
  };
  g_posted.clear();
  bundle_back_in_service_for_test(r.rec, 0);  // renewed: its probe completes
  prove(501);
  EXPECT_FALSE(bundle_probation_for_test(r.rec, 0));
  EXPECT_EQ(write(), S{500});  // one proven: still the carrier
  g_posted.clear();
  // No worker: after the failure it would probe every shadow from its own
  // thread while this one reads what was posted.
  bundle_probe_for_test(r.rec, 1, false);
  prove(502);
  EXPECT_EQ(write(), (S{501, 502}));  // two proven: split there, not on the third
}

TEST(BundleRenewal, PicksAProvenRouterOverTheFirstAnswer) {
  using bundle::pick_renewal;
  const std::map<std::string, int> load{{"s1", 3}, {"s2", 1}};
  // After a failure: the proven router's candidate, else the first that answered.
  EXPECT_EQ(pick_renewal({"s1", "", "s2"}, "", {"s2"}, load), 2);
  EXPECT_EQ(pick_renewal({"s1", "s1", ""}, "", {"s2"}, load), 0);
  EXPECT_EQ(pick_renewal({"", "s1", "s2"}, "", {}, load), 1);
  EXPECT_EQ(pick_renewal({"", "", ""}, "", {"s2"}, load), -1);
  // Sent home: the home router's candidate, else the least loaded answer.
  EXPECT_EQ(pick_renewal({"s2", "s1", ""}, "s1", {"s2"}, load), 1);
  EXPECT_EQ(pick_renewal({"s1", "s3", "s2"}, "s4", {}, load), 1);
}

// A renewed path's stall clock starts at its renewal, not when the watch
// last saw it before it failed: else the port's retransmissions for other
// paths during the fault fail it as stalled before its probe completes.
TEST(Bundle, ARenewedPathsStallClockStartsAtItsRenewal) {
  Rig r;
  const std::vector<uint16_t> port = shadow_ports(r);
  ASSERT_EQ(port.size(), 3u);
  const int64_t t = shunt::mono_ms() - 8000;  // (the witnesses' answers come at the real clock's now)
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t, 2000, -1), 0);  // the watch's look: all idle
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], true}, {port[2], true}}), 0);
  EXPECT_EQ(bundle_probes_for_test(r.rec, {{port[0], true}, {port[1], false}, {port[2], true}}), 1);
  bundle_back_in_service_for_test(r.rec, 1);  // renewed at about 4 s: its probe in flight
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 1));
  g_posted.clear();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 4100, 2000, t + 4050), 0);  // 4 s after that look: not stalled
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 1));
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 5000, 2000, t + 4900), 0);
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, t + 6200, 2000, t + 6100), 0);  // 2.1 s after it: stuck, asks
  EXPECT_EQ(answer_probes(r), 2u);
  const int64_t a = shunt::mono_ms();
  EXPECT_EQ(bundle_check_stalls_for_test(r.rec, a + 300, 2000, a), 1);  // its probe is stuck
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

// After a failure every shadow is probed but the carrier: a probe takes
// a path out of the rotation until it completes, and one-sided work
// pinned to the carrier would go to the other shadows meanwhile, some of
// them perhaps behind the fault.
TEST(Bundle, EveryShadowButTheCarrierIsProbedAfterAFailure) {
  Rig r;
  ASSERT_TRUE(bundle_move_sends_for_test(r.rec, 1, 0));  // the carrier is path 1 now
  EXPECT_EQ(bundle_carrier_for_test(r.rec), 1);
  g_posted.clear();
  bundle_probe_all_for_test(r.rec);
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 0));
  EXPECT_FALSE(bundle_probation_for_test(r.rec, 1));
  EXPECT_TRUE(bundle_probation_for_test(r.rec, 2));
  EXPECT_EQ(posted_on(502), 0u);
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
