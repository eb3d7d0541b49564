// The state of a bundle: the types its parts share (the WR copies and
// their rings, a path, a rail) and the Bundle itself. The parts' functions
// are declared in parts.h.
//
// Locks of a bundle, in the order they are taken:
//   move_mu  one carrier move or path renewal at a time (the worker's round,
//            the peer's carrier-prepare, carrier-commit and path-renew,
//            bundle_on_destroy)
//   mu       the control path: the set-up fields, the state, dead
//   mail_mu  the mailbox's reader (report_mail): one at a time, so that the
//            filter's reports come out in the order it made them
//   lk       the data path (a spin lock, a few dozen instructions, never
//            across a call that can block): the paths' rings, held, the
//            carrier, the split groups, the counters
//   wmu      the worker's wake-ups: a leaf, taken last (never under lk)
// Taken with no bundle lock held, or last: g_mu (the list of bundles),
// g_stash_mu (owed completions, under lk), g_rid_mu (answers kept by
// request id). No bundle lock is held across the network.
#pragma once
#include <infiniband/verbs.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "interpose/verbs/bundle/life.h"
#include "interpose/verbs/bundle/move.h"
#include "interpose/verbs/rails.h"
#include "interpose/verbs/registry.h"
#include "interpose/verbs/steer.h"

namespace shunt::verbs::bundle {

using nlohmann::json;

inline constexpr uint8_t kApp = 1, kFence = 2, kProbe = 3, kSeg = 4;  // kSeg: a split's segment
inline constexpr int kPrimary = -1;

// A FIFO that reuses its slots (and what they allocated): the data path
// keeps a copy of every WR in flight without allocating in steady state.
template <class T>
class Ring {
 public:
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }
  T& operator[](size_t i) { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  const T& operator[](size_t i) const { return buf_[(head_ + i) & (buf_.size() - 1)]; }
  T& front() { return (*this)[0]; }
  T& push() {
    if (n_ == buf_.size()) grow();
    return buf_[(head_ + n_++) & (buf_.size() - 1)];
  }
  T& push_front() {
    if (n_ == buf_.size()) grow();
    head_ = (head_ + buf_.size() - 1) & (buf_.size() - 1);
    n_++;
    return buf_[head_];
  }
  void pop_front() {
    head_ = (head_ + 1) & (buf_.size() - 1);
    n_--;
  }
  void pop_back() { n_--; }
  void clear() { head_ = n_ = 0; }

 private:
  void grow() {
    std::vector<T> nb(buf_.empty() ? 16 : buf_.size() * 2);
    for (size_t i = 0; i < n_; i++) nb[i] = std::move((*this)[i]);
    buf_.swap(nb);
    head_ = 0;
  }
  std::vector<T> buf_;
  size_t head_ = 0, n_ = 0;
};

// A WR as shunt keeps it: held behind a fence, or in flight on a path
// until a completion proves it done (the failover replays it otherwise).
struct Copy {
  ibv_send_wr wr{};
  ibv_sge sge[4]{};
  std::vector<ibv_sge> more;
  std::vector<char> inl;
  uint64_t bytes() const {
    uint64_t n = 0;
    for (int i = 0; i < wr.num_sge; i++) n += (more.empty() ? sge[i] : more[i]).length;
    return n;
  }
  uint64_t seq = 0;   // the path's WR number
  uint64_t cseq = 0;  // the message number of a WR that consumes a receive; 0: none (yet)
  bool posted = false;  // posted once before (a replay keeps its cseq)
  bool own = false;     // shunt's (a split's segment): its completion is never the application's
  uint64_t group = 0;   // a split's tail: the group of segments it waits for
  void take(const ibv_send_wr* w) {
    wr = *w;
    wr.next = nullptr;
    more.clear();
    inl.clear();
    if (w->send_flags & IBV_SEND_INLINE) {  // the caller may reuse its buffer now
      for (int i = 0; i < w->num_sge; i++) {
        const char* s = reinterpret_cast<const char*>(w->sg_list[i].addr);
        inl.insert(inl.end(), s, s + w->sg_list[i].length);
      }
      sge[0] = {0, static_cast<uint32_t>(inl.size()), 0};
      wr.num_sge = 1;
    } else if (w->num_sge <= 4) {
      for (int i = 0; i < w->num_sge; i++) sge[i] = w->sg_list[i];
    } else {
      more.assign(w->sg_list, w->sg_list + w->num_sge);
    }
  }
  ibv_send_wr* get() {
    if (!inl.empty()) sge[0].addr = reinterpret_cast<uint64_t>(inl.data());
    wr.sg_list = more.empty() ? sge : more.data();
    return &wr;
  }
};

struct RecvCopy {
  ibv_recv_wr wr{};
  ibv_sge sge[4]{};
  std::vector<ibv_sge> more;
  void take(const ibv_recv_wr* w) {
    wr = *w;
    wr.next = nullptr;
    if (w->num_sge <= 4) {
      for (int i = 0; i < w->num_sge; i++) sge[i] = w->sg_list[i];
    } else {
      more.assign(w->sg_list, w->sg_list + w->num_sge);
    }
  }
  ibv_recv_wr* get() {
    wr.sg_list = more.empty() ? sge : more.data();
    return &wr;
  }
};

struct Signaled {
  uint64_t seq;
  uint8_t kind;
  uint64_t wr_id;
  int64_t t = 0;  // a segment's: when it was posted (ns)
};

// A path flaps when its work had kFlapHiccups hiccups within kFlapWindows
// x SHUNT_STALL_MS (the stall watch): each time, kHiccupLooks looks in a
// row found its work out and nothing more of it done (a drain of its CQ
// included), the port retransmitted, and then it was done (an ACK timeout
// waited out, not a stall).
inline constexpr int kFlapHiccups = 3;
inline constexpr int64_t kFlapWindows = 5;
inline constexpr int kHiccupLooks = 3;

struct Path {
  ibv_qp* qp = nullptr;  // null once destroyed (the record stays for the stats)
  uint32_t qpn = 0;
  QpRecord* rec = nullptr;
  int rail = 0;                 // Bundle::rails: 0 the application's NIC
  ContextRecord* pc = nullptr;  // the context of qp (the provider's ops)
  uint32_t psn = 0, remote_qpn = 0, remote_psn = 0, flow_label = 0;
  // Data path, under Bundle::lk. seq counts WRs posted here; done is the
  // seq of the last one known complete (a signaled WR completes every
  // earlier one), so the path has drained when done == posted.
  uint64_t posted = 0, done = 0;
  Ring<Signaled> signaled;
  Ring<Copy> infl;  // WRs after done, for a replay
  bool last_signaled = true;
  Life life = Life::in_service;  // in service, on probation, down (life.h)
  bool down() const { return is_down(life); }
  bool probation() const { return on_probation(life); }
  void step(LifeEvent e) { life = next(life, e); }
  int64_t probe_ms = 0;    // when its probe went out
  int64_t proven_ms = 0;   // when its last probe completed (its route worked then)
  // Its last probe was a witness's (probe_witnesses): held or unanswered,
  // it fails nothing of its own unless a path failed since it went out.
  bool witness = false;
  // Stall watch: the last `done` it saw, and since when it has not moved.
  uint64_t watch_done = 0;
  int64_t watch_ms = 0;
  uint64_t watch_look = 0;  // the look (Bundle::looks) that set watch_ms
  int64_t progress_ms = 0;  // the last look that found more of its work done
  // A drain found its work still held after kHiccupLooks looks: the hold
  // is the route's, not an application that had not polled.
  bool hold_drained = false;
  // When its last kFlapHiccups hiccups ended, a ring with the newest at hiccup_at.
  std::array<int64_t, kFlapHiccups> hiccups{};
  uint8_t hiccup_at = 0;
  uint32_t gen = 0;        // renewals (each with a new flow label)
  uint64_t wrs = 0, bytes = 0, fails = 0;
  // Flowlet timing: from the first WR after a drain to the next drain.
  int64_t flow_start_ns = 0;
  uint64_t flow_bytes = 0;
  double ns_per_byte = 0;  // EWMA over the path's flowlets; 0: not measured yet
  double seg_lat = 0;      // EWMA of its split segments' time from post to completion (ns); 0: none yet
  double share = 1.0;      // its weight in a split's head
  std::string router;        // path discovery: the router 2 hops out its port was seen to take ("": not known)
  // The router discovery placed it on at setup (its home: "" where the
  // hash placed it), and the port its next renewal takes with that port's
  // router (renewal_ports; 0: the hash's).
  std::string home;
  uint32_t next_label = 0;
  std::string next_router;
  int64_t home_after = 0, home_backoff = 0;  // return_home's next try, and its doubling wait
  bool probe_alive = false;  // its source path's probes got through since its port was set
  bool probe_dead = false;   // down, and its probes were seen lost since (until they come back)
  // Its forward queue, from the host agent's probes of its source port.
  bool queue_known = false, congested = false;
  double excess_ns = 0, threshold_ns = 0;
  int last_move = 0;  // the sign of its share's last steering move
  double prev_excess_ns = -1;  // the excess at the last steering step
};

// The data path's lock: held for a few dozen instructions, never across a
// call that can block; one locked instruction when uncontended.
// Spins briefly, then yields: a holder preempted on a host with one CPU
// (a soft-RoCE guest) would otherwise be kept off it by the waiter for
// the rest of the waiter's time slice.
class SpinLock {
 public:
  void lock() {
    int spins = 0;
    while (f_.test_and_set(std::memory_order_acquire))
      while (f_.test(std::memory_order_relaxed)) {
        if (++spins < kSpins) __builtin_ia32_pause();
        else sched_yield();
      }
  }
  void unlock() { f_.clear(std::memory_order_release); }
  bool try_lock() { return !f_.test_and_set(std::memory_order_acquire); }

 private:
  static constexpr int kSpins = 128;
  std::atomic_flag f_ = ATOMIC_FLAG_INIT;
};

// What the data path found, for one of shunt's threads to report as its
// log line and event: the completion filter (bundle_filter, inside the
// application's ibv_poll_cq) and the posting of WRs (inside its
// ibv_post_send) neither log nor start a thread. What changed, changed at
// once; only the report waits.
struct Report {
  enum class Kind : uint8_t {
    path_down,    // path failed; status: its completion's status
    path_up,      // a renewed path's probe completed
    held_failed,  // a held WR could not be posted; status: the errno (an error completion is owed)
    spread_mode,  // SHUNT_SPREAD=auto: large WRITEs split (status 1) or stay on the carrier (0) now
  };
  Kind kind = Kind::path_down;
  int16_t path = 0;    // kPrimary or a shadow (path_down, path_up)
  int32_t status = 0;  // as the kind says
  float split_ns_kib = 0, pinned_ns_kib = 0;  // spread_mode: what each mode cost
};

// The bundle's reports not yet made, oldest first; under Bundle::lk. Its
// size is fixed (it lives as long as the application's QP): a report that
// finds it full is dropped and only counted, and the reader reports the
// count in one line. A path reports at most twice between two renewals
// (its probe completes, it fails), and the rest are rarer (a held WR whose
// post failed, a change of spread mode), so only a worker that has stopped
// reading lets it fill.
class Mailbox {
 public:
  static constexpr size_t kSlots = 64;
  void put(const Report& r) {
    if (n_ == kSlots) {
      dropped_++;
      return;
    }
    slot_[n_++] = r;
  }
  bool empty() const { return n_ == 0 && dropped_ == 0; }  // nothing to report, nothing dropped
  size_t size() const { return n_; }
  uint64_t dropped() const { return dropped_; }
  // Moves every report into out[0..kSlots), and the count dropped since the
  // last take into *dropped; returns how many reports.
  size_t take(Report* out, uint64_t* dropped) {
    size_t n = n_;
    std::copy(slot_.begin(), slot_.begin() + n, out);
    *dropped = dropped_;
    n_ = 0;
    dropped_ = 0;
    return n;
  }

 private:
  std::array<Report, kSlots> slot_{};
  size_t n_ = 0;
  uint64_t dropped_ = 0;
};

// A split WRITE's segments: (path, its seq there) each, and where it writes.
struct SplitGroup {
  uint64_t id = 0;
  std::vector<std::pair<int, uint64_t>> segs;
  uint64_t raddr = 0, len = 0;
  uint32_t rkey = 0;
};

// A NIC a bundle has paths on: [0] the application's QP's own, then the
// other rails the peer is reachable through (shunt's mirrors there).
struct BundleRail {
  const Rail* r = nullptr;  // null for [0]
  ContextRecord* c = nullptr;
  std::string device;
  ibv_pd* pd = nullptr;
  ibv_cq *scq = nullptr, *rcq = nullptr;
  uint8_t port = 1;
  uint16_t pkey = 0;
  int gid_index = 0;
  ibv_gid lgid{}, rgid{};
  // The peer's rkeys: on its application NIC -> on its NIC of this rail.
  std::unordered_map<uint32_t, uint32_t> rkeys;
};

// Where a bundle is in its life (Bundle::phase, under Bundle::mu); each
// value's words (phase_text) are what the stats file and shuntctl show.
enum class Phase : uint8_t {
  waiting_rts,    // made at INIT: the application's QP is not at RTS yet
  setting_up,     // the deciding end's set-up thread runs
  waiting_peer,   // the answering end: waits for the peer's shim to join
  finding_paths,  // the deciding end: discovers the routers of its shadows' ports
  asking_peer,    // the deciding end: bundle-join sent
  joined,         // the answering end: joined, waits for bundle-activate
  active,         // its paths carry the application's work
  primary_only,   // stays on the application's QP alone (Bundle::why says why)
  failed,         // no path can carry its work: the application gets its errors (why)
};

}  // namespace shunt::verbs::bundle

namespace shunt::verbs {

struct Bundle {
  QpRecord* primary = nullptr;
  ibv_qp* pqp = nullptr;
  ContextRecord* ctx = nullptr;
  // Control path.
  std::mutex mu;
  bool dead = false, started = false, registered = false, probed = false;
  std::string probed_sports;  // the source ports the agent probes for it (JSON)
  bundle::Phase phase = bundle::Phase::waiting_rts;
  std::string why;  // primary_only or failed: the reason
  int access = 0;
  int peer_access = -1;  // the peer QP's access flags (its shadows have them); -1: not told
  uint8_t port = 1;
  uint16_t pkey = 0;
  bool have_rtr = false, have_rts = false;
  ibv_qp_attr rtr{}, rts{};
  ibv_gid lgid{}, rgid{};
  uint32_t rqpn = 0;
  std::string dir_file;
  int peer_port = 0;  // the peer's process listener, once known
  std::vector<std::string> peer_addrs;  // the peer's IPv4 addresses (its rails), for the control channel
  std::mutex move_mu;  // one carrier move or path renewal at a time
  std::mutex wmu;  // the failover worker's wake-ups
  std::condition_variable wcv;
  bool wake = false, worker = false;
  std::atomic<bool> worker_exited{false};
  std::atomic<bool> renew_now{false};  // a port came back: renew failed paths without waiting out the backoff
  bool no_worker = false;  // unit tests: no peer to ask, so no failover worker unless the test wants one
  std::mutex mail_mu;  // the mailbox's reader (report_mail)
  // Data path.
  std::atomic<bool> active{false};
  std::atomic<bool> tracking{false};  // counting messages and keeping receives (from INIT)
  bundle::SpinLock lk;
  bundle::Mailbox mail;  // what the data path found, for the worker to report
  bool flowlet = true;  // SHUNT_SPREAD, read once at activation
  bool split = false;
  uint64_t split_min = 0;
  // SHUNT_SPREAD=auto (split set too): whether a large WRITE is split or
  // stays on the carrier (pin) is chosen once per busy period (from a post
  // while the whole bundle was drained to its next drain) by which mode
  // moved its periods' bytes faster (ns per byte, EWMA): pin where the
  // application's own path is as fast as the spread (nothing collides on
  // it), split where it is slower. Each mode is tried kAutoFirst times
  // first; then every kAutoExplore-th period tries the other one.
  bool spread_auto = false;
  bool period_open = false;
  int period_mode = -1;  // in the open period: -1 no large WRITE yet, 0 pin, 1 split
  int64_t period_start_ns = 0;
  uint64_t period_bytes = 0;
  double auto_npb[2] = {0, 0};    // ns per byte of the periods in each mode (EWMA); 0: none yet
  uint64_t auto_periods[2] = {0, 0};
  uint64_t auto_choices = 0;
  int auto_best = -1;  // the mode that was faster at the last choice (-1: not known yet)
  // Steering (SHUNT_STEER): with queue, by the probes' forward queues while
  // they know at least two of the split's paths (steer_owd), else the
  // shares stay; with latency, by segment latency; off: static shares.
  bool steer = false, steer_queue = false, steer_owd = false;
  std::mt19937 rng{std::random_device{}()};
  uint64_t steer_steps = 0, steer_reversals = 0;
  // Steering a pinned bundle (SHUNT_SPREAD=pin, SHUNT_STEER=queue): the
  // carrier moves whole off a congested path to a clear one (steer.h).
  // The deciding side holds what the peer told of its halves' forward
  // queues (by path), as told at peer_view_ms; the other side when it told
  // last.
  bool carrier_steer = false;
  CarrierHold chold;
  QueueEcho echo;  // each path's highest queue each way of late (deciding side)
  std::map<int, CarrierDir> peer_view;
  CarrierDir carrier_dir;  // our carrier's queue at the last steering round
  int64_t peer_view_ms = 0;
  int64_t view_sent_ms = 0;
  uint64_t carrier_steers = 0;
  // Path discovery for the application QP's own port (ask_prim_router):
  // the awaited answer's deadline, which is also the next try's time, how
  // many tries were made (routers answer about one datagram a second per
  // host after a burst, which the shadows' discovery spent), and the
  // socket of the datagram whose answer is awaited (failover worker only).
  int64_t prim_router_next_ms = 0;
  int prim_router_tries = 0;
  int prim_router_fd = -1;
  int prim_early_fd = -1;  // its datagram of the set-up (under mu; closed by activation, fall-back or destruction)
  // split's balance of the routers: the carrier it counts for, and the
  // bundle's and that carrier's bytes when it began
  int bal_carrier = -2;
  uint64_t bal_all = 0, bal_carrier_bytes = 0;
  // Stall watch: every usable path stalled at its last look (none failed
  // for it), and how many times that began.
  bool all_stalled = false;
  uint64_t all_stalled_count = 0;
  uint64_t witness_probes = 0;  // times it probed idle paths as witnesses for a held one
  int64_t witness_ms = 0;       // when it last did
  uint64_t looks = 0;  // the stall watch's looks at it (check_stalls)
  int64_t fail_ms = 0;  // when a path last failed (a path proven since then works after it)
  std::map<int, int64_t> rail_fail_ms;  // per rail: when a path on it last failed
  int64_t last_steer_ns = 0, last_steer_event_ms = 0;
  int64_t hops_until_ms = 0;  // the answering side: until when it waits for path discovery (0: not yet asked)
  std::deque<bundle::SplitGroup> groups;  // splits whose tails wait, oldest first
  uint64_t group_ids = 0;
  std::vector<bundle::Path> paths;
  std::vector<bundle::BundleRail> rails;  // set before the bundle is active, then fixed (rkeys under lk)
  bool need_rkeys = false;  // a WR waits for an rkey of the peer's not known yet
  int gid_type = -1;
  bundle::Path prim;  // the application's QP as a path (in flight, completions)
  int cur = 0, last = bundle::kPrimary;
  uint32_t picks = 0;
  bundle::Ring<bundle::Copy> held;
  uint64_t fences = 0, held_total = 0, to_primary = 0, splits = 0, segments = 0, homecomings = 0;
  // Two-sided traffic: where it goes (the carrier: the application's QP
  // until it fails, then a shadow agreed with the peer), how many messages
  // that consume a receive were posted (cseq) and received (consumed),
  // since the QP was created, and the application's receives not yet
  // consumed, in order, for a move to another carrier.
  int carrier = bundle::kPrimary;
  bundle::Move move = bundle::Move::idle;  // a move of the carrier: none, needed, under way, given up (move.h)
  uint64_t cseq = 0, consumed = 0;
  bundle::Ring<bundle::RecvCopy> recvs;
  int rcarrier = bundle::kPrimary;  // where receives go; kNone while they move
  int pending_from = bundle::kPrimary;  // the old carrier of a move the peer prepared
  // Failover counters.
  uint64_t failovers = 0, replayed = 0, replayed_bytes = 0, synthesized = 0, swallowed = 0, moves = 0;
};

}  // namespace shunt::verbs
