#include "interpose/verbs/bundle.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <random>
#include <fstream>
#include <functional>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "clocksync/clock_shm.h"
#include "interpose/core/log.h"
#include "interpose/core/mono.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/agent.h"
#include "interpose/peer/channel.h"
#include "interpose/peer/control.h"
#include "interpose/verbs/path_discovery.h"
#include "interpose/verbs/probe_ask.h"
#include "interpose/verbs/rails.h"
#include "interpose/verbs/retransmits.h"
#include "interpose/verbs/steer.h"
#include "telemetry/event_log.h"

namespace shunt::verbs {

std::atomic<int> g_shadow_qps{0};
std::atomic<uint64_t> g_stale_wcs{0};

namespace {
using nlohmann::json;

constexpr uint8_t kApp = 1, kFence = 2, kProbe = 3, kSeg = 4;  // kSeg: a split's segment
constexpr int kPrimary = -1;

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
  bool down = false;  // failed: not posted to until renewed; its errors never reach the application
  bool probation = false;  // renewed: used once its probe completed
  bool renewed = false;    // renewed and not yet seen to work (its probe's completion is its path_up)
  bool planned_down = false;  // stopped by a planned carrier move (steering), not a failure
  int64_t probe_ms = 0;    // when its probe went out
  // Stall watch: the last `done` it saw, and since when it has not moved.
  uint64_t watch_done = 0;
  int64_t watch_ms = 0;
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

}  // namespace

struct Bundle {
  QpRecord* primary = nullptr;
  ibv_qp* pqp = nullptr;
  ContextRecord* ctx = nullptr;
  // Control path.
  std::mutex mu;
  bool dead = false, started = false, registered = false, probed = false;
  std::string probed_sports;  // the source ports the agent probes for it (JSON)
  std::string state = "waiting for RTS";
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
  // Data path.
  std::atomic<bool> active{false};
  std::atomic<bool> tracking{false};  // counting messages and keeping receives (from INIT)
  SpinLock lk;
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
  int64_t last_steer_ns = 0, last_steer_event_ms = 0;
  int64_t hops_until_ms = 0;  // the answering side: until when it waits for path discovery (0: not yet asked)
  std::deque<SplitGroup> groups;  // splits whose tails wait, oldest first
  uint64_t group_ids = 0;
  std::vector<Path> paths;
  std::vector<BundleRail> rails;  // set before the bundle is active, then fixed (rkeys under lk)
  bool need_rkeys = false;  // a WR waits for an rkey of the peer's not known yet
  int gid_type = -1;
  Path prim;  // the application's QP as a path (in flight, completions)
  int cur = 0, last = kPrimary;
  uint32_t picks = 0;
  Ring<Copy> held;
  uint64_t fences = 0, held_total = 0, to_primary = 0, splits = 0, segments = 0, homecomings = 0;
  // Two-sided traffic: where it goes (the carrier: the application's QP
  // until it fails, then a shadow agreed with the peer), how many messages
  // that consume a receive were posted (cseq) and received (consumed),
  // since the QP was created, and the application's receives not yet
  // consumed, in order, for a move to another carrier.
  int carrier = kPrimary;
  bool moving = false, gave_up = false, need_move = false;
  uint64_t cseq = 0, consumed = 0;
  Ring<RecvCopy> recvs;
  int rcarrier = kPrimary;  // where receives go; kNone while they move
  int pending_from = kPrimary;  // the old carrier of a move the peer prepared
  // Failover counters.
  uint64_t failovers = 0, replayed = 0, replayed_bytes = 0, synthesized = 0, swallowed = 0, moves = 0;
};

namespace {

std::mutex g_mu;  // the list of bundles
std::vector<Bundle*>* g_bundles = nullptr;

std::string gid_hex(const ibv_gid& g) {
  char s[33];
  for (int i = 0; i < 16; i++) snprintf(s + 2 * i, 3, "%02x", g.raw[i]);
  return std::string(s, 32);
}

void settle_prim_router(Bundle* b, bool take);

// Stays primary-only: one log line and one event say why.
void fall_back(Bundle* b, const std::string& why) {
  {
    std::lock_guard g(b->mu);
    b->state = "primary-only: " + why;
    settle_prim_router(b, false);
  }
  log::warn("{} QP {}: bundle stays primary-only: {}", b->ctx->device, b->pqp->qp_num, why);
  telemetry::event("bundle_fallback",
                   {{"device", static_cast<const char*>(b->ctx->device)}, {"qpn", b->pqp->qp_num}, {"reason", why}});
}

// No thread_local generator: libshunt's TLS must stay small enough for the
// static TLS block when a program dlopens it.
uint32_t random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(mono_ms() * 2654435761u);
  return v & 0xffffff;
}

// Flow labels below 0x4000 give UDP source port 0xC000 | label (the
// kernel's rdma_flow_label_to_udp_sport), so path i gets a port of its own.
// The seed mixes in the local address, so the two ends' shadows (often of
// equal QPNs on fresh hosts) use different ports.
uint32_t flow_label_for(uint32_t seed, int i) { return ((seed * 2654435761u >> 18) + 977u * (i + 1)) % 0x3fff + 1; }
uint32_t label_seed(uint32_t qpn, const ibv_gid& lgid) {
  uint32_t a;
  memcpy(&a, lgid.raw + 12, 4);
  return qpn ^ (a * 2246822519u);
}
uint32_t label_seed(const Bundle* b) { return label_seed(b->pqp->qp_num, b->lgid); }

// The UDP source port a RoCE v2 QP with flow label fl uses (the kernel's
// rdma_flow_label_to_udp_sport; 0xC000 | fl below 0x4000).
uint32_t sport_of(uint32_t fl) { return 0xC000 | ((fl & 0x3fff) ^ ((fl & 0xFC000) >> 14)); }
// A path's source port, 0 where the device chose it (no flow label).
uint32_t path_sport(const Path& p) { return p.flow_label ? sport_of(p.flow_label) : 0; }

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

ibv_qp* create_shadow(Bundle* b, int i, std::string* err, int rail = 0) {
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

// This host's IPv4 addresses (up, not loopback): the peer's shim reaches
// this process on any of them when the rail behind the GID is down.
json local_addrs() {
  json out = json::array();
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char s[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, s, sizeof s);
    if (out.size() < 16) out.push_back(s);
  }
  freeifaddrs(ifs);
  return out;
}

void read_addrs(Bundle* b, const json& msg) {
  if (!msg.contains("addrs") || !msg["addrs"].is_array()) return;
  b->peer_addrs.clear();
  for (const auto& a : msg["addrs"]) {
    in_addr x;
    if (a.is_string() && inet_pton(AF_INET, a.get<std::string>().c_str(), &x) == 1 && b->peer_addrs.size() < 16)
      b->peer_addrs.push_back(a.get<std::string>());
  }
}

json path_json(const Bundle* b, const Path& p) {
  json x = {{"qpn", p.qpn}, {"psn", p.psn}};
  if (p.rail) x["gid"] = gid_hex(b->rails[p.rail].lgid);  // another NIC: its address
  return x;
}

json paths_json(const Bundle* b) {
  json out = json::array();
  for (const auto& p : b->paths) out.push_back(path_json(b, p));
  return out;
}

bool parse_gid(const std::string& hex, ibv_gid* g) {
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    g->raw[i] = static_cast<uint8_t>(v);
  }
  return true;
}

// One of the peer's halves: a path on its application NIC, or (gid set) on
// another of its NICs; `none`: the peer has no half for this one.
struct Half {
  uint32_t qpn = 0, psn = 0;
  bool rail = false, none = false;
  ibv_gid gid{};
};

// The peer's halves from a join request or reply (null entries: none);
// false when the list is missing, empty, longer than `max` or malformed.
bool parse_paths(const json& ps, size_t max, std::vector<Half>* out) {
  if (!ps.is_array() || ps.empty() || ps.size() > max) return false;
  out->clear();
  for (const auto& p : ps) {
    Half h;
    if (p.is_null()) {
      h.none = true;
      out->push_back(h);
      continue;
    }
    if (!p.is_object() || !p.value("qpn", json()).is_number_unsigned() ||
        !p.value("psn", json()).is_number_unsigned())
      return false;
    h.qpn = p["qpn"].get<uint32_t>() & 0xffffff;
    h.psn = p["psn"].get<uint32_t>() & 0xffffff;
    if (p.contains("gid")) {
      std::string ip;
      if (!p["gid"].is_string() || !parse_gid(p["gid"].get<std::string>(), &h.gid) || !gid_v4(h.gid, &ip)) return false;
      h.rail = true;
    }
    out->push_back(h);
  }
  return true;
}

// The peer's rkeys on its other NICs: {"rails": [{"gid", "rkeys": [[app, rail], ...]}]}.
json rkeys_json(const Bundle* b, const std::vector<uint32_t>* only = nullptr) {
  json out = json::array();
  for (size_t k = 1; k < b->rails.size(); k++) {
    json m = json::array();
    for (auto [a, x] : rkey_map(b->pqp->pd, b->rails[k].r, only ? SIZE_MAX : 1024))
      if (!only || std::find(only->begin(), only->end(), a) != only->end()) m.push_back({a, x});
    out.push_back({{"gid", gid_hex(b->rails[k].lgid)}, {"rkeys", m}});
  }
  return out;
}

// Under b->lk.
void read_rkeys(Bundle* b, const json& msg) {
  if (!msg.contains("rails") || !msg["rails"].is_array()) return;
  for (const auto& r : msg["rails"]) {
    if (!r.is_object() || !r.contains("rkeys") || !r["rkeys"].is_array()) continue;
    std::string g = r.value("gid", "");
    for (size_t k = 1; k < b->rails.size(); k++) {
      if (gid_hex(b->rails[k].rgid) != g) continue;
      for (const auto& e : r["rkeys"])
        if (e.is_array() && e.size() == 2 && e[0].is_number_unsigned() && e[1].is_number_unsigned() &&
            b->rails[k].rkeys.size() < 65536)
          b->rails[k].rkeys[e[0].get<uint32_t>()] = e[1].get<uint32_t>();
    }
  }
}

// Whether the route to `peer` leaves through rail k (no rail path over
// another NIC's route: its traffic would share the failure it is for).
bool routes_through(Bundle* b, size_t k, const ibv_gid& peer) {
  std::string ip, err;
  if (!gid_v4(peer, &ip)) return false;
  Rail* r = rail_toward(ip, b->gid_type, &err);
  return r && r == b->rails[k].r;
}

// The peer's answer to our join: its halves, in our order; ours without a
// half (no NIC of the peer's routes to that rail) go. Under b->mu.
bool read_paths(Bundle* b, const json& reply, std::string* err) {
  std::vector<Half> remote;
  if (!parse_paths(reply.contains("paths") ? reply["paths"] : json(), b->paths.size(), &remote) ||
      remote.size() != b->paths.size()) {
    *err = "the peer's shim sent no usable paths";
    return false;
  }
  std::vector<Path> keep;
  for (size_t i = 0; i < remote.size(); i++) {
    Path& p = b->paths[i];
    const Half& h = remote[i];
    bool ok = !h.none && h.rail == (p.rail != 0);
    if (ok && p.rail) {
      BundleRail& br = b->rails[p.rail];
      static const ibv_gid zero{};
      if (memcmp(br.rgid.raw, zero.raw, 16) == 0) {
        if (routes_through(b, p.rail, h.gid)) br.rgid = h.gid;
        else log::info("{} QP {}: no rail path over {}: the route to the peer's {} leaves through another NIC",
                       b->ctx->device, b->pqp->qp_num, br.device, gid_hex(h.gid));
      }
      ok = memcmp(br.rgid.raw, h.gid.raw, 16) == 0;
    }
    if (!ok) {
      ibv_destroy_qp(p.qp);
      continue;
    }
    p.remote_qpn = h.qpn;
    p.remote_psn = h.psn;
    keep.push_back(std::move(p));
  }
  if (keep.empty()) {
    *err = "the peer's shim matched none of the paths";
    return false;
  }
  b->paths = std::move(keep);
  std::lock_guard l(b->lk);
  read_rkeys(b, reply);
  return true;
}

void activate(Bundle* b) {
  {
    std::lock_guard g(b->lk);
    b->cur = 0;
    b->last = kPrimary;
    b->flowlet = config().num(Param::spread) == 1;
    b->split = config().num(Param::spread) >= 2;
    b->spread_auto = config().num(Param::spread) == 3;
    b->steer = config().num(Param::steer) != 0;
    b->steer_queue = config().num(Param::steer) == 2;
    b->carrier_steer = b->steer_queue && !b->split && !b->flowlet;
    b->split_min = static_cast<uint64_t>(config().num(Param::split_min_bytes));
    b->prim.qp = b->pqp;
    b->prim.qpn = b->pqp->qp_num;
    b->prim.rec = b->primary;
    b->prim.pc = b->ctx;
    for (auto& p : b->paths)
      if (!p.pc) p.pc = b->ctx;
    b->active.store(true, std::memory_order_release);
  }
  b->state = "active";
  // "N shadow paths (UDP source ports ...)" counts those on the QP's own
  // NIC; those on other NICs follow, per NIC.
  std::string ports, others;
  size_t own = 0, other = 0;
  for (size_t k = 0; k < std::max<size_t>(b->rails.size(), 1); k++) {
    std::string list;
    for (const auto& p : b->paths)
      if (p.rail == static_cast<int>(k)) list += (list.empty() ? "" : ",") + std::to_string(0xC000 | p.flow_label);
    if (k == 0) {
      ports = list;
    } else if (!list.empty()) {
      others += (others.empty() ? "" : "; ") + b->rails[k].device + ": " + list;
    }
  }
  for (const auto& p : b->paths) (p.rail ? other : own)++;
  log::info("{} QP {}: bundle active with {} shadow paths (UDP source ports {}){}", b->ctx->device, b->pqp->qp_num,
            own, ports, other ? " and " + std::to_string(other) + " on other NICs (" + others + ")" : std::string());
  telemetry::event("bundle_setup", {{"device", static_cast<const char*>(b->ctx->device)},
                                    {"qpn", b->pqp->qp_num},
                                    {"paths", b->paths.size()},
                                    {"udp_sports", ports}});
}

// The agent's key for the bundle's source paths on rail k (its own NIC: 0).
std::string probe_key(const Bundle* b, size_t k = 0) {
  std::string key = gid_hex(b->lgid) + "-" + std::to_string(b->pqp->qp_num);
  return k ? key + "/" + std::to_string(k) : key;
}

size_t rail_count(const Bundle* b) { return std::max<size_t>(b->rails.size(), 1); }

// Asks the host agent's probe engine to probe the peer from every shadow's
// UDP source port (clocksync source paths), each from its NIC's address to
// the peer's on that rail; again, with the new list, once renewals moved
// shadows to new ports (a no-op while the lists are the ones the agent
// has). Without a probe engine, or for a NIC whose address the engine does
// not probe from, the bundle works all the same; one line says why.
// Returns whether it registered ports the agent did not probe for it yet.
bool register_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return false;
  std::vector<json> sports, spares;
  std::vector<std::pair<std::string, std::string>> ends;  // per rail: local, peer address
  std::string all, via;  // via: the peer's address on the application's NIC
  {
    std::lock_guard g(b->mu);
    if (b->dead || !b->active.load()) return false;
    std::lock_guard l(b->lk);
    for (size_t k = 0; k < rail_count(b); k++) {
      json list = json::array(), spare = json::array();
      // The application's QP too, where shunt knows its port (its flow
      // label), until it fails (it is never renewed).
      if (!k && path_sport(b->prim) && b->prim.qp && !b->prim.down) list.push_back(path_sport(b->prim));
      for (size_t i = 0; i < b->paths.size(); i++) {
        const Path& p = b->paths[i];
        if (p.rail != static_cast<int>(k)) continue;
        list.push_back(0xC000 | p.flow_label);
        // Spares: probed at SHUNT_SPARE_PROBE_EVERY. Not the carrier (the
        // probes are how its silent loss is found; shadows that carry a
        // split find theirs by their own ACK timeouts, about
        // SHUNT_PATH_DEAD_MS), not a failed path (its probes tell when the
        // route is back), and none where queue steering reads every path's
        // queue from its probes.
        if (static_cast<int>(i) != b->carrier && !p.down && !b->steer_queue) spare.push_back(0xC000 | p.flow_label);
      }
      std::string local, peer;
      const ibv_gid& lg = k ? b->rails[k].lgid : b->lgid;
      const ibv_gid& rg = k ? b->rails[k].rgid : b->rgid;
      if (!gid_v4(lg, &local) || !gid_v4(rg, &peer)) local.clear();
      if (!k) via = peer;
      all += list.dump() + spare.dump() + ";";
      sports.push_back(std::move(list));
      spares.push_back(std::move(spare));
      ends.emplace_back(local, peer);
    }
    if (b->probed && all == b->probed_sports) return false;
  }
  bool any = false;
  for (size_t k = 0; k < sports.size(); k++) {
    if (ends[k].first.empty() || sports[k].empty()) continue;
    auto r = peer::request(sock,
                           {{"cmd", "bundle-paths"}, {"peer", ends[k].second}, {"local", ends[k].first},
                            {"sports", sports[k]}, {"spares", spares[k]}, {"key", probe_key(b, k)}, {"via", via}},
                           2000, &err);
    if (r && r->value("ok", false)) {
      any = true;
      continue;
    }
    log::once(LogLevel::info, "bundle-probes-" + std::to_string(k),
              "verbs bundles: shadow paths" + (k ? " on other NICs" : std::string()) +
                  " are not probed: " + (r ? r->value("error", r->dump()) : err));
  }
  if (!any) return false;
  std::lock_guard g(b->mu);
  b->probed = true;
  b->probed_sports = all;
  return true;
}

void drop_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return;
  for (size_t k = 0; k < rail_count(b); k++)
    peer::request(sock, {{"cmd", "bundle-paths-drop"}, {"key", probe_key(b, k)}}, 2000, &err);
}

// Makes this process reachable for its bundles and lists the QP in the
// host's directory, so the peer's shim can find its owner.
bool register_owner(Bundle* b, std::string* err) {
  int port = peer::start_process_listener(peer::job_key_from(config().str(Param::job_key)), bundle_answer);
  if (!port) {
    *err = "cannot listen for the peer's shim";
    return false;
  }
  std::string dir = bundle_dir();
  if (dir.empty()) {
    *err = "no run directory";
    return false;
  }
  mkdir(dir.c_str(), 0700);
  std::string f = dir + "/" + gid_hex(b->lgid) + "-" + std::to_string(b->pqp->qp_num);
  std::string tmp = f + ".tmp" + std::to_string(getpid());
  {
    std::ofstream o(tmp);
    o << getpid() << " " << port << "\n";
    if (!o) {
      *err = "cannot write " + tmp;
      return false;
    }
  }
  if (rename(tmp.c_str(), f.c_str()) != 0) {
    *err = "cannot write " + f;
    unlink(tmp.c_str());
    return false;
  }
  b->dir_file = f;
  return true;
}

std::optional<json> ask(const std::string& ip, int port, const json& req, std::string* err) {
  return peer::call(ip, port, peer::job_key_from(config().str(Param::job_key)), req, 3000, err);
}

// The side with the lower (GID, QPN) sets the bundle up; the other answers.
bool initiates(const Bundle* b) {
  int c = memcmp(b->lgid.raw, b->rgid.raw, 16);
  return c < 0 || (c == 0 && b->pqp->qp_num < b->rqpn);
}

std::optional<json> ask_peer(Bundle* b, json req, int total_ms, std::string* err);
void wake_worker(Bundle* b);
// A probed bundle's failover worker runs from the start, before any
// failure: it asks the host agent what the probes of its shadows' source
// ports say, fails a path whose probes are lost (fail_silent_paths), and
// steers a split bundle by the paths' queues (steer_tick) or moves a pinned
// one's carrier off a congested path (carrier_steer_tick). A split
// bundle's worker runs from the start too, to learn its application QP's
// router (ask_prim_router), which balancing its splits needs.
void start_steering(Bundle* b) {
  bool start;
  {
    std::lock_guard g(b->mu);
    start = (b->probed || b->split) && !b->dead;
  }
  if (start) wake_worker(b);
}

// Discovery's answers for (local, peer) from the host agent, which sends
// one round of datagrams for all bundles of the host to that peer (see
// HopCache): 1 with them, 0 without an agent that answers (then a bundle
// sends its own), -1 while the agent's round is out and `once` (else it
// asks again until the round ends).
int shared_hops(const std::string& local, const std::string& peer, int candidates, int wait_ms, bool once,
                std::vector<uint16_t>* ports, std::vector<std::string>* hops) {
  return shared_hops_via(agent::socket_path(), local, peer, candidates, wait_ms, once, ports, hops);
}

// From discovery's answers, `want` ports balanced over the routers that
// answered, never `prim` (the application QP's): (flow label, router) each,
// and "router xN, ..." in *spread. Empty when no router answered.
std::vector<std::pair<uint32_t, std::string>> pick_ports(std::vector<uint16_t> ports, std::vector<std::string> hops,
                                                         int want, uint32_t prim, std::string* spread) {
  for (size_t i = ports.size(); i-- > 0;)  // never the application QP's own port
    if (ports[i] == prim) ports.erase(ports.begin() + i), hops.erase(hops.begin() + i);
  std::vector<int> pick = balanced_pick(hops, want);
  std::map<std::string, int> seen;
  for (int k : pick) seen[hops[k]]++;
  spread->clear();
  for (const auto& [h, n] : seen) *spread += (spread->empty() ? "" : ", ") + (h.empty() ? "unknown" : h) + " x" + std::to_string(n);
  std::vector<std::pair<uint32_t, std::string>> out;
  if (seen.size() < 2 && seen.count("")) return out;
  for (int k : pick) out.emplace_back(ports[k] & 0x3fffu, hops[k]);  // the label whose port it is (sport_of)
  return out;
}

// The answering side's order of its placed ports (answer_join): pick_ports
// takes the routers in turn (path k on router k % R, as the deciding side's
// halves);
// here path k gets router (k / R) % R, so that over R x R paths the two
// halves of the bundle's paths meet every pair of routers (a pinned
// carrier steered off a congested spine in one direction keeps its spine
// in the other: two jobs on one pair of hosts can collide each way).
std::vector<std::pair<uint32_t, std::string>> cross_order(const std::vector<std::pair<uint32_t, std::string>>& placed) {
  std::vector<std::string> routers;
  std::map<std::string, std::deque<size_t>> by;
  for (size_t k = 0; k < placed.size(); k++) {
    if (!by.count(placed[k].second)) routers.push_back(placed[k].second);
    by[placed[k].second].push_back(k);
  }
  const size_t r = routers.size();
  if (r < 2) return placed;
  std::vector<std::pair<uint32_t, std::string>> out;
  for (size_t k = 0; k < placed.size(); k++) {
    auto* q = &by[routers[(k / r) % r]];
    for (size_t j = 0; q->empty() && j < r; j++) q = &by[routers[j]];
    out.push_back(placed[q->front()]);
    q->pop_front();
  }
  return out;
}

// The application QP's own router, asked while the bundle is set up, with
// its shadows' ports: once it is active the host agent probes from that
// port, and a discovery datagram can no longer leave from it (discovery
// takes no port another socket holds). settle_prim_router reads the answer
// and frees the port before activation; where none came, the worker asks
// again (ask_prim_router). Under b->mu.
void ask_prim_router_early(Bundle* b, uint32_t sport) {
  std::string lip, rip;
  if (b->prim_early_fd >= 0 || b->prim_router_tries || config().num(Param::path_discovery_ms) <= 0 ||
      !gid_v4(b->lgid, &lip) || !gid_v4(b->rgid, &rip))
    return;
  b->prim_router_tries++;
  b->prim_early_fd = hop_send(lip, rip, static_cast<uint16_t>(sport), 2);
}

// Under b->mu; `take`: keep the answer (at activation), else only close.
void settle_prim_router(Bundle* b, bool take = true) {
  if (b->prim_early_fd < 0) return;
  std::string hop;
  if (take && hop_answer(b->prim_early_fd, &hop) && !hop.empty()) {
    std::lock_guard l(b->lk);
    b->prim.router = hop;
  }
  close(b->prim_early_fd);
  b->prim_early_fd = -1;
}

// SHUNT_PATH_DISCOVERY_MS (path_discovery.h): on each rail with two or
// more shadows, ports balanced over the routers two hops out, before the
// shadows connect (their flow labels are theirs alone until then).
void spread_over_routers(Bundle* b) {
  const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
  if (wait_ms <= 0) return;
  struct Job {
    int rail;
    std::vector<int> paths;
    std::string lip, rip;
  };
  std::vector<Job> jobs;
  const uint32_t seed = label_seed(b);
  const uint32_t prim = sport_of(flow_label_for(seed, -1));  // the application QP's port
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    for (int r = 0; r < static_cast<int>(b->rails.size()); r++) {
      Job j{r, {}, {}, {}};
      for (int i = 0; i < static_cast<int>(b->paths.size()); i++)
        if (b->paths[i].rail == r) j.paths.push_back(i);
      if (j.paths.size() < 2 || !gid_v4(b->rails[r].lgid, &j.lip) || !gid_v4(b->rails[r].rgid, &j.rip)) continue;
      jobs.push_back(std::move(j));
    }
    ask_prim_router_early(b, prim);
  }
  for (auto& j : jobs) {
    const int want = 3 * static_cast<int>(j.paths.size());
    std::vector<uint16_t> ports;
    std::vector<std::string> hops;
    if (shared_hops(j.lip, j.rip, want, wait_ms, false, &ports, &hops) != 1) {  // no host agent: this bundle's own candidates
      ports = candidate_ports(j.lip, j.rip, want, seed);
      hops = hops_of_ports(j.lip, j.rip, ports, 2, wait_ms);
    }
    std::string spread;
    auto placed = pick_ports(std::move(ports), std::move(hops), static_cast<int>(j.paths.size()), prim, &spread);
    std::lock_guard g(b->mu);
    if (b->dead) return;
    if (placed.empty()) {
      log::info("{} QP {}: rail {}: no router answered for its ports; the hash places them", b->ctx->device,
                b->pqp->qp_num, j.rail);
      continue;
    }
    for (size_t k = 0; k < placed.size() && k < j.paths.size(); k++) {
      Path& p = b->paths[j.paths[k]];
      p.flow_label = placed[k].first, p.router = p.home = placed[k].second;
    }
    log::info("{} QP {}: rail {}: {} shadows over {}", b->ctx->device, b->pqp->qp_num, j.rail, j.paths.size(), spread);
  }
}

// answer_abort's word for a bundle it activated already.
constexpr const char* kActiveBundle = "the bundle is active";
void start_stall_watch();
void watch_resync(bool wait);
bool rails_wanted(Bundle* b);

void run_setup(Bundle* b) {
  ReentryGuard guard;
  pthread_setname_np(pthread_self(), "shunt-bundle");
  const Config& c = config();
  std::string ip, err;
  if (!gid_v4(b->rgid, &ip)) return fall_back(b, "the peer's GID is not an IPv4-mapped RoCE v2 GID");
  int n = static_cast<int>(c.num(Param::paths_per_rail));
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    init_rails(b);
    for (int i = 0; i < n; i++)
      if (!create_shadow(b, i, &err)) break;
    if (b->paths.empty()) goto failed;
    if (static_cast<int>(b->paths.size()) < n)
      log::info("{} QP {}: {} of {} shadow QPs ({})", b->ctx->device, b->pqp->qp_num, b->paths.size(), n, err);
    if (rails_wanted(b)) {
      std::string e;
      for (Rail* r : other_rails(b->ctx->device, b->gid_type)) {
        int k = add_rail(b, r, &e);
        for (int i = 0; k > 0 && i < n; i++)
          if (!create_shadow(b, static_cast<int>(b->paths.size()), &e, k)) break;
        if (k < 0 || !e.empty())
          log::info("{} QP {}: shadows on {}: {}", b->ctx->device, b->pqp->qp_num, r->device, e.empty() ? "none" : e);
        e.clear();
      }
    }
    b->state = "finding paths";
  }
  spread_over_routers(b);
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    b->state = "asking the peer";
  }
  {
    int64_t deadline = mono_ms() + c.num(Param::bundle_setup_ms);
    json join = {{"cmd", "bundle-join"},   {"gid", gid_hex(b->rgid)},       {"qpn", b->rqpn},
                 {"peer_gid", gid_hex(b->lgid)}, {"peer_qpn", b->pqp->qp_num}, {"paths", paths_json(b)},
                 {"addrs", local_addrs()}, {"rails", rkeys_json(b)}, {"access", b->access}};
    std::optional<json> reply;
    int port = 0;
    std::string last = "no answer";
    bool refused = false;
    while (mono_ms() < deadline) {
      {
        std::lock_guard g(b->mu);
        if (b->dead) return;
      }
      if (!port) {
        auto r = ask(ip, static_cast<int>(c.num(Param::peer_port)),
                     {{"cmd", "locate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, &err);
        if (!r) last = "no shim answers at " + ip + ": " + err;
        else if (r->value("port", 0) > 0) port = r->value("port", 0);
        else last = "the peer's agent: " + r->value("retry", r->value("error", std::string("?")));
      }
      if (port) {
        reply = ask(ip, port, join, &err);
        if (reply && reply->contains("paths")) break;
        if (reply && reply->contains("error")) {
          last = "the peer's shim refused: " + reply->value("error", std::string("?"));
          refused = true;
          break;
        }
        last = reply ? "the peer's shim: " + reply->value("retry", std::string("?")) : err;
        if (!reply) port = 0;  // its owner may have gone: locate again
        reply.reset();
      }
      usleep(100 * 1000);
    }
    std::unique_lock g(b->mu);
    if (b->dead) return;
    if (refused || !reply) {
      err = last;
      goto failed;
    }
    if (!read_paths(b, *reply, &err)) goto failed;
    read_addrs(b, *reply);
    b->peer_access = reply->value("access", -1);
    for (auto& p : b->paths)
      if (!connect_shadow(b, p, &err)) goto failed;
    track_shadows(b);
    b->peer_port = port;
    // The peer keeps the halves of our paths, in our order.
    json keep = json::array();
    for (const auto& p : b->paths) {
      json x = {{"qpn", p.remote_qpn}};
      if (p.rail) x["gid"] = gid_hex(b->rails[p.rail].rgid);
      keep.push_back(x);
    }
    g.unlock();  // no bundle lock across the network
    auto ok = ask_peer(b, {{"cmd", "bundle-activate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"keep", keep}},
                       5000, &err);
    if (config().num(Param::test_lose_activation) == 1) ok.reset(), err = "its answer lost (SHUNT_TEST_LOSE_ACTIVATION)";
    g.lock();
    if (b->dead) return;
    if (!ok || !ok->value("ok", false)) {
      err = "the peer did not activate: " + (ok ? ok->dump() : err);
      g.unlock();
      std::string aerr;
      auto ab = ask_peer(b, {{"cmd", "bundle-abort"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, 2000, &aerr);
      g.lock();
      if (b->dead) return;
      // The peer activated and its answer was lost (a starved host): this
      // side activates too. Left primary-only beside an active peer, it
      // would refuse the peer's every move, and the peer would give the
      // application its errors at the first false failure of its carrier.
      if (!ab || ab->value("error", "") != kActiveBundle) goto failed;
      log::info("{} QP {}: the peer's answer to the activation was lost; it is active, and so is this side",
                b->ctx->device, b->pqp->qp_num);
    }
    settle_prim_router(b);
    activate(b);
    start_stall_watch();
    g.unlock();
    register_probe_paths(b);
    start_steering(b);
    return;
  }
failed : {
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  destroy_shadows(b, false);
}
  fall_back(b, err);
}

// Paths on other NICs: wanted (SHUNT_RAILS=all) and possible (an IPv4
// GID whose type shunt knows).
bool rails_wanted(Bundle* b) { return config().num(Param::rails) == 0 && b->gid_type >= 0; }

// The answering side's rail for one of the peer's halves on another NIC:
// the NIC its route leaves through, when that is not the application's.
// Returns the rail index, or -1. Under b->mu.
int rail_for_half(Bundle* b, const ibv_gid& peer, std::string* err) {
  std::string ip;
  if (!gid_v4(peer, &ip)) return -1;
  Rail* r = rail_toward(ip, b->gid_type, err);
  if (!r || r->device == b->ctx->device) return -1;
  int k = add_rail(b, r, err);
  if (k < 0) return -1;
  BundleRail& br = b->rails[k];
  static const ibv_gid zero{};
  if (memcmp(br.rgid.raw, zero.raw, 16) == 0) br.rgid = peer;
  return memcmp(br.rgid.raw, peer.raw, 16) == 0 ? k : -1;
}

bool alive(Bundle* b) {
  std::lock_guard g(b->mu);
  return !b->dead;
}

Bundle* find_bundle(const std::string& gid, uint32_t qpn) {
  std::lock_guard g(g_mu);
  if (!g_bundles) return nullptr;
  for (auto it = g_bundles->rbegin(); it != g_bundles->rend(); ++it) {
    Bundle* b = *it;
    if (b->pqp->qp_num == qpn && gid_hex(b->lgid) == gid) {
      std::lock_guard m(b->mu);
      if (!b->dead) return b;
    }
  }
  return nullptr;
}

json answer_join(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"retry", "no such QP here yet"}};
  std::lock_guard g(b->mu);
  if (!b->have_rtr) return {{"retry", "QP not at RTR yet"}};
  if (gid_hex(b->rgid) != req.value("peer_gid", "") || b->rqpn != req.value("peer_qpn", 0u))
    return {{"error", "that QP is connected to another peer"}};
  if (b->active.load() || !b->paths.empty()) return {{"error", "bundle already set up"}};
  std::vector<Half> remote;
  if (!parse_paths(req.value("paths", json::array()), 64, &remote)) return {{"error", "no paths, or a malformed one"}};
  init_rails(b);
  const int n = static_cast<int>(config().num(Param::paths_per_rail));
  const bool rails = rails_wanted(b);
  int own = 0;
  std::string err;
  // This side's shadows on its own rail take ports from path discovery too
  // (the host agent's round towards the peer), so what this side sends
  // spreads over the routers as the deciding side's data does; left to the
  // hash, 8 ports land 6:2 or worse about half the time. While the round is
  // out the deciding side is asked to come again (it does every 100 ms), for
  // at most discovery_cap_ms (ten times SHUNT_PATH_DISCOVERY_MS) + 1 s;
  // then the hash places them.
  std::vector<std::pair<uint32_t, std::string>> placed;
  {
    int want = 0;
    for (const Half& h : remote) want += !h.none && !h.rail;
    want = std::min(want, n);
    const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
    std::string lip, rip;
    if (wait_ms > 0 && want >= 2 && !b->rails.empty() && gid_v4(b->rails[0].lgid, &lip) &&
        gid_v4(b->rails[0].rgid, &rip)) {
      std::vector<uint16_t> ports;
      std::vector<std::string> hops;
      const uint32_t prim = sport_of(flow_label_for(label_seed(b), -1));  // the application QP's port
      ask_prim_router_early(b, prim);
      const int got = shared_hops(lip, rip, 3 * want, wait_ms, true, &ports, &hops);
      if (got < 0) {
        if (!b->hops_until_ms) b->hops_until_ms = mono_ms() + discovery_cap_ms(wait_ms) + 1000;
        if (mono_ms() < b->hops_until_ms) return {{"retry", "finding paths"}};
      } else if (got > 0) {
        std::string spread;
        placed = cross_order(
            pick_ports(std::move(ports), std::move(hops), want, prim, &spread));
        if (!placed.empty())
          log::info("{} QP {}: rail 0: {} shadows over {} (the peer's bundle)", b->ctx->device, b->pqp->qp_num, want, spread);
      }
    }
  }
  json mine = json::array();
  for (const Half& h : remote) {
    int rail = h.none ? -1 : h.rail ? (rails ? rail_for_half(b, h.gid, &err) : -1) : own < n ? 0 : -1;
    if (rail < 0 || !create_shadow(b, static_cast<int>(b->paths.size()), &err, rail)) {
      mine.push_back(nullptr);
      continue;
    }
    Path& p = b->paths.back();
    p.remote_qpn = h.qpn;
    p.remote_psn = h.psn;
    if (!rail && own < static_cast<int>(placed.size()))
      p.flow_label = placed[own].first, p.router = p.home = placed[own].second;
    if (!connect_shadow(b, p, &err)) {
      ibv_destroy_qp(p.qp);
      b->paths.pop_back();
      mine.push_back(nullptr);
      continue;
    }
    if (!rail) own++;
    mine.push_back(path_json(b, p));
  }
  if (b->paths.empty()) {
    b->state = "primary-only: " + err;
    return {{"error", err.empty() ? "no path could be made" : err}};
  }
  read_addrs(b, req);
  b->peer_access = req.value("access", -1);
  {
    std::lock_guard l(b->lk);
    read_rkeys(b, req);
  }
  b->state = "joined, waiting for activation";
  return {{"paths", mine}, {"addrs", local_addrs()}, {"rails", rkeys_json(b)}, {"access", b->access}};
}

// The deciding side's list of the paths it kept (ours by QPN and NIC), in
// its order: ours not in it go, the rest take its order. Under b->mu.
bool keep_paths(Bundle* b, const json& keep, std::string* err) {
  if (!keep.is_array()) return true;  // all of them, as joined
  std::vector<Path> kept;
  std::vector<bool> used(b->paths.size(), false);
  for (const auto& x : keep) {
    uint32_t qpn = x.is_object() ? x.value("qpn", 0u) : 0;
    std::string g = x.is_object() ? x.value("gid", "") : "";
    size_t i = 0;
    for (; i < b->paths.size(); i++) {
      const Path& p = b->paths[i];
      if (!used[i] && p.qpn == qpn && (p.rail ? gid_hex(b->rails[p.rail].lgid) == g : g.empty())) break;
    }
    if (i == b->paths.size()) {
      *err = "the peer kept a path this side does not have";
      return false;
    }
    used[i] = true;
    kept.push_back(b->paths[i]);
  }
  for (size_t i = 0; i < b->paths.size(); i++)
    if (!used[i]) ibv_destroy_qp(b->paths[i].qp);
  b->paths = std::move(kept);
  return !b->paths.empty() || (*err = "the peer kept no path", false);
}

// The deciding side could not finish the setup: this side's shadows go.
json answer_abort(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  std::lock_guard g(b->mu);
  if (b->active.load()) return {{"error", kActiveBundle}};
  std::lock_guard l(b->lk);
  destroy_shadows(b, false);
  b->state = "primary-only: the peer gave up the setup";
  return {{"ok", true}};
}

json answer_activate(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  {
    std::lock_guard g(b->mu);
    if (b->paths.empty()) return {{"error", "no shadows"}};
    if (b->active.load()) return {{"ok", true}};
    std::string err;
    if (!keep_paths(b, req.value("keep", json()), &err)) {
      std::lock_guard l(b->lk);
      destroy_shadows(b, false);
      b->state = "primary-only: " + err;
      return {{"error", err}};
    }
    track_shadows(b);
    settle_prim_router(b);
    activate(b);
    start_stall_watch();
  }
  register_probe_paths(b);
  start_steering(b);
  return {{"ok", true}};
}

// ---------------------------------------------------------------- data path

constexpr int kWait = -2, kNone = -3;

bool two_sided(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_READ: return false;
    default: return true;  // SENDs, WRITE_WITH_IMM, atomics, binds, TSO...
  }
}

// Consumes a receive at the peer: the peer counts these.
bool consumes(ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
         op == IBV_WR_SEND_WITH_INV;
}

Path& P(Bundle* b, int i) { return i == kPrimary ? b->prim : b->paths[i]; }
bool drained(const Path& p) { return p.done == p.posted; }
bool usable(const Path& p) { return !p.down && !p.probation; }

// What the host agent's probes say of the bundle's source paths now, by
// (rail, source port): each path's entry of `bundle-paths-stats`. False
// when no rail's request was answered.
using ProbeStats = std::map<std::pair<int, uint32_t>, json>;
bool probe_stats(Bundle* b, ProbeStats* out) {
  std::string sock = agent::socket_path(), err;
  if (sock.empty()) return false;
  size_t rails;
  {
    std::lock_guard g(b->mu);
    rails = rail_count(b);
  }
  bool answered = false;
  for (size_t k = 0; k < rails; k++) {
    auto r = peer::request(sock, {{"cmd", "bundle-paths-stats"}, {"key", probe_key(b, k)}}, 1000, &err);
    if (!r || !r->value("ok", false)) continue;
    answered = true;
    for (const auto& p : r->value("paths", json::array())) (*out)[{static_cast<int>(k), p.value("port", 0u)}] = p;
  }
  return answered;
}

int fail_silent_paths(Bundle* b, const ProbeStats& stats);

// Steering a split bundle (steer.h): from the forward queues the host
// agent's probes measure on the shadows' source ports, moves shares off
// the congested paths. From the failover worker, every
// SHUNT_STEER_INTERVAL_MS, never under the data path's lock across the
// request. A step that moved shares is an event, at most one a second per
// bundle (with the steps taken since the last one).
void steer_tick(Bundle* b, const ProbeStats& stats) {
  std::map<std::pair<int, uint32_t>, json> by_port;  // (rail, source port) -> its queue
  for (const auto& [at, p] : stats)
    if (p.value("alive", false) && p.contains("fwd_queue") && p["fwd_queue"].value("ready", false))
      by_port[at] = p["fwd_queue"];
  std::string from, to, paths;
  uint64_t steps = 0;
  uint32_t qpn = 0;
  {
    std::lock_guard l(b->lk);
    std::vector<SteerPath> sp;
    std::vector<int> idx;
    int known = 0;
    for (size_t i = 0; i < b->paths.size(); i++) {
      Path& p = b->paths[i];
      auto it = by_port.find({p.rail, 0xC000 | p.flow_label});
      p.queue_known = it != by_port.end();
      if (p.queue_known) {
        p.excess_ns = it->second.value("excess_ns", 0.0);
        p.threshold_ns = it->second.value("threshold_ns", 0.0);
        p.congested = it->second.value("congested", false);
      }
      if (!usable(p)) continue;
      SteerPath s;
      s.share = p.share;
      s.known = p.queue_known;
      s.excess_ns = p.excess_ns;
      s.threshold_ns = p.threshold_ns;
      s.congested = p.congested;
      s.prev_excess_ns = p.prev_excess_ns;
      known += s.known;
      sp.push_back(s);
      idx.push_back(static_cast<int>(i));
    }
    b->steer_owd = known >= 2;
    if (!b->steer_owd) return;
    const int64_t t = mono_ns();
    const double interval = b->last_steer_ns ? static_cast<double>(t - b->last_steer_ns)
                                             : static_cast<double>(config().num(Param::steer_interval_ms)) * 1e6;
    b->last_steer_ns = t;
    SteerResult res = steer_step(sp, interval, b->rng);
    for (size_t j = 0; j < sp.size(); j++) b->paths[idx[j]].prev_excess_ns = sp[j].prev_excess_ns;
    if (!res.moved) return;
    b->steer_steps++;
    for (size_t j = 0; j < sp.size(); j++) b->paths[idx[j]].share = sp[j].share;
    auto mark = [&](const std::vector<int>& js, int dir) {
      std::string ports;
      for (int j : js) {
        Path& p = b->paths[idx[j]];
        if (p.last_move == -dir) b->steer_reversals++;
        p.last_move = dir;
        ports += (ports.empty() ? "" : ",") + std::to_string(0xC000 | p.flow_label);
      }
      return ports;
    };
    from = mark(res.from, -1);
    to = mark(res.to, 1);
    const int64_t now = mono_ms();
    if (now - b->last_steer_event_ms < 1000) return;
    b->last_steer_event_ms = now;
    // Each path as port:share:queue excess in us (-1 unknown), C when congested.
    for (size_t j = 0; j < sp.size(); j++) {
      const Path& p = b->paths[idx[j]];
      paths += fmt::format("{}{}:{:.2f}:{:.0f}{}", paths.empty() ? "" : " ", 0xC000 | p.flow_label, p.share,
                           p.queue_known ? p.excess_ns / 1000 : -1.0, p.congested ? ":C" : "");
    }
    steps = b->steer_steps;
    qpn = b->pqp->qp_num;
  }
  telemetry::event("steer", {{"device", static_cast<const char*>(b->ctx->device)},
                             {"qpn", qpn},
                             {"from", from},
                             {"to", to},
                             {"steps", steps},
                             {"paths", paths}});
}

// The application QP's router: discovery placed the shadows, not it.
// Asked every 2 s until a router answers, 10 times at most (none answers
// where the host agent probes from its port: discovery cannot bind it).
// Carrier steering judges paths on its spine by it, and split keeps the
// carrier's own bytes in the balance of the routers. From the failover
// worker, every round; its datagram is answered in a later round (up to
// 2 s), never waited for: a router's answer waits in the spine's queue
// with the traffic (up to 1 s in the bundles bench), and a failover must
// not wait behind it.
void ask_prim_router(Bundle* b) {
  const int64_t t = mono_ms();
  if (b->prim_router_fd >= 0) {
    std::string hop;
    const bool answered = hop_answer(b->prim_router_fd, &hop);
    if (!answered && t < b->prim_router_next_ms) return;
    close(b->prim_router_fd);
    b->prim_router_fd = -1;
    if (answered && !hop.empty()) {
      std::lock_guard l(b->lk);
      b->prim.router = hop;
      return;
    }
  }
  std::string lip, rip;
  uint16_t psport = 0;
  {
    std::lock_guard l(b->lk);
    if (b->prim.router.empty() && !b->prim.down && path_sport(b->prim) && b->prim_router_tries < 10 &&
        t >= b->prim_router_next_ms && config().num(Param::path_discovery_ms) > 0 && gid_v4(b->lgid, &lip) &&
        gid_v4(b->rgid, &rip)) {
      psport = static_cast<uint16_t>(path_sport(b->prim));
      b->prim_router_next_ms = t + 2000;  // the answer's deadline, then the next try's time
      b->prim_router_tries++;
    }
  }
  if (psport) b->prim_router_fd = hop_send(lip, rip, psport, 2);
}

// Steering a pinned bundle (steer.h): every SHUNT_STEER_INTERVAL_MS, each
// end reads its halves' forward queues (its host agent's probes of their
// source ports, the application QP's included). The other side tells the
// deciding side its own every second; the deciding side returns the path
// to move the carrier to once the hold has passed, else -1, with the
// queues that made it in *why. Never under the data path's lock across a
// request.
int carrier_steer_tick(Bundle* b, const ProbeStats& stats, bool decides, json* why) {
  auto verdict = [&](int rail, uint32_t sport) {
    if (!sport) return -1;
    auto it = stats.find({rail, sport});
    if (it == stats.end() || !it->second.value("alive", false) || !it->second.contains("fwd_queue")) return -1;
    const json& q = it->second["fwd_queue"];
    if (!q.value("ready", false)) return -1;
    return q.value("congested", false) ? 1 : 0;
  };
  auto queue = [&](int rail, uint32_t sport, const char* what) {
    auto it = stats.find({rail, sport});
    return it == stats.end() ? 0.0 : it->second.value("fwd_queue", json::object()).value(what, 0.0);
  };
  const int64_t now = mono_ms();
  json view = json::object();
  int target = -1;
  {
    std::lock_guard l(b->lk);
    if (b->moving || b->need_move || b->gave_up) return -1;
    CarrierView c;
    std::vector<CarrierView> others;
    const bool fresh = now - b->peer_view_ms < 3000;
    // Our carrier's half's router (discovery's; "" where not known).
    const Path& cp = P(b, b->carrier);
    const std::string crouter = cp.router;
    const int crail = b->carrier == kPrimary ? 0 : cp.rail;
    auto fill = [&](CarrierView& v, int i) {
      Path& p = P(b, i);
      const int rail = i == kPrimary ? 0 : p.rail;
      const uint32_t sport = i == kPrimary ? path_sport(p) : 0xC000 | p.flow_label;
      v.path = i;
      v.usable = usable(p);
      v.own.verdict = v.usable ? verdict(rail, sport) : -1;
      v.own.excess_ns = queue(rail, sport, "excess_ns");
      v.own.threshold_ns = queue(rail, sport, "threshold_ns");
      v.own.same = !crouter.empty() && p.router == crouter && rail == crail;
      auto it = b->peer_view.find(i);
      if (fresh && it != b->peer_view.end()) v.peer = it->second;
      if (decides) {
        v.own.recent_ns = b->echo.note(now, i, 0, v.own);
        v.peer.recent_ns = b->echo.note(now, i, 1, v.peer);
      }
      p.queue_known = v.own.verdict >= 0;  // for the stats and `shuntctl paths`
      p.congested = v.own.verdict == 1;
      p.excess_ns = v.own.excess_ns;
      p.threshold_ns = v.own.threshold_ns;
      // What the other side is told: [verdict, queue us, threshold us, same router]
      if (v.usable && v.own.verdict >= 0)
        view[std::to_string(i)] = json::array({v.own.verdict, std::round(v.own.excess_ns / 1000),
                                               std::round(v.own.threshold_ns / 1000), v.own.same ? 1 : 0});
    };
    if (!b->prim.down) {
      CarrierView v;
      fill(v, kPrimary);
      if (b->carrier == kPrimary) c = v;
    }
    for (size_t i = 0; i < b->paths.size(); i++) {
      CarrierView v;
      fill(v, static_cast<int>(i));
      if (static_cast<int>(i) == b->carrier) c = v;
      else others.push_back(v);
    }
    b->carrier_dir = c.own;
    if (decides) {
      target = b->chold.tick(now, carrier_target(c, others, b->rng), b->rng);
      if (target >= 0) {
        auto q = [&](const CarrierView& v) {
          return json{{"path", v.path}, {"queue_us", v.own.excess_ns / 1000}, {"own", carrier_congested(v.own) ? 1 : v.own.verdict},
                      {"peer", carrier_congested(v.peer) ? 1 : v.peer.verdict}, {"peer_queue_us", v.peer.excess_ns / 1000},
                      {"recent_us", v.own.recent_ns / 1000}};
        };
        json o = json::array();
        for (const auto& v : others)
          if (v.path == target) o = q(v);
        *why = {{"carrier", q(c)}, {"to", o}, {"hold_window_ms", b->chold.window_ms()}};
      }
      return target;
    }
    // Told every second (the queues change all the time).
    if (now - b->view_sent_ms < 1000) return -1;
    b->view_sent_ms = now;
  }
  std::string err;
  ask_peer(b, {{"cmd", "steer-view"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"view", view}}, 1000, &err);
  return -1;
}

json answer_steer_view(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  const json& v = req.contains("view") ? req["view"] : json();
  const char* expect = "view: an object of path -> [verdict -1..1, queue us, threshold us, same router 0|1] expected";
  if (!v.is_object() || v.size() > 4096) return {{"error", expect}};
  std::map<int, CarrierDir> m;
  for (const auto& [k, x] : v.items()) {
    char* end = nullptr;
    long i = std::strtol(k.c_str(), &end, 10);
    if (end == k.c_str() || *end || i < kPrimary || i > 4096 || !x.is_array() || x.size() != 4 ||
        !x[0].is_number_integer() || x[0] < -1 || x[0] > 1 || !x[1].is_number() || x[1] < 0 || !x[2].is_number() ||
        x[2] < 0 || !x[3].is_number_integer())
      return {{"error", expect}};
    CarrierDir d;
    d.verdict = x[0].get<int>();
    d.excess_ns = x[1].get<double>() * 1000;
    d.threshold_ns = x[2].get<double>() * 1000;
    d.same = x[3].get<int>() != 0;
    m[static_cast<int>(i)] = d;
  }
  std::lock_guard l(b->lk);
  b->peer_view = std::move(m);
  b->peer_view_ms = mono_ms();
  return {{"ok", true}};
}

bool signaled(const Bundle* b, const ibv_send_wr& w) {
  return (w.send_flags & IBV_SEND_SIGNALED) || b->primary->sq_sig_all;
}

// Adds to a counter only this thread writes now (under the bundle's lock):
// no locked instruction.
inline void bump_locked(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// ------------------------------------------------ synthetic completions
// Completions shunt owes the application (a WR the peer executed on a path
// that then failed), returned by the next ibv_poll_cq of their CQ.
std::mutex g_stash_mu;
std::deque<std::pair<ibv_cq*, ibv_wc>>* g_stash = nullptr;

ibv_wc_opcode wc_opcode(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM: return IBV_WC_RDMA_WRITE;
    case IBV_WR_RDMA_READ: return IBV_WC_RDMA_READ;
    case IBV_WR_ATOMIC_CMP_AND_SWP: return IBV_WC_COMP_SWAP;
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return IBV_WC_FETCH_ADD;
    default: return IBV_WC_SEND;
  }
}

void stash(ibv_cq* cq, const ibv_wc& w) {
  std::lock_guard g(g_stash_mu);
  if (!g_stash) g_stash = new std::deque<std::pair<ibv_cq*, ibv_wc>>;
  g_stash->emplace_back(cq, w);
  g_stash_n.fetch_add(1);
}

void owe(Bundle* b, const Copy& cp, ibv_wc_status st) {
  if (cp.own) return;
  ibv_wc w{};
  w.wr_id = cp.wr.wr_id;
  w.status = st;
  w.opcode = wc_opcode(cp.wr.opcode);
  w.qp_num = b->pqp->qp_num;
  if (cp.wr.opcode == IBV_WR_RDMA_READ)
    for (int i = 0; i < cp.wr.num_sge; i++)
      w.byte_len += (cp.more.empty() ? cp.sge[i] : cp.more[i]).length;
  stash(b->pqp->send_cq, w);
  b->synthesized++;
}

// ---------------------------------------------------------------- posting

// Another NIC's keys: a WR posted on a rail path carries the lkeys of the
// MRs' mirrors there and, one-sided, the peer's rkey on its NIC of the
// rail. false: a key has no mirror (an rkey the peer has not told yet is
// noted, for the failover worker to ask). Under b->lk.
constexpr int kMaxRailSge = 32;
bool lkeys_on(const Bundle* b, int rail, const ibv_sge* in, int n, ibv_sge* out) {
  if (n > kMaxRailSge) return false;
  for (int i = 0; i < n; i++) {
    out[i] = in[i];
    if (!mirror_lkey(b->pqp->context, in[i].lkey, b->rails[rail].r, &out[i].lkey)) return false;
  }
  return true;
}

bool keys_on(Bundle* b, int rail, const ibv_send_wr* w, ibv_send_wr* out, ibv_sge* sg) {
  *out = *w;
  out->next = nullptr;
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  if (!(w->send_flags & IBV_SEND_INLINE) && w->num_sge > 0) {
    if (!lkeys_on(b, rail, w->sg_list, w->num_sge, sg)) return false;
    out->sg_list = sg;
  }
  uint32_t* rkey = nullptr;
  switch (w->opcode) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_WRITE_WITH_IMM:
    case IBV_WR_RDMA_READ:
      if (len) rkey = &out->wr.rdma.rkey;
      break;
    case IBV_WR_ATOMIC_CMP_AND_SWP:
    case IBV_WR_ATOMIC_FETCH_AND_ADD: rkey = &out->wr.atomic.rkey; break;
    default: break;
  }
  if (!rkey) return true;
  auto& m = b->rails[rail].rkeys;
  auto it = m.find(*rkey);
  if (it == m.end()) {
    b->need_rkeys = true;
    return false;
  }
  *rkey = it->second;
  return true;
}

// Whether w can go on path pi as it is (always on the application's NIC).
bool fits(Bundle* b, int pi, const ibv_send_wr* w) {
  const Path& p = pi == kPrimary ? b->prim : b->paths[pi];
  if (!p.rail) return true;
  ibv_send_wr t;
  ibv_sge sg[kMaxRailSge];
  return keys_on(b, p.rail, w, &t, sg);
}

// Posts receives on path p, one by one with their keys on a rail path.
int post_recvs_on(Bundle* b, Path& p, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  if (!p.rail) return p.pc->orig.post_recv(p.qp, wr, bad);
  for (ibv_recv_wr* w = wr; w; w = w->next) {
    ibv_recv_wr t = *w;
    ibv_sge sg[kMaxRailSge];
    t.next = nullptr;
    if (!lkeys_on(b, p.rail, w->sg_list, w->num_sge, sg)) {
      *bad = w;
      return EINVAL;
    }
    t.sg_list = sg;
    ibv_recv_wr* x = nullptr;
    if (int rc = p.pc->orig.post_recv(p.qp, &t, &x)) {
      *bad = w;
      return rc;
    }
    rail_expect(1);
  }
  return 0;
}

// ------------------------------------------------ SHUNT_SPREAD=auto
constexpr uint64_t kAutoFirst = 3;     // periods each mode is tried before either is chosen
constexpr uint64_t kAutoExplore = 16;  // then every this many-th choice tries the other mode
constexpr double kAutoMargin = 0.05;   // the other mode takes over only when this much faster

// Nothing of the bundle in flight or waiting. Under b->lk.
bool bundle_drained(const Bundle* b) {
  if (!b->held.empty() || !drained(b->prim)) return false;
  for (const auto& p : b->paths)
    if (!drained(p)) return false;
  return true;
}

void open_period(Bundle* b) {
  b->period_open = true;
  b->period_mode = -1;
  b->period_start_ns = mono_ns();
  b->period_bytes = 0;
}

// The bundle drained: the period's ns per byte goes to its mode's average
// (a period without a large WRITE tells neither). Under b->lk.
void close_period(Bundle* b) {
  b->period_open = false;
  if (b->period_mode < 0 || b->period_bytes == 0) return;
  const double x = static_cast<double>(mono_ns() - b->period_start_ns) / static_cast<double>(b->period_bytes);
  double& a = b->auto_npb[b->period_mode];
  a = a > 0 ? 0.7 * a + 0.3 * x : x;
  b->auto_periods[b->period_mode]++;
}

// The mode of a period that has a large WRITE to place: each mode first
// kAutoFirst times (split first), then the faster one (the one chosen last
// time unless the other is kAutoMargin faster), except every
// kAutoExplore-th choice, which tries the other: the faster mode changes
// with what else crosses the fabric. Under b->lk.
int auto_choose(Bundle* b) {
  const uint64_t n = ++b->auto_choices;
  if (b->auto_periods[0] < kAutoFirst || b->auto_periods[1] < kAutoFirst)
    return b->auto_periods[1] <= b->auto_periods[0] ? 1 : 0;
  int best = b->auto_best >= 0 ? b->auto_best : (b->auto_npb[1] < b->auto_npb[0] ? 1 : 0);
  if (b->auto_npb[1 - best] < b->auto_npb[best] * (1 - kAutoMargin)) best = 1 - best;
  if (best != b->auto_best)
    log::info("{} QP {}: SHUNT_SPREAD=auto: large WRITEs {} now ({:.0f} ns/KiB split, {:.0f} ns/KiB pinned)",
              b->ctx->device, b->pqp->qp_num, best ? "split" : "stay on the carrier", 1024 * b->auto_npb[1],
              1024 * b->auto_npb[0]);
  b->auto_best = best;
  return n % kAutoExplore == 0 ? 1 - best : best;
}

int post_on(Bundle* b, ContextRecord* c, int target, Copy* from, ibv_send_wr* w) {
  bool sig = signaled(b, *w);
  ibv_send_wr one;
  ibv_send_wr* post = w;
  if (w->next || (sig && !(w->send_flags & IBV_SEND_SIGNALED))) {  // post this WR alone, as asked
    one = *w;
    one.next = nullptr;
    if (sig) one.send_flags |= IBV_SEND_SIGNALED;
    post = &one;
  }
  ibv_send_wr* bad = nullptr;
  Path& p = P(b, target);
  bool starts = p.posted == p.done;
  if (b->spread_auto && !b->period_open) open_period(b);
  ibv_send_wr tw;
  ibv_sge tsg[kMaxRailSge];
  if (p.rail) {
    if (!keys_on(b, p.rail, post, &tw, tsg)) return EINVAL;
    post = &tw;
  }
  int rc = (p.pc ? p.pc : c)->orig.post_send(p.qp, post, &bad);
  if (rc) return rc;
  if (p.rail && sig) rail_expect(1);
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  const ibv_wr_opcode op = w->opcode;
  const uint64_t wr_id = w->wr_id;
  if (starts) p.flow_start_ns = mono_ns(), p.flow_bytes = 0;
  if (b->period_open) b->period_bytes += len;
  p.posted++;
  Copy& cp = p.infl.push();
  if (from) {
    cp = std::move(*from);  // w pointed into *from: not used below
  } else {
    cp.take(w);
    cp.cseq = 0;
    cp.posted = false;
    cp.own = false;
    cp.group = 0;
  }
  cp.seq = p.posted;
  if (!cp.posted && consumes(op)) cp.cseq = ++b->cseq;
  cp.posted = true;
  if (sig) p.signaled.push() = {p.posted, cp.own ? kSeg : kApp, wr_id, cp.own ? mono_ns() : 0};
  p.last_signaled = sig;
  b->last = target;
  p.wrs++;
  p.bytes += len;
  if (target == kPrimary) {
    b->to_primary++;
    return 0;
  }
  p.flow_bytes += len;
  if (p.rec) {  // the path's own counters, as for any QP (the shared shard)
    bump_locked(p.rec->s.hot[kShards].send_wrs[static_cast<unsigned>(op) & (kWrOpcodes - 1)], 1);
    bump_locked(p.rec->s.hot[kShards].send_bytes, len);
  }
  return 0;
}

// Shunt's own zero-byte WR (fences, probes): a WRITE, no rkey is checked
// (C9-88), but the responder still wants the QP's remote write access; a
// READ where the peer's QP allows only reads; none where it allows neither
// (an application of SENDs only, like ibv_rc_pingpong).
int own_opcode(const Bundle* b) {
  int a = b->peer_access >= 0 ? b->peer_access : b->access;
  if (a & IBV_ACCESS_REMOTE_WRITE) return IBV_WR_RDMA_WRITE;
  if (a & IBV_ACCESS_REMOTE_READ) return IBV_WR_RDMA_READ;
  return -1;
}

// Makes sure the path will report when it drains.
void fence(Bundle* b, ContextRecord* c, int path) {
  Path& p = P(b, path);
  if (p.last_signaled || p.down) return;
  const int op = own_opcode(b);
  if (op < 0) return;
  ibv_send_wr f{};
  ibv_send_wr* bad = nullptr;
  f.opcode = static_cast<ibv_wr_opcode>(op);
  f.send_flags = IBV_SEND_SIGNALED;
  if ((p.pc ? p.pc : c)->orig.post_send(p.qp, &f, &bad) != 0) return;
  if (p.rail) rail_expect(1);
  p.posted++;
  p.signaled.push() = {p.posted, kFence, 0};
  p.last_signaled = true;
  b->fences++;
}

constexpr size_t kMaxHeld = 16384;  // a QP whose depth shunt did not see

void hold(Bundle* b, const ibv_send_wr* w) {
  Copy& h = b->held.push();
  h.take(w);
  h.cseq = 0;
  h.posted = false;
  h.own = false;
  h.group = 0;
  b->held_total++;
}

int next_live(Bundle* b, int from) {
  int n = static_cast<int>(b->paths.size());
  for (int k = 1; k <= n; k++) {
    int i = ((from % n) + n + k) % n;
    if (usable(b->paths[i])) return i;
  }
  return kNone;
}

// At a drain point: the path whose flowlets drained fastest per byte
// lately (an unmeasured one first), so paths through a congested spine get
// less; every fourth pick goes round robin, to keep every estimate fresh.
int next_flowlet_path(Bundle* b) {
  int n = static_cast<int>(b->paths.size());
  int from = b->last < 0 ? b->cur : b->last;
  int best = next_live(b, from);
  if (best == kNone || b->picks++ % 4 == 3) return best;
  for (int k = 1; k <= n; k++) {
    int i = (from + k) % n;
    if (usable(b->paths[i]) && b->paths[i].ns_per_byte < b->paths[best].ns_per_byte) best = i;
  }
  return best;
}

// ---------------------------------------------------------------- split

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
  if (!b->split || (w->opcode != IBV_WR_RDMA_WRITE && w->opcode != IBV_WR_RDMA_WRITE_WITH_IMM)) return false;
  if ((w->send_flags & IBV_SEND_INLINE) || w->num_sge < 1 || w->num_sge > kMaxRailSge || b->moving) return false;
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  if (len < b->split_min || len < kSplitTail + 2 * kMinSegment) return false;
  if (!slot)
    for (size_t i = 0; i < b->held.size(); i++)
      if (!b->held[i].group) return false;  // an application WR waits: keep the order
  const uint64_t ra = w->wr.rdma.remote_addr;
  for (const auto& g : b->groups)
    if (g.rkey == w->wr.rdma.rkey && ra < g.raddr + g.len && g.raddr < ra + len) return false;
  int on[64];
  int k = 0;
  for (size_t i = 0; i < b->paths.size() && k < 64; i++)
    if (usable(b->paths[i]) && fits(b, static_cast<int>(i), w)) on[k++] = static_cast<int>(i);
  k = static_cast<int>(std::min<uint64_t>(k, (len - kSplitTail) / kMinSegment));
  if (k < 2) return false;
  if (b->spread_auto) {  // split or pin: chosen once per busy period
    if (!b->period_open) open_period(b);
    if (b->period_mode < 0) b->period_mode = auto_choose(b);
    if (b->period_mode == 0) return false;
  }
  // Each split starts on the next path: the device sends the segments in
  // the order they were posted, so the first path's segment is out first
  // and completes first whatever its share. Always from path 0, latency
  // steering took that for a fast path and grew its share to the bound.
  std::rotate(on, on + static_cast<int>(b->group_ids % static_cast<uint64_t>(k)), on + k);
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
  const uint64_t head = len - kSplitTail;
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
  double want[64];
  {
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
  uint64_t off = 0;
  const int last = b->last;
  SplitGroup grp;
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
  if (off == 0) return false;
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
  return true;
}

// A usable path w can go on as it is (its keys known there), or kNone.
int fitting_path(Bundle* b, const ibv_send_wr* w) {
  for (size_t i = 0; i < b->paths.size(); i++)
    if (usable(b->paths[i]) && fits(b, static_cast<int>(i), w)) return static_cast<int>(i);
  return kNone;
}

// Where w goes: kPrimary or a path; kWait: it waits (a fence, or a move of
// the carrier).
int route(Bundle* b, ContextRecord* c, const ibv_send_wr* w) {
  int target;
  if (two_sided(w->opcode)) {
    if (b->moving || P(b, b->carrier).down || !fits(b, b->carrier, w)) return kWait;
    target = b->carrier;
  } else if (!b->flowlet && !b->moving && usable(P(b, b->carrier)) && fits(b, b->carrier, w)) {
    target = b->carrier;  // pin: with the two-sided work, never fenced
  } else {
    if (b->flowlet && (b->last == kPrimary || drained(P(b, b->last)))) b->cur = next_flowlet_path(b);
    if (b->cur < 0 || !usable(b->paths[b->cur])) b->cur = next_live(b, b->cur < 0 ? 0 : b->cur);
    target = b->cur;
    if (target != kNone && !fits(b, target, w)) target = fitting_path(b, w);
    if (target == kNone) {  // every shadow failed: the carrier takes it all
      b->cur = 0;
      if (b->moving || P(b, b->carrier).down || !fits(b, b->carrier, w)) return kWait;
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
      log::error("{} QP {}: a held WR could not be posted ({}); the application gets an error completion",
                 c->device, b->pqp->qp_num, strerror(rc));
      owe(b, h, IBV_WC_LOC_QP_OP_ERR);
    }
    b->held.pop_front();
  }
}

// ---------------------------------------------------------------- failover

// path_failed statuses that are not a completion's (-1: the peer's word)
constexpr int kStalled = -3;   // the stall watch
constexpr int kPortDown = -4;  // a port or device event
constexpr int kProbesLost = -5;  // the host agent's probes of its source port

// What the poll path decided under the lock, done after it (events,
// threads: never under the spin lock).
struct After {
  std::vector<std::pair<int, int>> down;  // (path, wc status)
  std::vector<int> up;                    // renewed paths whose probe completed
};

// Takes path pi out of service: its in-flight work goes again elsewhere,
// a carrier's after the peer agrees. counted: a failure (false: a planned
// renewal, see return_home).
void path_failed(Bundle* b, int pi, int status, After* a, bool counted = true);

// The path's WRs in flight from index `from` on go back to the front of the
// held queue, in order, to be posted again on live paths; an atomic gets
// its error instead (it may have executed). Then the path has nothing in
// flight. Returns how many WRs are to be posted again. Under b->lk.
size_t requeue(Bundle* b, int pi, size_t from) {
  Path& p = P(b, pi);
  size_t again = 0, atomics = 0;
  for (auto& g : b->groups)  // its segments go again ahead of every tail: no longer waited for here
    std::erase_if(g.segs, [pi](const auto& x) { return x.first == pi; });
  for (size_t i = p.infl.size(); i-- > from;) {
    ibv_wr_opcode op = p.infl[i].wr.opcode;
    if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
      owe(b, p.infl[i], IBV_WC_RETRY_EXC_ERR);
      atomics++;
      continue;
    }
    b->replayed_bytes += p.infl[i].bytes();
    b->held.push_front() = std::move(p.infl[i]);
    again++;
  }
  if (atomics)
    log::warn("{} QP {}: {} atomic WRs were in flight on the failed path; they complete with an error (an atomic "
              "may have executed, so it is never sent again)", b->ctx->device, b->pqp->qp_num, atomics);
  b->replayed += again;
  p.infl.clear();
  p.signaled.clear();
  p.done = p.posted;
  if (b->last == pi) b->last = kPrimary;
  return again;
}

// A shadow's WRs after its last known completion are posted again. A
// one-sided WR may have executed already: WRITE and READ are simply
// executed again, and no WR the peer can observe has followed it (the fence).
void replay_local(Bundle* b, int pi) { requeue(b, pi, 0); }

// A path failed (an error completion on it). Under b->lk.
void path_failed(Bundle* b, int pi, int status, After* a, bool counted) {
  Path& p = P(b, pi);
  if (p.down) return;
  p.down = true;
  if (counted) p.fails++, b->failovers++;
  a->down.emplace_back(pi, status);
  if (pi == b->carrier && !b->moving) {
    b->moving = true;  // two-sided work waits for the peer's agreement
    b->need_move = true;
  } else if (pi != b->carrier) {
    replay_local(b, pi);
  }
}

std::vector<int> down_list(Bundle* b) {
  std::lock_guard l(b->lk);
  std::vector<int> d;
  for (size_t i = 0; i < b->paths.size(); i++)
    if (b->paths[i].down) d.push_back(static_cast<int>(i));
  return d;
}

void mark_down(Bundle* b, ContextRecord* c, const json& list) {
  if (!list.is_array()) return;
  std::lock_guard l(b->lk);
  After a;
  for (const auto& x : list) {
    if (!x.is_number_integer()) continue;
    int i = x.get<int>();
    if (i < 0 || i >= static_cast<int>(b->paths.size()) || b->paths[i].down || i == b->carrier) continue;
    path_failed(b, i, -1, &a);
  }
  flush_held(b, c);
}

// Polls the bundle's CQs empty (shunt's own completions and the bookkeeping
// of every path as usual); what the application must see is kept for its
// next poll, in order.
void drain(Bundle* b) {
  usleep(2000);  // a completion the device was making as the QP changed state
  drain_cq(b->ctx, b->pqp->send_cq, [&](const ibv_wc& w) { stash(b->pqp->send_cq, w); });
  if (b->pqp->recv_cq != b->pqp->send_cq) drain_cq(b->ctx, b->pqp->recv_cq, [&](const ibv_wc& w) { stash(b->pqp->recv_cq, w); });
}

// Stops the carrier: no more two-sided work on it, its QP to the error
// state, and every completion it made polled. Returns the old carrier.
int begin_move(Bundle* b, bool planned = false) {
  int from;
  {
    std::lock_guard l(b->lk);
    b->moving = true;
    from = b->carrier;
    Path& o = P(b, from);
    if (!o.down && planned) o.down = o.planned_down = true;
    else if (!o.down) o.down = true, o.fails++, b->failovers++;
    b->rcarrier = kNone;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(P(b, from).qp, &a, IBV_QP_STATE);
  drain(b);
  return from;
}

// The old carrier's receives that were not consumed go to the new carrier,
// in order. Returns how many messages this side consumed, or -1.
int64_t move_receives(Bundle* b, int to) {
  std::lock_guard l(b->lk);
  Path& t = P(b, to);
  for (size_t i = 0; i < b->recvs.size(); i++) {
    ibv_recv_wr* bad = nullptr;
    if (int rc = post_recvs_on(b, t, b->recvs[i].get(), &bad)) {
      log::error("{} QP {}: a receive could not move to path {} ({})", b->ctx->device, b->pqp->qp_num, to, strerror(rc));
      return -1;
    }
  }
  b->rcarrier = to;
  return static_cast<int64_t>(b->consumed);
}

// The peer consumed `peer_consumed` messages: the old carrier's WRs up to
// the last of those executed there (their completions are owed), the rest
// are posted again on the new carrier, which takes two-sided work from now.
bool move_sends(Bundle* b, int from, int to, uint64_t peer_consumed, json* info) {
  bool pending_bell = false;
  std::unique_lock l(b->lk);
  Path& o = P(b, from);
  size_t cut = 0;
  for (size_t i = 0; i < o.infl.size(); i++)
    if (o.infl[i].cseq && o.infl[i].cseq <= peer_consumed) cut = i + 1;
  uint64_t expect = b->cseq > peer_consumed ? b->cseq - peer_consumed : 0, have = 0;
  for (size_t i = cut; i < o.infl.size(); i++)
    if (o.infl[i].cseq > peer_consumed) have++;
  if (have != expect) {
    *info = {{"error", "messages " + std::to_string(peer_consumed + 1) + ".." + std::to_string(b->cseq) +
                           " are not all known to shunt (posted before the bundle was active?)"}};
    return false;
  }
  uint64_t owed = 0;
  for (size_t i = 0; i < cut; i++)
    if (signaled(b, o.infl[i].wr)) owe(b, o.infl[i], IBV_WC_SUCCESS), owed++;
  size_t again = requeue(b, from, cut);
  b->carrier = to;
  // The new carrier may have failed while the two sides agreed on it: then
  // its work waits for the next move.
  b->moving = b->need_move = P(b, to).down;
  b->moves++;
  flush_held(b, b->ctx);
  if (owed) {  // a real completion wakes an application waiting in event mode
    Path& t = P(b, to);
    t.last_signaled = false;
    fence(b, b->ctx, to);
    // No fence (the peer's QP allows no remote access): the doorbell, where
    // the CQ has one, lands a completion of shunt's on it instead.
    if (!t.last_signaled && b->pqp->send_cq->channel) pending_bell = true;
  }
  *info = {{"replayed", again}, {"completed", owed}, {"peer_consumed", peer_consumed}};
  l.unlock();
  if (pending_bell) ring_doorbell(b->pqp->send_cq);
  return true;
}

// Nothing can carry the work: the application gets the errors it would
// have had (flushed WRs and receives), and the bundle stops.
void give_up(Bundle* b, const std::string& why) {
  {
    std::lock_guard l(b->lk);
    if (b->gave_up) return;
    b->gave_up = true;
    b->moving = false;
    auto flush = [&](Path& p) {
      for (size_t i = 0; i < p.infl.size(); i++)
        if (signaled(b, p.infl[i].wr)) owe(b, p.infl[i], IBV_WC_WR_FLUSH_ERR);
      p.infl.clear();
      p.signaled.clear();
      p.done = p.posted;
    };
    flush(b->prim);
    for (auto& p : b->paths) flush(p);
    for (size_t i = 0; i < b->held.size(); i++)
      if (signaled(b, b->held[i].wr)) owe(b, b->held[i], IBV_WC_WR_FLUSH_ERR);
    b->held.clear();
    b->groups.clear();
    for (size_t i = 0; i < b->recvs.size(); i++) {
      ibv_wc w{};
      w.wr_id = b->recvs[i].wr.wr_id;
      w.status = IBV_WC_WR_FLUSH_ERR;
      w.opcode = IBV_WC_RECV;
      w.qp_num = b->pqp->qp_num;
      stash(b->pqp->recv_cq, w);
    }
    b->recvs.clear();
    b->active.store(false);
  }
  {
    std::lock_guard g(b->mu);
    b->state = "failed: " + why;
  }
  log::error("{} QP {}: no path can carry this QP's work any more ({}); the application gets its errors",
             b->ctx->device, b->pqp->qp_num, why);
  telemetry::event("failover_failed",
                   {{"device", static_cast<const char*>(b->ctx->device)}, {"qpn", b->pqp->qp_num}, {"reason", why}});
}

// give_up on a thread of its own (callers hold locks it takes).
void start_give_up(Bundle* b, std::string why) {
  std::thread([b, why = std::move(why)] {
    contained(
        "bundle give-up",
        [&] {
          std::lock_guard m(b->move_mu);  // see watch_commit
          if (alive(b)) give_up(b, why);
        },
        [](const std::string&) {});
  }).detach();
}

// Asks the peer's shim until total_ms, on all of its addresses (its other
// rails: the one behind its GID may be the one that failed), trying again
// on new connections (new source ports, so where a spine is dead another
// chance of an ECMP path around it). Every try carries the same request id:
// a peer that executed the request but whose answer was lost answers the
// same again.
std::optional<json> ask_peer(Bundle* b, json req, int total_ms, std::string* err) {
  std::vector<std::string> ips(1);
  if (!gid_v4(b->rgid, &ips[0])) return std::nullopt;
  {
    std::lock_guard g(b->mu);
    for (const auto& a : b->peer_addrs)
      if (a != ips[0]) ips.push_back(a);
  }
  uint64_t rid = 0;
  if (getrandom(&rid, sizeof rid, 0) != sizeof rid) rid = static_cast<uint64_t>(mono_ns());
  req["rid"] = rid & 0xffffffffffffull;
  const peer::Key key = peer::job_key_from(config().str(Param::job_key));
  int64_t deadline = mono_ms() + total_ms;
  while (mono_ms() < deadline) {
    int port;
    {
      std::lock_guard g(b->mu);
      port = b->peer_port;
    }
    size_t k = 0;
    if (!port) {  // the peer's process listener, through its host agent
      auto r = peer::race(ips, static_cast<int>(config().num(Param::peer_port)), key,
                          {{"cmd", "locate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, 1000, &k, err);
      if (r && r->value("port", 0) > 0) {
        port = r->value("port", 0);
        std::lock_guard g(b->mu);
        b->peer_port = port;
      }
    }
    if (port) {
      auto r = peer::race(ips, port, key, req, 1000, &k, err);
      if (r) return r;
    }
    usleep(20 * 1000);
  }
  return std::nullopt;
}

void event_down(Bundle* b, const After& a) {
  for (auto [pi, st] : a.down) {
    int sport;
    {
      std::lock_guard l(b->lk);
      sport = static_cast<int>(path_sport(P(b, pi)));
    }
    const char* why = st >= 0            ? ibv_wc_status_str(static_cast<ibv_wc_status>(st))
                      : st == kStalled   ? "stalled: nothing completed while the device retransmitted"
                      : st == kPortDown ? "its port went down: async event"
                      : st == kProbesLost ? "its own probes are lost: silent loss on its route"
                                         : "the peer saw it fail";
    log::warn("{} QP {}: path {} failed ({})", b->ctx->device, b->pqp->qp_num,
              pi == kPrimary ? std::string("primary") : std::to_string(pi), why);
    telemetry::event("path_down", {{"device", static_cast<const char*>(b->ctx->device)},
                                   {"qpn", b->pqp->qp_num},
                                   {"path", pi},
                                   {"udp_sport", sport},
                                   {"status", st >= 0            ? why
                                              : st == kStalled   ? "stalled"
                                              : st == kPortDown ? "port_down"
                                              : st == kProbesLost ? "probes_lost"
                                                                 : "peer"}});
  }
}

void event_all_stalled(Bundle* b, size_t n) {
  log::warn("{} QP {}: every usable path ({}) stalled at once while the device retransmitted: congestion, or a "
            "route they all share; none is failed for it (the device keeps retrying their work)",
            b->ctx->device, b->pqp->qp_num, n);
  telemetry::event("all_stalled", {{"device", static_cast<const char*>(b->ctx->device)},
                                   {"qpn", b->pqp->qp_num},
                                   {"paths", n}});
}

void event_moved(Bundle* b, int from, int to, const json& info, bool planned = false) {
  if (planned) {
    {
      std::lock_guard l(b->lk);
      b->carrier_steers++;
    }
    log::info("{} QP {}: steering moved its work from {} (its queue is congested) to path {}: {} WRs posted again",
              b->ctx->device, b->pqp->qp_num,
              from == kPrimary ? std::string("the application's QP") : "path " + std::to_string(from), to,
              info.value("replayed", 0));
    // Why (the deciding side's event only): the carrier's queue in our
    // direction and the peer's verdict on its own (-1 not known, 0 clear,
    // 1 congested), the target's likewise, and the hold's window.
    const json why = info.contains("why") && info["why"].is_object() ? info["why"] : json::object();
    const json c = why.value("carrier", json::object()), t = why.value("to", json::object());
    telemetry::event("steer-carrier", {{"device", static_cast<const char*>(b->ctx->device)},
                                       {"qpn", b->pqp->qp_num},
                                       {"from", from},
                                       {"to", to},
                                       {"replayed", info.value("replayed", 0)},
                                       {"deciding", !why.empty()},
                                       {"from_queue_us", c.value("queue_us", 0.0)},
                                       {"from_own", c.value("own", -1)},
                                       {"from_peer", c.value("peer", -1)},
                                       {"to_queue_us", t.value("queue_us", 0.0)},
                                       {"to_recent_us", t.value("recent_us", -1.0)},
                                       {"to_peer", t.value("peer", -1)},
                                       {"hold_window_ms", why.value("hold_window_ms", 0)}});
    return;
  }
  log::warn("{} QP {}: two-sided work moved from {} to path {}: {} WRs replayed, {} completions owed", b->ctx->device,
            b->pqp->qp_num, from == kPrimary ? std::string("the application's QP") : "path " + std::to_string(from),
            to, info.value("replayed", 0), info.value("completed", 0));
  telemetry::event("failover", {{"device", static_cast<const char*>(b->ctx->device)},
                                {"qpn", b->pqp->qp_num},
                                {"from", from},
                                {"to", to},
                                {"replayed", info.value("replayed", 0)},
                                {"completed", info.value("completed", 0)}});
}

// The j-th candidate flow label of path p's next renewal (j = 0: the one
// the hash alone would give it), for the draw `salt` (candidates that all
// missed a router must not be asked again for ever).
uint32_t renewal_label(Bundle* b, const Path& p, int j, uint32_t salt = 0) {
  return flow_label_for(label_seed(b) + 7919u * (p.gen + (j == 0 ? 0 : 1)) + 104729u * static_cast<uint32_t>(j) + salt,
                        static_cast<int>(&p - b->paths.data()));
}

constexpr int kRenewCandidates = 3;

// Where the next renewal of each path in `idx` goes: kRenewCandidates
// ports each, one discovery round for all (at most SHUNT_PATH_DISCOVERY_MS:
// the peer may be waiting for the answer). home (return_home): a port on
// its home router if one answered, else on the router with the fewest of
// the bundle's paths. Else (a failure) the first candidate some router
// answered for, a fresh draw of the hash among the routers that answer:
// discovery sees 2 hops out only, and a dark link further on (towards the
// peer's leaf) would catch a path sent home every time. No answer: the
// hash's. Without a home (the hash placed it at setup, or no discovery)
// nothing is chosen. Returns the paths whose port is on their home router.
// Not under b->lk; under b->move_mu.
std::vector<int> renewal_ports(Bundle* b, const std::vector<int>& idx, bool home) {
  const int wait_ms = static_cast<int>(config().num(Param::path_discovery_ms));
  std::vector<int> home_bound;
  if (wait_ms <= 0) return home_bound;
  struct Ask {
    int i;
    std::string home;
    std::vector<uint32_t> labels;
  };
  std::map<int, std::vector<Ask>> by_rail;
  std::map<std::string, int> load;  // paths per router now
  std::map<int, std::pair<std::string, std::string>> ends;
  {
    std::lock_guard g(b->mu);
    std::lock_guard l(b->lk);
    const uint32_t salt = static_cast<uint32_t>(b->rng());  // a fresh draw of candidates each round
    for (const auto& p : b->paths)
      if (!p.router.empty()) load[p.router]++;
    for (int i : idx) {
      Path& p = b->paths[i];
      p.next_label = 0;
      if (p.home.empty() || p.rail < 0 || p.rail >= static_cast<int>(b->rails.size())) continue;
      std::string lip, rip;
      if (!gid_v4(b->rails[p.rail].lgid, &lip) || !gid_v4(b->rails[p.rail].rgid, &rip)) continue;
      ends[p.rail] = {lip, rip};
      if (!p.router.empty()) load[p.router]--;  // it leaves its router
      Ask a{i, p.home, {}};
      for (int j = 1; j <= kRenewCandidates; j++) a.labels.push_back(renewal_label(b, p, j, salt));
      by_rail[p.rail].push_back(std::move(a));
    }
  }
  for (auto& [rail, asks] : by_rail) {
    std::vector<uint16_t> ports;
    for (const auto& a : asks)
      for (uint32_t fl : a.labels) ports.push_back(static_cast<uint16_t>(sport_of(fl)));
    auto hops = hops_of_ports(ends[rail].first, ends[rail].second, ports, 2, wait_ms, wait_ms);
    std::lock_guard l(b->lk);
    size_t k = 0;
    for (const auto& a : asks) {
      int pick = -1;
      for (int j = 0; j < kRenewCandidates && pick < 0 && home; j++)
        if (hops[k + j] == a.home) pick = j;
      if (pick < 0)  // home is not asked for or not answering: the router with the fewest paths, or any
        for (int j = 0; j < kRenewCandidates; j++)
          if (!hops[k + j].empty() && (pick < 0 || (home && load[hops[k + j]] < load[hops[k + pick]]))) pick = j;
      if (pick >= 0) {
        const std::string& h = hops[k + pick];
        Path& p = b->paths[a.i];
        p.next_label = a.labels[pick];
        p.next_router = h;
        load[h]++;
        if (h == a.home) home_bound.push_back(a.i);
      }
      k += kRenewCandidates;
    }
  }
  return home_bound;
}

// Puts a shadow that failed back into service with a new flow label (so a
// new ECMP path): both halves go through RESET to RTS with new PSNs, after
// every completion of the old incarnation was polled. The path then waits
// on probation until a probe (shunt's zero-length WRITE) on it completes.
bool reset_half(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = b->rails[p.rail].pkey;
  a.port_num = b->rails[p.rail].port;
  a.qp_access_flags = b->access;
  if (ibv_modify_qp(p.qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *err = std::string("shadow to INIT: ") + strerror(errno);
    return false;
  }
  p.psn = random_psn();
  p.gen++;
  if (p.next_label) {  // chosen by where it goes (renewal_ports)
    p.flow_label = p.next_label;
    p.router = p.next_router;
  } else {
    p.flow_label = renewal_label(b, p, 0);
    p.router.clear();  // a new port: its router is not known
  }
  p.next_label = 0;
  p.next_router.clear();
  p.probe_alive = false;  // a new port: its probes start over
  p.probe_dead = false;
  p.planned_down = false;
  return true;
}

// Stops the path: its QP to the error state and then RESET, so the device
// makes no more completions for it; the caller then drains the CQs once
// for all the paths it stopped. Under b->move_mu.
bool quiesce_path(Bundle* b, int i, std::string* err, bool planned = false) {
  {
    std::lock_guard l(b->lk);
    After a;
    if (!b->paths[i].down) path_failed(b, i, -1, &a, !planned);
    flush_held(b, b->ctx);
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_ERR;
  ibv_modify_qp(b->paths[i].qp, &a, IBV_QP_STATE);
  a.qp_state = IBV_QPS_RESET;
  if (ibv_modify_qp(b->paths[i].qp, &a, IBV_QP_STATE) != 0) {
    *err = std::string("shadow to RESET: ") + strerror(errno);
    return false;
  }
  return true;
}

// Shunt's zero-length signaled WRITE on a path: the path is on probation
// (out of the rotation) until it completes. Under b->lk.
void probe(Bundle* b, int i) {
  Path& p = b->paths[i];
  p.probation = true;
  p.probe_ms = mono_ms();
  p.last_signaled = false;
  uint64_t before = p.posted;
  fence(b, b->ctx, i);
  if (p.posted != before) {
    p.signaled[p.signaled.size() - 1].kind = kProbe;
    b->fences--;
  } else {
    p.probation = false;  // cannot probe: trust it
  }
}

// Returns whether it is on probation (else trusted at once: no probe).
bool back_in_service(Bundle* b, int i) {
  std::lock_guard l(b->lk);
  Path& p = b->paths[i];
  p.posted = p.done = 0;
  p.signaled.clear();
  p.infl.clear();
  p.flow_bytes = 0;
  p.ns_per_byte = 0;
  p.down = false;
  // Its stall clock starts again at the watch's next look: run on from
  // before the failure, it failed the renewed path as stalled before its
  // probe could complete (the port retransmits for others throughout a fault).
  p.watch_ms = 0;  // (its next look then takes watch_done from done)
  probe(b, i);
  p.renewed = p.probation;  // (a path that cannot be probed is trusted at once)
  return p.probation;
}

// Probes every usable shadow (after a failure, the others may sit behind
// the same fault): each is on probation, out of the rotation, until its
// probe completes; one that does not fails like any path.
void probe_all(Bundle* b) {
  std::lock_guard l(b->lk);
  for (size_t i = 0; i < b->paths.size(); i++)
    if (usable(b->paths[i])) probe(b, static_cast<int>(i));
}

// A probe completes only when somebody polls its CQ, and a rank waiting on
// its own bootstrap (TCP) polls nothing: without this, paths renewed while
// the application is away stay on probation and a move finds no candidate
// until SHUNT_HOLD_MS runs out. Shunt polls once a probe is overdue.
constexpr int64_t kProbePollMs = 100;
void poll_overdue_probes(Bundle* b) {
  bool overdue = false;
  {
    std::lock_guard l(b->lk);
    int64_t now = mono_ms();
    for (const auto& p : b->paths) overdue |= !p.down && p.probation && now - p.probe_ms >= kProbePollMs;
  }
  if (overdue) drain(b);
}

// Probes the candidates and returns those that answered within ms, in the
// order they answered (shunt polls the CQs itself meanwhile).
std::vector<int> answering(Bundle* b, const std::vector<int>& cand, int ms) {
  {
    std::lock_guard l(b->lk);
    for (int i : cand)
      if (!b->paths[i].down && !b->paths[i].probation) probe(b, i);
  }
  std::vector<int> ok;
  int64_t deadline = mono_ms() + ms;
  while (mono_ms() < deadline && ok.size() < cand.size()) {
    drain(b);
    std::lock_guard l(b->lk);
    for (int i : cand)
      if (usable(b->paths[i]) && std::find(ok.begin(), ok.end(), i) == ok.end()) ok.push_back(i);
  }
  return ok;
}

// A renewed path is on probation until its probe completes: its path_up
// comes then (event_up, from the poll path), not at the renewal, which a
// route still dead lets through as well.
void event_up(Bundle* b, int i);
void event_renewed(Bundle* b, int i, bool probation) {
  if (!probation) return event_up(b, i);  // trusted without a probe
  uint32_t port;
  {
    std::lock_guard l(b->lk);
    port = 0xC000 | b->paths[i].flow_label;
  }
  log::info("{} QP {}: path {} renewed on UDP source port {}, on probation", b->ctx->device, b->pqp->qp_num, i, port);
}

// Not under b->lk.
void event_up(Bundle* b, int i) {
  uint32_t port;
  {
    std::lock_guard l(b->lk);
    port = 0xC000 | b->paths[i].flow_label;
  }
  log::info("{} QP {}: path {} back in service on UDP source port {}", b->ctx->device, b->pqp->qp_num, i, port);
  telemetry::event("path_up", {{"device", static_cast<const char*>(b->ctx->device)},
                               {"qpn", b->pqp->qp_num},
                               {"path", i},
                               {"udp_sport", port}});
}

// Renews the given failed paths together (one exchange with the peer).
// Returns those back in service.
std::vector<int> renew_paths(Bundle* b, const std::vector<int>& want, std::string* err, bool planned) {
  std::vector<int> ready;
  for (int i : want)
    if (quiesce_path(b, i, err, planned)) ready.push_back(i);
  if (ready.empty()) return ready;
  drain(b);
  if (!planned) renewal_ports(b, ready, false);  // (a planned one chose its ports already)
  json list = json::array();
  std::vector<int> reset;
  for (int i : ready)
    if (reset_half(b, b->paths[i], err)) {
      reset.push_back(i);
      list.push_back({{"path", i}, {"psn", b->paths[i].psn}});
    }
  std::vector<int> done;
  if (reset.empty()) return done;
  auto r = ask_peer(b,
                    {{"cmd", "path-renew"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"paths", list}, {"planned", planned}},
                    3000, err);
  if (!r || !r->contains("psns") || !(*r)["psns"].is_array()) {
    if (r) *err = r->dump();
    return done;
  }
  for (const auto& x : (*r)["psns"]) {
    int i = x.value("path", -1);
    if (std::find(reset.begin(), reset.end(), i) == reset.end()) continue;
    Path& p = b->paths[i];
    p.remote_psn = x.value("psn", 0u) & 0xffffff;
    if (!connect_shadow(b, p, err)) continue;
    event_renewed(b, i, back_in_service(b, i));
    done.push_back(i);
  }
  if (done.size() < reset.size() && err->empty()) *err = "the peer renewed only some: " + r->dump();
  return done;
}

json answer_path_renew(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no active bundle for that QP"}};
  std::vector<std::pair<int, uint32_t>> want;
  for (const auto& x : req.value("paths", json::array())) {
    int i = x.is_object() ? x.value("path", -1) : -1;
    std::lock_guard l(b->lk);
    if (i >= 0 && i < static_cast<int>(b->paths.size()) && i != b->carrier)
      want.emplace_back(i, x.value("psn", 0u) & 0xffffff);
  }
  std::string err;
  std::vector<std::pair<int, uint32_t>> ready;
  const bool planned = req.value("planned", false);
  for (auto [i, psn] : want)
    if (quiesce_path(b, i, &err, planned)) ready.emplace_back(i, psn);
  if (!ready.empty()) {
    drain(b);
    std::vector<int> idx;
    for (auto [i, psn] : ready) idx.push_back(i);
    renewal_ports(b, idx, planned);  // this side's ports of those paths, by where they go
  }
  json psns = json::array();
  for (auto [i, psn] : ready) {
    Path& p = b->paths[i];
    p.remote_psn = psn;
    if (!reset_half(b, p, &err) || !connect_shadow(b, p, &err)) continue;
    event_renewed(b, i, back_in_service(b, i));
    psns.push_back({{"path", i}, {"psn", p.psn}});
  }
  if (!psns.empty()) wake_worker(b);  // polls their probes if the application does not
  return {{"psns", psns}};
}

// Moves two-sided work off a failed carrier (the deciding side). Returns
// false to try again later (no live path yet). planned_to >= 0: steering
// moves it off a live carrier to that path (why: the queues that made it),
// counting no failure; where that path does not answer its probe nothing
// moves, and where the peer does not agree after the carrier stopped, the
// move goes on as a failover's.
bool do_move(Bundle* b, int planned_to = -1, const json& why = nullptr) {
  const bool planned = planned_to >= 0;
  {
    std::lock_guard l(b->lk);
    if (b->gave_up) return true;
    if (planned && (b->moving || b->need_move || planned_to >= static_cast<int>(b->paths.size()) ||
                    planned_to == b->carrier || !usable(b->paths[planned_to])))
      return true;
  }
  if (!b->tracking.load()) {
    if (planned) return true;  // its receives cannot move: it stays
    give_up(b, "the QP uses a shared receive queue: its receives cannot move");
    return true;
  }
  std::vector<int> cand;
  if (planned) {
    cand.push_back(planned_to);
  } else {
    std::lock_guard l(b->lk);
    for (size_t i = 0; i < b->paths.size(); i++)
      if (usable(b->paths[i])) cand.push_back(static_cast<int>(i));
  }
  if (cand.empty()) return false;
  int from;
  if (planned) {
    // Before the carrier stops: a path that does not answer is no place to go.
    if (answering(b, cand, 300).empty()) return true;
    from = begin_move(b, true);
  } else {
    from = begin_move(b);
    // Only paths that answer a probe now: a path that carried nothing since
    // the fault looks usable but may sit behind it.
    cand = answering(b, cand, 300);
    if (cand.empty()) return false;
  }
  std::string err;
  auto prep = ask_peer(b,
                       {{"cmd", "carrier-prepare"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn},
                        {"candidates", cand}, {"down", down_list(b)}, {"planned", planned}},
                       10000, &err);
  if (!prep || !prep->contains("to")) {
    if (prep) mark_down(b, b->ctx, prep->value("down", json::array()));
    log::warn("{} QP {}: the peer did not agree on a new path yet: {}", b->ctx->device, b->pqp->qp_num,
              prep ? prep->dump() : err);
    if (planned) {  // the carrier is stopped: it moves as after a failure now
      std::lock_guard l(b->lk);
      b->need_move = true;
    }
    return false;
  }
  mark_down(b, b->ctx, prep->value("down", json::array()));
  int to = prep->value("to", -1);
  if (to < 0 || to >= static_cast<int>(b->paths.size())) {
    give_up(b, "the peer named no usable path");
    return true;
  }
  int64_t mine = move_receives(b, to);
  if (mine < 0) {
    give_up(b, "the receives could not move");
    return true;
  }
  json info;
  if (!move_sends(b, from, to, prep->value("consumed", uint64_t{0}), &info)) {
    give_up(b, info.value("error", ""));
    return true;
  }
  auto ok = ask_peer(b, {{"cmd", "carrier-commit"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"to", to},
                         {"consumed", mine}, {"planned", planned}},
                     10000, &err);
  if (!ok || !ok->value("ok", false)) {
    give_up(b, "the peer did not take the new path: " + (ok ? ok->dump() : err));
    return true;
  }
  info["why"] = why;
  event_moved(b, from, to, info, planned);
  return true;
}

// Work waits for rkeys of the peer's not known on a rail (MRs it
// registered after the bundle was set up): ask for them.
void refresh_rkeys(Bundle* b) {
  std::vector<uint32_t> want;
  {
    std::lock_guard l(b->lk);
    if (!b->need_rkeys) return;
    b->need_rkeys = false;
    for (size_t i = 0; i < b->held.size() && want.size() < 256; i++) {
      const ibv_send_wr& w = b->held[i].wr;
      uint32_t k = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? w.wr.atomic.rkey
                                                                                                   : w.wr.rdma.rkey;
      if (std::find(want.begin(), want.end(), k) == want.end()) want.push_back(k);
    }
  }
  if (want.empty()) return;
  std::string err;
  auto r = ask_peer(b, {{"cmd", "bundle-rkeys"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"want", want}}, 3000,
                    &err);
  if (!r) {
    log::info("{} QP {}: the peer's rkeys on its other NICs: {}", b->ctx->device, b->pqp->qp_num, err);
    std::lock_guard l(b->lk);
    b->need_rkeys = true;
    return;
  }
  std::lock_guard l(b->lk);
  read_rkeys(b, *r);
  flush_held(b, b->ctx);
}

// A renewal draws ports until one works: while a spine (or the link to
// it) is dark, every shadow that fails lands on the other spine, and stays
// there once it heals; a split job then moves what one spine carries.
// Every kHomeCheckMs while no path is down, the shadows away from the
// router discovery placed them on (their home) ask for ports there, and
// those whose home answers again are renewed onto it together, planned:
// their work goes to the others meanwhile, no failure is counted or
// reported. The deciding side only (the peer renews its halves with
// them, onto its own homes). Under b->move_mu.
constexpr int64_t kHomeCheckMs = 2000;
constexpr int kQuietMs = 2000;  // a whole bundle's worker, woken by the gen watch
void return_home(Bundle* b) {
  std::vector<int> away;
  const int64_t now = mono_ms();
  {
    std::lock_guard l(b->lk);
    for (size_t i = 0; i < b->paths.size(); i++) {
      Path& p = b->paths[i];
      if (p.home.empty()) continue;
      if (p.router == p.home) p.home_backoff = 0;  // home: the next time away starts over
      else if (static_cast<int>(i) != b->carrier && usable(p) && now >= p.home_after) away.push_back(static_cast<int>(i));
    }
  }
  if (away.empty()) return;
  std::vector<int> go = renewal_ports(b, away, true);
  {
    // Where the home router answers ICMP but the route drops RoCE, the path
    // fails again at home: each path's tries back off, doubling to
    // SHUNT_PATH_RETRY_MAX_MS.
    std::lock_guard l(b->lk);
    const int64_t cap = config().num(Param::path_retry_max_ms);
    for (int i : away) {
      Path& p = b->paths[i];
      if (std::find(go.begin(), go.end(), i) == go.end()) {
        p.next_label = 0;  // not going: its next renewal chooses again
        continue;
      }
      p.home_backoff = p.home_backoff ? std::min<int64_t>(p.home_backoff * 2, cap) : kHomeCheckMs;
      p.home_after = now + p.home_backoff;
    }
  }
  if (go.empty()) return;
  std::string err, list;
  for (int i : go) list += (list.empty() ? "" : ", ") + std::to_string(i);
  log::info("{} QP {}: path(s) {} back to the router discovery placed them on", b->ctx->device, b->pqp->qp_num, list);
  auto back = renew_paths(b, go, &err, true);
  {
    std::lock_guard l(b->lk);
    b->homecomings += back.size();
  }
  if (back.size() < go.size())
    log::info("{} QP {}: {} of {} paths renewed on their home router ({}); the rest fail and renew as any path",
              b->ctx->device, b->pqp->qp_num, back.size(), go.size(), err);
}

void wake_probed_workers();
std::vector<Bundle*> all_bundles();

// One thread per process sleeps on the agent's count of source path
// liveness changes (a futex in the clock segment) and wakes the probed
// bundles' workers when it moves, so that a whole bundle's worker need not
// look at the count every 200 ms (5 wakeups a second per bundle, on a
// one-CPU soft-RoCE guest a cost the job's throughput showed). It looks for
// a new segment (a new agent) every 5 s. g_gen_watch_ok: it has one open.
std::atomic<bool> g_gen_watch_ok{false};
void start_gen_watch(const std::string& shm_name) {
  static std::once_flag once;
  std::call_once(once, [shm_name] {
    std::thread([shm_name] { contained("probe generation watch", [&] {
      ReentryGuard guard;
      pthread_setname_np(pthread_self(), "shunt-probe-gen");
      clocksync::ClockReader r;
      bool open = false;
      int64_t next_look = 0;
      for (;;) {
        const int64_t now = mono_ms();
        if (now >= next_look) {
          next_look = now + ProbeAsk::kAnywayMs;
          if (!open || r.replaced(shm_name)) {
            open = r.open(shm_name, nullptr);
            g_gen_watch_ok.store(open);
            if (open) wake_probed_workers();  // a new segment: its count is new to them
          }
        }
        if (!open) {
          std::this_thread::sleep_for(std::chrono::milliseconds(ProbeAsk::kAnywayMs));
          continue;
        }
        const uint64_t seen = r.paths_gen();
        if (r.wait_paths_gen(seen, static_cast<int>(std::max<int64_t>(1, next_look - mono_ms()))))
          wake_probed_workers();
      }
    }, [](const std::string&) {}); }).detach();
  });
}

// One thread per bundle once a path failed: moves the carrier and renews
// failed shadows (the deciding side), or reports failures to the deciding
// side (the other). Renewal retries back off exponentially to
// SHUNT_PATH_RETRY_MAX_MS and never give up: a renewal that fails, or a
// renewed path that fails before its probe came back (the route is still
// dead), doubles the wait. A path that failed three times within a minute
// after it had worked waits the longest (damping: a flapping path). When
// the route comes back (a port event, or the failed path's probes get
// through again) the wait is cut short, the damping's excepted.
void run_worker(Bundle* b) {
  ReentryGuard guard;
  struct Exit {
    Bundle* b;
    ~Exit() {
      if (b->prim_router_fd >= 0) close(b->prim_router_fd), b->prim_router_fd = -1;
      b->worker_exited.store(true);
    }
  } exit{b};
  pthread_setname_np(pthread_self(), "shunt-failover");
  const bool decides = initiates(b);
  const int64_t cap = config().num(Param::path_retry_max_ms), hold = config().num(Param::hold_ms);
  std::vector<int64_t> due(b->paths.size(), 0), backoff(b->paths.size(), 100);
  std::vector<std::deque<int64_t>> fails(b->paths.size());
  std::vector<bool> was_down(b->paths.size(), false);
  int64_t move_since = 0, next_steer = 0, next_probe_sync = 0, next_home = 0;
  // Whether a path's probes are lost (probe_ask.h).
  ProbeAsk ask;
  const std::string shm_name = expand_pattern(config().str(Param::clock_shm), static_cast<int>(getpid()));
  clocksync::ClockReader counts;  // the agent's clock segment: its count of liveness changes
  bool counts_open = false;
  std::vector<int> reported, seen_down;
  bool unreachable_logged = false;
  for (;;) {
    // Every 50 ms while something is to be done (a path down or on
    // probation, a move, queue steering); every 200 ms while the bundle is
    // whole, when it only looks at the agent's count (in-process failures
    // wake it at once): on one-CPU soft-RoCE guests the 50 ms rounds of
    // every probed bundle were a cost the job's throughput showed.
    // Where the per-process watch wakes it when the count moves (pin or
    // flowlet, without carrier steering), a whole bundle's worker sleeps up
    // to 2 s: its home check and its registration are what is left to do.
    int wait_ms = 50;
    {
      std::lock_guard l(b->lk);
      bool whole = !b->need_move && !b->prim.down && !(b->split && b->steer_queue);
      for (const auto& p : b->paths) whole &= !p.down && !p.probation;
      if (whole) wait_ms = 200;
      if (whole && counts_open && g_gen_watch_ok.load() && !b->split && !b->carrier_steer) wait_ms = kQuietMs;
    }
    {
      std::unique_lock w(b->wmu);
      b->wcv.wait_for(w, std::chrono::milliseconds(wait_ms), [&] { return b->wake; });
      b->wake = false;
    }
    // The agent's probes and steering first, outside move_mu: the agent's
    // answer can take a while and no failover waits for it (steering
    // touches shares only, under lk).
    bool probed;
    {
      std::lock_guard g(b->mu);
      if (b->dead) return;
      probed = b->probed;
    }
    const int64_t t = mono_ms();
    if (probed && t >= next_probe_sync) {
      next_probe_sync = t + 500;
      // Renewed shadows: their new ports (nothing to ask while unchanged).
      if (register_probe_paths(b)) ask.ports_registered();
    }
    if (b->split || b->carrier_steer) ask_prim_router(b);
    const bool steer_due = probed && (b->split || b->carrier_steer) && b->steer_queue && t >= next_steer;
    int steer_to = -1;
    json steer_why;
    bool check_due = false;
    if (probed) {
      if (ask.regular(t) && !shm_name.empty() && (!counts_open || counts.replaced(shm_name))) {
        counts_open = counts.open(shm_name, nullptr);
        if (counts_open) start_gen_watch(shm_name);
      }
      check_due = ask.due(t, counts_open ? std::optional<uint64_t>(counts.paths_gen()) : std::nullopt);
    }
    if (steer_due || check_due) {
      if (steer_due) next_steer = t + config().num(Param::steer_interval_ms);
      ProbeStats st;
      if (probe_stats(b, &st)) {
        if (check_due) fail_silent_paths(b, st);
        if (steer_due && b->split) steer_tick(b, st);
        else if (steer_due) steer_to = carrier_steer_tick(b, st, decides, &steer_why);
      } else if (check_due) {
        ask.unanswered(t);
      }
    }
    bool need_move, gave_up;
    std::vector<int> down;
    std::vector<bool> unproven(b->paths.size(), false);  // renewed, and failed before its probe came back
    std::vector<bool> planned(b->paths.size(), false);   // stopped by a steering move, not failed
    // The whole round under move_mu: bundle_on_destroy takes it before it
    // destroys the shadows, so no round touches a destroyed QP or CQ.
    std::unique_lock m(b->move_mu);
    {
      std::lock_guard g(b->mu);
      if (b->dead) return;
    }
    {
      std::lock_guard l(b->lk);
      need_move = b->need_move;
      gave_up = b->gave_up;
      for (size_t i = 0; i < b->paths.size(); i++)
        if (b->paths[i].down && static_cast<int>(i) != b->carrier) {
          down.push_back(static_cast<int>(i));
          unproven[i] = b->paths[i].renewed;
          planned[i] = b->paths[i].planned_down;
        }
    }
    if (gave_up) return;
    refresh_rkeys(b);
    poll_overdue_probes(b);
    if (down != seen_down) {  // a new failure: are the others behind the same fault?
      bool more = false;
      for (int i : down) more |= std::find(seen_down.begin(), seen_down.end(), i) == seen_down.end();
      if (more) probe_all(b);
      seen_down = down;
    }
    int64_t now = mono_ms();
    if (!decides) {
      if (b->renew_now.exchange(false)) {  // the deciding side renews: it should not wait out its backoff
        std::string err;
        ask_peer(b, {{"cmd", "renew-now"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, 3000, &err);
      }
      if (need_move) {
        std::string err;
        int carrier;
        {
          std::lock_guard l(b->lk);
          carrier = b->carrier;
          b->need_move = false;
        }
        // The peer may be out of reach as long as the paths are (its host's
        // one link dark, say): this side holds its work and asks again each
        // round, until SHUNT_HOLD_MS from the first ask, as the deciding
        // side holds for a path to come back. A peer that answers no gives
        // the application its errors at once.
        if (!move_since) move_since = now;
        auto r = ask_peer(b,
                          {{"cmd", "carrier-down"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn},
                           {"carrier", carrier}, {"down", down_list(b)}},
                          static_cast<int>(std::clamp<int64_t>(move_since + hold - now, 1000, 10000)), &err);
        if (r && r->value("ok", false)) {
          move_since = 0;
          unreachable_logged = false;
        } else if (r) {
          give_up(b, "the peer's shim refused the move: " + r->dump());
        } else if (mono_ms() - move_since >= hold) {
          give_up(b, "the peer's shim cannot be reached within SHUNT_HOLD_MS (" + std::to_string(hold) +
                         " ms): " + err);
        } else {
          if (!unreachable_logged)
            log::warn("{} QP {}: the peer's shim cannot be reached ({}); holding the work, asking again", b->ctx->device,
                      b->pqp->qp_num, err);
          unreachable_logged = true;
          std::lock_guard l(b->lk);
          if (b->carrier == carrier) b->need_move = true;
          else move_since = 0;  // the peer moved it meanwhile: nothing to ask
        }
      } else {
        // A steering move's old carrier is no failure: the deciding side
        // renews it with its own half.
        std::vector<int> failed;
        for (int i : down)
          if (!planned[i]) failed.push_back(i);
        if (failed != reported) {
          std::string err;
          auto r = ask_peer(b, {{"cmd", "path-down"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"down", failed}},
                            3000, &err);
          if (r) reported = failed;
        }
      }
      continue;
    }
    if (need_move) {
      if (!move_since) move_since = now;
      if (do_move(b)) {
        move_since = 0;
      } else if (now - move_since > hold) {
        std::string why = "no path came back within SHUNT_HOLD_MS (" + std::to_string(hold) + " ms)", err;
        give_up(b, why);
        // The other end holds its work too: it gives up with this side.
        ask_peer(b, {{"cmd", "bundle-give-up"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}, {"why", why}}, 3000, &err);
        return;
      }
    }
    if (steer_to >= 0 && !need_move) {
      do_move(b, steer_to, steer_why);
      std::lock_guard l(b->lk);
      b->chold.moved(mono_ms());
    }
    const bool port_back = b->renew_now.exchange(false);
    std::vector<int> due_now;
    for (int i : down) {
      if (!was_down[i]) {  // a new failure: when to try again
        was_down[i] = true;
        if (planned[i]) {  // the old carrier of a steering move: renewed now, nothing counted
          due[i] = now;
        } else if (unproven[i]) {  // the route is still dead: back off further
          due[i] = now + backoff[i];
          backoff[i] = std::min<int64_t>(backoff[i] * 2, cap);
        } else {  // it had worked: a failure that counts for the damping
          backoff[i] = 100;
          fails[i].push_back(now);
          while (!fails[i].empty() && now - fails[i].front() > 60000) fails[i].pop_front();
          due[i] = now + (fails[i].size() >= 3 ? cap : backoff[i]);
        }
      }
      if (port_back && fails[i].size() < 3) due[i] = now;  // the backoff, not the damping, is cut short
      if (now >= due[i]) due_now.push_back(i);
    }
    if (down.empty() && !need_move && now >= next_home) {
      next_home = now + kHomeCheckMs;
      return_home(b);
    }
    if (due_now.empty()) continue;
    std::string err;
    std::vector<int> back = renew_paths(b, due_now, &err, false);
    for (int i : due_now) {
      if (std::find(back.begin(), back.end(), i) != back.end()) {
        was_down[i] = false;  // (its backoff is kept until its probe shows the route works)
      } else {
        backoff[i] = std::min<int64_t>(backoff[i] * 2, cap);
        due[i] = mono_ms() + backoff[i];
        log::info("{} QP {}: path {} not renewed yet ({}); next try in {} ms", b->ctx->device, b->pqp->qp_num, i, err,
                  backoff[i]);
      }
    }
  }
}

// Wakes the running workers of probed bundles (the gen watch).
void wake_probed_workers() {
  for (Bundle* b : all_bundles()) {
    {
      std::lock_guard g(b->mu);
      if (b->dead || !b->probed) continue;
    }
    {
      std::lock_guard w(b->wmu);
      if (!b->worker) continue;
      b->wake = true;
    }
    b->wcv.notify_one();
  }
}

void wake_worker(Bundle* b) {
  if (b->no_worker) return;
  bool start = false;
  {
    std::lock_guard w(b->wmu);
    b->wake = true;
    if (!b->worker) start = b->worker = true;
  }
  b->wcv.notify_one();
  // A worker that throws leaves its bundle without failover rather than
  // ending the job; worker_exited still tells its waiters it is gone.
  if (start) std::thread([b] { contained("bundle worker", [b] { run_worker(b); }, [](const std::string&) {}); }).detach();
}

// Every bundle this process made (they are never freed: `dead` marks the
// destroyed), for the watch to walk without holding the list's lock.
std::vector<Bundle*> all_bundles() {
  std::lock_guard g(g_mu);
  return g_bundles ? *g_bundles : std::vector<Bundle*>{};
}

// ---------------------------------------------------------------- stall watch

// A QP that retries forever (retry count 7: rxe never gives up then, and
// many applications ask for it) never reports a dead route with an error
// completion; it just stops completing. A path with work in flight whose
// last known completion has not moved for SHUNT_STALL_MS, while its port
// retransmitted in that time, has failed like any other: its work moves.

// The paths of b whose work has not progressed since `stall_ms` ago, with
// a retransmission on the port since they last progressed. Under b->lk.
// retx_ms(rail): when the port of that rail of b last retransmitted.
// *others: whether some usable path is not among them (idle, or
// progressing), so that failing them leaves the bundle somewhere to go.
using RetxFn = std::function<int64_t(int)>;
std::vector<int> stalled_paths(Bundle* b, int64_t now, int64_t stall_ms, const RetxFn& retx_ms,
                               bool* others = nullptr) {
  std::vector<int> out;
  bool other = false;
  auto look = [&](Path& p, int pi) {
    if (p.down || !p.qp) return;
    if (p.posted == p.done || p.done != p.watch_done || p.watch_ms == 0) {
      p.watch_done = p.done;
      p.watch_ms = now;
      other |= !p.probation;
      return;
    }
    if (now - p.watch_ms >= stall_ms && retx_ms(p.rail) >= p.watch_ms) out.push_back(pi);
    else other |= !p.probation;
  };
  look(b->prim, kPrimary);
  for (size_t i = 0; i < b->paths.size(); i++) look(b->paths[i], static_cast<int>(i));
  if (others) *others = other;
  return out;
}

// Fails the paths that stalled; a drain first takes in what the
// application has not polled yet (a rank busy elsewhere is no dead route).
// Unless every usable path stalled at once: queues that hold packets for
// seconds (and the drops and retransmissions that come with them) stall
// every path of a bundle alike, and a dead route that all of them share
// leaves nowhere to go; failing them all would only hold the work and cut
// the bundle off from its peer. The QPs keep their work then (the device
// retries it; a QP whose retries run out fails by its error completion),
// and the watch fails them once one path shows that a route works.
// Returns how many failed. Under b->mu (so the bundle's QPs live).
int check_stalls(Bundle* b, int64_t now, int64_t stall_ms, const RetxFn& retx_ms) {
  {
    std::lock_guard l(b->lk);
    if (!b->active.load() || b->gave_up || stalled_paths(b, now, stall_ms, retx_ms).empty()) return 0;
  }
  drain(b);
  After a;
  size_t stalled = 0;
  bool first = false;
  {
    std::lock_guard l(b->lk);
    bool others = false;
    std::vector<int> s = stalled_paths(b, now, stall_ms, retx_ms, &others);
    stalled = s.size();
    if (others) {
      for (int pi : s) path_failed(b, pi, kStalled, &a);
      flush_held(b, b->ctx);
    }
    bool all = !others && stalled;
    first = all && !b->all_stalled;
    if (first) b->all_stalled_count++;
    b->all_stalled = all;
  }
  if (first) event_all_stalled(b, stalled);
  if (a.down.empty()) return 0;
  event_down(b, a);
  wake_worker(b);
  return static_cast<int>(a.down.size());
}

// Silent loss found by probes: a shadow whose source path's probes got
// through since its port was set, and are now lost (none answered for
// SHUNT_PATH_DEAD_MS), has failed like any other, whether or not it has
// work in flight: no RC timeout to wait for, and no work is sent into a
// dead route. Unless no usable path would be left. Returns how many
// failed. From the failover worker.
int fail_silent_paths(Bundle* b, const ProbeStats& stats) {
  After a;
  {
    std::lock_guard m(b->mu);
    if (b->dead || !b->active.load()) return 0;
    std::lock_guard l(b->lk);
    if (b->gave_up) return 0;
    std::vector<int> lost;
    bool others = false;
    // The application's QP is judged like a shadow where its port is known
    // (shunt set its flow label) and probed.
    auto judge = [&](Path& p, int pi) {
      if (p.down || !p.qp) return;
      auto it = path_sport(p) ? stats.find({p.rail, path_sport(p)}) : stats.end();
      bool known = it != stats.end();
      if (known && it->second.value("alive", false)) p.probe_alive = true;
      if (known && !it->second.value("alive", false) && p.probe_alive) lost.push_back(pi);
      else others |= usable(p);
    };
    judge(b->prim, kPrimary);
    for (size_t i = 0; i < b->paths.size(); i++) judge(b->paths[i], static_cast<int>(i));
    // A failed shadow's port is still probed: once its probes, lost since
    // it failed (or since it was renewed into a dead route and before it
    // failed again), get through again, its route is back, and it is
    // renewed without waiting out its backoff (as when a port comes up;
    // the damping of a flapping path still holds).
    for (auto& p : b->paths) {
      if (!p.down && !p.renewed) {  // in service
        p.probe_dead = false;
        continue;
      }
      auto it = stats.find({p.rail, path_sport(p)});
      if (it == stats.end()) continue;
      if (!it->second.value("alive", false)) p.probe_dead = true;
      else if (p.probe_dead && p.down) p.probe_dead = false, b->renew_now.store(true);
    }
    // As with stalls: never the last usable paths at once (queues deep
    // enough to lose every probe, or a route they all share: nowhere to go).
    if (others)
      for (int i : lost) path_failed(b, i, kProbesLost, &a);
    if (!a.down.empty()) flush_held(b, b->ctx);
  }
  if (a.down.empty()) return 0;
  event_down(b, a);
  wake_worker(b);
  return static_cast<int>(a.down.size());
}

// ---------------------------------------------------------------- port events

// A port went down (or the whole device, port 0): every path of every
// bundle on it fails at once, without waiting for a retry timeout or a
// stall. It came back: failed paths are renewed without waiting out their
// backoff. Returns how many bundles it touched.
int on_port_event(const std::string& device, int port, bool up, bool wake = true) {
  std::vector<Bundle*> all = all_bundles();
  int n = 0;
  for (Bundle* b : all) {
    std::lock_guard m(b->mu);
    if (b->dead || !b->active.load()) continue;
    // The bundle's rails on that port ([0] also for a bundle without rails).
    std::vector<int> on;
    for (size_t k = 0; k < std::max<size_t>(b->rails.size(), 1); k++) {
      const std::string& d = b->rails.empty() ? std::string(b->ctx->device) : b->rails[k].device;
      uint8_t pn = b->rails.empty() ? b->port : b->rails[k].port;
      if (d == device && (!port || port == pn)) on.push_back(static_cast<int>(k));
    }
    if (on.empty()) continue;
    n++;
    if (up) {
      b->renew_now.store(true);
      if (wake) wake_worker(b);
      continue;
    }
    After a;
    {
      std::lock_guard l(b->lk);
      if (b->gave_up) continue;
      auto hit = [&](const Path& p) { return std::find(on.begin(), on.end(), p.rail) != on.end(); };
      if (hit(b->prim)) path_failed(b, kPrimary, kPortDown, &a);
      for (size_t i = 0; i < b->paths.size(); i++)
        if (hit(b->paths[i])) path_failed(b, static_cast<int>(i), kPortDown, &a);
      flush_held(b, b->ctx);
    }
    if (!a.down.empty()) event_down(b, a);
    if (wake) wake_worker(b);
  }
  return n;
}

// Shunt's own context of each device that has bundles: a port's async
// events reach every context of its device, so none is taken from the
// application.
struct EventSource {
  std::string device;
  ibv_context* ctx = nullptr;
};

// The watch's contexts follow the live bundles: a device's is opened with
// its first bundle and closed with its last, so shunt never holds a device
// the application let go of (a removed rxe device is freed only once every
// user closed it). bundle_on_destroy waits for the watch to catch up.
int g_watch_wake = -1;  // eventfd: the live bundles changed
std::atomic<uint64_t> g_watch_asked{0}, g_watch_seen{0};

std::vector<std::string> live_devices() {
  std::vector<Bundle*> all = all_bundles();
  std::vector<std::string> want;
  for (Bundle* b : all) {
    std::lock_guard m(b->mu);
    if (b->dead) continue;
    if (std::find(want.begin(), want.end(), b->ctx->device) == want.end()) want.push_back(b->ctx->device);
    for (size_t k = 1; k < b->rails.size(); k++)
      if (std::find(want.begin(), want.end(), b->rails[k].device) == want.end()) want.push_back(b->rails[k].device);
  }
  return want;
}

void follow_devices(std::vector<EventSource>* srcs) {
  std::vector<std::string> want = live_devices();
  for (auto it = srcs->begin(); it != srcs->end();) {
    if (std::find(want.begin(), want.end(), it->device) != want.end()) {
      ++it;
      continue;
    }
    if (it->ctx) ibv_close_device(it->ctx);
    it = srcs->erase(it);
  }
  for (const auto& name : want) {
    if (std::any_of(srcs->begin(), srcs->end(), [&](const EventSource& e) { return e.device == name; })) continue;
    EventSource e{name, open_device_named(name)};
    if (e.ctx) {
      int fl = fcntl(e.ctx->async_fd, F_GETFL);
      fcntl(e.ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
    } else {
      log::info("{}: port events are not watched (cannot open the device: {})", name, strerror(errno));
    }
    srcs->push_back(e);  // kept even without a context: tried once
  }
}

void read_events(EventSource& e) {
  ibv_async_event ev;
  while (e.ctx && ibv_get_async_event(e.ctx, &ev) == 0) {
    int port = 0;
    bool up = false, known = true;
    switch (ev.event_type) {
      case IBV_EVENT_PORT_ERR: port = ev.element.port_num; break;
      case IBV_EVENT_PORT_ACTIVE: port = ev.element.port_num, up = true; break;
      case IBV_EVENT_DEVICE_FATAL: break;
      default: known = false;
    }
    ibv_ack_async_event(&ev);
    if (!known) continue;
    log::info("{}: {} on port {}", e.device, ibv_event_type_str(ev.event_type), port);
    on_port_event(e.device, port, up);
  }
}

// The watch thread: port events as they come, and a look for stalls every
// SHUNT_STALL_MS/8.
void run_stall_watch() {
  ReentryGuard guard;
  pthread_setname_np(pthread_self(), "shunt-watch");
  const int64_t stall_ms = config().num(Param::stall_ms);
  const int64_t tick = stall_ms ? std::clamp<int64_t>(stall_ms / 8, 50, 1000) : 1000;
  RetransmitWatch retx;
  std::vector<EventSource> srcs;
  int64_t next_look = mono_ms() + tick;
  for (;;) {
    uint64_t asked = g_watch_asked.load();
    follow_devices(&srcs);
    g_watch_seen.store(asked);
    std::vector<pollfd> fds{{g_watch_wake, POLLIN, 0}};
    for (auto& e : srcs)
      if (e.ctx) fds.push_back({e.ctx->async_fd, POLLIN, 0});
    const size_t first_channel = fds.size();
    for (int fd : rail_channel_fds()) fds.push_back({fd, POLLIN, 0});  // mirror CQs of event-mode CQs
    int wait = static_cast<int>(std::max<int64_t>(0, next_look - mono_ms()));
    if (poll(fds.data(), fds.size(), wait) > 0) {
      uint64_t n;
      if (fds[0].revents & POLLIN) (void)!read(g_watch_wake, &n, sizeof n);
      size_t k = 1;
      for (auto& e : srcs) {
        if (!e.ctx) continue;
        short re = fds[k++].revents;
        if (re & POLLIN) read_events(e);
        if (re & (POLLERR | POLLHUP | POLLNVAL)) {  // the device went away: no spinning on it
          log::info("{}: its event channel closed; port events are no longer watched", e.device);
          e.ctx = nullptr;  // left open: the device may still be torn down under us
        }
      }
      for (size_t i = first_channel; i < fds.size(); i++)
        if (fds[i].revents & POLLIN) rail_channel_ready(fds[i].fd);
    }
    if (!stall_ms || mono_ms() < next_look) continue;
    next_look = mono_ms() + tick;
    std::vector<Bundle*> all = all_bundles();
    int64_t now = mono_ms();
    // Every port with a bundle is read at every look, not only once a
    // stall is long enough: a rise is then dated to within a look, and a
    // stall is judged as soon as it lasted SHUNT_STALL_MS (a first read at
    // that moment would only set a baseline, and the decision waited for
    // the next retransmission after it).
    std::map<std::string, int64_t> rose;
    auto rise = [&](const std::string& dev, int port) {
      std::string key = dev + "/" + std::to_string(port);
      auto it = rose.find(key);
      if (it == rose.end()) it = rose.emplace(key, retx.last_rise_ms(dev, port, now)).first;
      return it->second;
    };
    auto rail_rise = [&](Bundle* b, int k) {
      if (k <= 0 || k >= static_cast<int>(b->rails.size())) return rise(b->ctx->device, b->port);
      return rise(b->rails[k].device, b->rails[k].port);
    };
    std::vector<Bundle*> looked;
    for (Bundle* b : all) {
      std::lock_guard m(b->mu);
      if (b->dead || !b->active.load()) continue;
      // The application may hold the data path's lock across its device's
      // post (a system call on soft-RoCE): a busy bundle is looked at next
      // time rather than waited for.
      if (!b->lk.try_lock()) continue;
      std::lock_guard l(b->lk, std::adopt_lock);
      looked.push_back(b);
      for (size_t k = 0; k < std::max<size_t>(1, b->rails.size()); k++) rail_rise(b, static_cast<int>(k));
    }
    for (Bundle* b : looked) {
      std::lock_guard m(b->mu);
      if (b->dead || !b->active.load()) continue;
      check_stalls(b, now, stall_ms, [&](int k) { return rail_rise(b, k); });
    }
  }
}

// One watch per process (a forked child starts its own).
std::atomic<pid_t> g_watch_pid{0};

void start_stall_watch() {
  pid_t me = getpid();
  if (g_watch_pid.load() == me) {
    watch_resync(false);  // a new device may have a bundle now
    return;
  }
  if (g_watch_pid.exchange(me) == me) return;
  if (g_watch_wake >= 0) close(g_watch_wake);  // a forked child's copy of its parent's
  g_watch_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  std::thread([] { contained("stall watch", run_stall_watch, [](const std::string&) {}); }).detach();
}

// Tells the watch that the live bundles changed; with wait, returns once
// it acted on that (1 s at most).
void watch_resync(bool wait) {
  if (g_watch_pid.load() != getpid() || g_watch_wake < 0) return;
  uint64_t mine = g_watch_asked.fetch_add(1) + 1, one = 1;
  (void)!write(g_watch_wake, &one, sizeof one);
  for (int i = 0; wait && i < 1000 && g_watch_seen.load() < mine; i++) usleep(1000);
}

json answer_carrier_down(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  {
    std::lock_guard l(b->lk);
    if (req.value("carrier", kNone) != b->carrier) return {{"ok", true}, {"note", "that carrier was moved already"}};
    b->moving = true;
    b->need_move = true;
  }
  wake_worker(b);
  return {{"ok", true}};
}

json answer_path_down(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  wake_worker(b);
  return {{"ok", true}};
}

// Waits for the deciding side's commit; gives up when it never comes.
void watch_commit(Bundle* b, uint64_t moves) {
  ReentryGuard guard;
  auto settled = [&] {
    std::lock_guard l(b->lk);
    return b->moves != moves || b->gave_up;
  };
  for (int i = 0; i < 300; i++) {
    usleep(100 * 1000);
    if (settled()) return;
  }
  // Under move_mu, as the QP's destruction: give_up must not reach the
  // application's QP and CQs once they are destroyed. A commit may have
  // come while move_mu was held: asked again under it.
  std::lock_guard m(b->move_mu);
  if (!settled() && alive(b)) give_up(b, "the peer never committed the new path");
}

json answer_carrier_prepare(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  poll_overdue_probes(b);
  int to = -1;
  uint64_t moves;
  {
    std::lock_guard l(b->lk);
    for (const auto& x : req.value("candidates", json::array()))
      if (x.is_number_integer() && x.get<int>() >= 0 && x.get<int>() < static_cast<int>(b->paths.size()) &&
          usable(b->paths[x.get<int>()])) {
        to = x.get<int>();
        break;
      }
    moves = b->moves;
  }
  if (to < 0) return {{"error", "none of those paths is alive here"}, {"down", down_list(b)}};
  if (!b->tracking.load()) return {{"error", "the QP uses a shared receive queue: its receives cannot move"}};
  b->pending_from = begin_move(b, req.value("planned", false));
  int64_t mine = move_receives(b, to);
  if (mine < 0) {
    start_give_up(b, "the receives could not move");
    return {{"error", "the receives could not move"}};
  }
  std::thread([b, moves] { contained("carrier commit watch", [=] { watch_commit(b, moves); }, [](const std::string&) {}); }).detach();
  return {{"to", to}, {"consumed", mine}, {"down", down_list(b)}};
}

json answer_carrier_commit(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no such QP"}};
  int to = req.value("to", -1);
  json info;
  int from = b->pending_from;
  if (to < 0 || to >= static_cast<int>(b->paths.size())) return {{"error", "no such path"}};
  if (!move_sends(b, from, to, req.value("consumed", uint64_t{0}), &info)) {
    start_give_up(b, info.value("error", std::string("?")));
    return {{"error", info.value("error", "")}};
  }
  event_moved(b, from, to, info, req.value("planned", false));
  wake_worker(b);  // to report or renew the old carrier (or the new one, failed already)
  return {{"ok", true}};
}

}  // namespace

// ------------------------------------------------------------------ public

std::atomic<int> g_stash_n{0};

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
    if (c.num(Param::paths_per_rail) != 0)
      log::once(LogLevel::info, "bundle-nokey", "verbs bundles need SHUNT_JOB_KEY (the peer channel): QPs stay primary-only");
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
        b->state = "primary-only: no GRH (not RoCE v2)";
      } else if (ibv_query_gid(b->pqp->context, b->port, attr->ah_attr.grh.sgid_index, &b->lgid) != 0) {
        b->state = "primary-only: cannot read the local GID";
      } else {
        b->rgid = attr->ah_attr.grh.dgid;
        if (!register_owner(b, &err)) b->state = "primary-only: " + err;
        else b->registered = true;
      }
    }
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && b->have_rtr && !b->started) {
      b->rts = *attr;
      b->have_rts = true;
      std::string err;
      for (auto& p : b->paths)  // joined while the QP was at RTR
        if (!shadow_to_rts(b, p, &err)) {
          log::warn("{} QP {}: {}; the bundle stops", b->ctx->device, b->pqp->qp_num, err);
          b->active.store(false);
          break;
        }
      if (b->registered && initiates(b)) {
        b->started = true;
        start = true;
        b->state = "setting up";
      } else if (b->registered) {
        b->state = "waiting for the peer's shim";
      }
    }
  }
  if (start)
    std::thread([b] {
      contained("bundle setup", [b] { run_setup(b); }, [b](const std::string& why) { fall_back(b, "setup failed: " + why); });
    }).detach();
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
    b->state += " (destroyed)";
    probed = b->probed;
  }
  g_shadow_qps.fetch_sub(1);
  if (probed) drop_probe_paths(b);
  watch_resync(true);  // its device's event context goes with its last bundle
}

bool bundle_active(const Bundle* b) { return b->active.load(std::memory_order_acquire); }

int bundle_post_send(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard l(b->lk);
  if (!b->active.load(std::memory_order_relaxed) || b->gave_up) {
    if (b->gave_up || !b->tracking.load(std::memory_order_relaxed)) return c->orig.post_send(qp, wr, bad);
    // Not active yet: on the application's QP, but numbered and kept from
    // the start, so a failover soon after activation can replay them.
    for (ibv_send_wr* w = wr; w; w = w->next)
      if (int rc = post_on(b, c, kPrimary, nullptr, w)) {
        *bad = w;
        return rc;
      }
    return 0;
  }
  // What waits (behind a fence, or through a failover) is bounded as the
  // application's send queue is: past its depth, a post fails as on a full queue.
  const size_t cap = b->primary->max_send_wr ? b->primary->max_send_wr : kMaxHeld;
  for (ibv_send_wr* w = wr; w; w = w->next) {
    if (split(b, c, w, nullptr)) continue;
    int target = b->held.empty() ? route(b, c, w) : kWait;
    if (target == kWait) {
      if (b->held.size() >= cap) {
        *bad = w;
        return ENOMEM;
      }
      hold(b, w);
      continue;
    }
    if (int rc = post_on(b, c, target, nullptr, w)) {
      *bad = w;
      return rc;
    }
  }
  return 0;
}

int bundle_post_recv(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  std::lock_guard l(b->lk);
  if (!b->tracking.load(std::memory_order_relaxed) || b->gave_up) return c->orig.post_recv(qp, wr, bad);
  size_t before = b->recvs.size();
  for (ibv_recv_wr* w = wr; w; w = w->next) b->recvs.push().take(w);
  if (b->rcarrier == kNone) return 0;  // moving: posted on the new carrier with the rest
  int rc = b->rcarrier == kPrimary ? c->orig.post_recv(qp, wr, bad) : post_recvs_on(b, P(b, b->rcarrier), wr, bad);
  if (rc) {  // forget the ones not posted
    size_t ok = 0;
    for (ibv_recv_wr* w = wr; w && w != *bad; w = w->next) ok++;
    while (b->recvs.size() > before + ok) b->recvs.pop_back();
  }
  return rc;
}

int bundle_filter(ContextRecord* c, ibv_wc* wc, int n) {
  int out = 0;
  Bundle *touched = nullptr, *pending_flush = nullptr;
  for (int i = 0; i < n; i++) {
    QpRecord* r = find_qp_by_num(c, wc[i].qp_num);
    if (r && r->doorbell_pending) {  // shunt's doorbell: it woke the application, nothing to see
      r->doorbell_pending->store(false);
      continue;
    }
    Bundle* b = r ? (r->shadow_of ? r->shadow_of : r->bundle.load(std::memory_order_acquire)) : nullptr;
    if (!r && g_retired_any.load(std::memory_order_relaxed) && is_retired(c, wc[i].qp_num)) {
      g_stale_wcs.fetch_add(1, std::memory_order_relaxed);  // left behind by a destroyed shadow
      continue;
    }
    if (!b) {
      if (out != i) wc[out] = wc[i];
      out++;
      continue;
    }
    int pi = r->shadow_of ? r->path : kPrimary;
    uint8_t kind = kApp;
    bool drop = false;
    After after;
    {
      std::lock_guard l(b->lk);
      bool known = pi == kPrimary || pi < static_cast<int>(b->paths.size());
      Path* p = known ? &P(b, pi) : nullptr;
      if (wc[i].status != IBV_WC_SUCCESS) {
        if (p && p->down && !b->gave_up) {
          drop = true;  // a failed path's errors are shunt's to handle
          b->swallowed++;
        } else if (p && b->active.load(std::memory_order_relaxed) && !b->gave_up) {
          path_failed(b, pi, wc[i].status, &after);
          drop = true;
          b->swallowed++;
        }
      } else if (wc[i].opcode & IBV_WC_RECV) {
        if (b->tracking.load(std::memory_order_relaxed)) {
          if (!b->recvs.empty()) b->recvs.pop_front();
          b->consumed++;
        }
      } else if (p && p->down && !b->gave_up) {
        // A late success on a path taken out of service without an error
        // (a stall): its WRs are shunt's to replay or to owe, by their copies.
        drop = true;
      } else if (p && !p->signaled.empty() && (pi != kPrimary || p->signaled.front().wr_id == wc[i].wr_id)) {
        kind = p->signaled.front().kind;
        if (kind == kProbe) {
          p->probation = false;
          if (p->renewed) p->renewed = false, after.up.push_back(pi);
        }
        if (kind == kSeg && wc[i].status == IBV_WC_SUCCESS) {  // how long the path took to carry it
          double lat = static_cast<double>(mono_ns() - p->signaled.front().t);
          p->seg_lat = p->seg_lat > 0 ? 0.8 * p->seg_lat + 0.2 * lat : lat;
        }
        p->done = p->signaled.front().seq;
        p->signaled.pop_front();
        while (!p->infl.empty() && p->infl.front().seq <= p->done) p->infl.pop_front();
        if (drained(*p) && p->flow_bytes > 0) {  // a flowlet ended: how fast did it drain?
          double x = static_cast<double>(mono_ns() - p->flow_start_ns) / static_cast<double>(p->flow_bytes);
          p->ns_per_byte = p->ns_per_byte > 0 ? 0.75 * p->ns_per_byte + 0.25 * x : x;
          p->flow_bytes = 0;
        }
        if (b->period_open && drained(*p) && bundle_drained(b)) close_period(b);
      }
      if (!b->held.empty() && touched != b) {
        if (touched) pending_flush = touched;  // rare: two bundles in one batch
        touched = b;
      }
    }
    if (!after.down.empty()) {
      event_down(b, after);
      wake_worker(b);
    }
    for (int u : after.up) event_up(b, u);
    if (pending_flush) {
      std::lock_guard l(pending_flush->lk);
      flush_held(pending_flush, c);
      pending_flush = nullptr;
    }
    if (drop || ((kind == kFence || kind == kProbe || kind == kSeg) && wc[i].status == IBV_WC_SUCCESS)) continue;
    wc[i].qp_num = b->pqp->qp_num;
    if (out != i) wc[out] = wc[i];
    out++;
  }
  if (touched) {
    std::lock_guard l(touched->lk);
    flush_held(touched, c);
  }
  return out;
}

int shadow_cq_depth(int cqe, int paths, int max_cqe) {
  if (cqe < 1 || paths < 1 || (max_cqe > 0 && cqe >= max_cqe)) return cqe;
  int64_t want = int64_t(cqe) * (1 + paths) + 4 * int64_t(paths) + 8;
  if (max_cqe > 0) want = std::min<int64_t>(want, max_cqe);
  return static_cast<int>(std::min<int64_t>(want, INT32_MAX));
}

int cq_depth_for(ibv_context* ctx, int cqe) {
  if (current_mode() != Mode::active || !ctx) return cqe;
  ibv_device_attr da{};
  int max_cqe = ibv_query_device(ctx, &da) == 0 ? da.max_cqe : 0;
  return shadow_cq_depth(cqe, static_cast<int>(config().num(Param::paths_per_rail)), max_cqe);
}

int bundle_unstash(ibv_cq* cq, int n, ibv_wc* wc) {
  std::lock_guard g(g_stash_mu);
  int k = 0;
  if (!g_stash) return 0;
  for (auto it = g_stash->begin(); it != g_stash->end() && k < n;) {
    if (it->first != cq) {
      ++it;
      continue;
    }
    wc[k++] = it->second;
    it = g_stash->erase(it);
    g_stash_n.fetch_sub(1);
  }
  return k;
}

json bundle_json(const QpRecord& r) {
  Bundle* b = r.bundle.load();
  if (!b) return nullptr;
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  json paths = json::array();
  for (const auto& p : b->paths)
    paths.push_back({{"qpn", p.qpn},
                     {"device", p.rail < static_cast<int>(b->rails.size()) ? b->rails[p.rail].device
                                                                          : std::string(b->ctx->device)},
                     {"ns_per_byte", p.ns_per_byte},
                     {"remote_qpn", p.remote_qpn},
                     {"udp_sport", 0xC000 | p.flow_label},
                     {"router", p.router},
                     {"home", p.home},
                     {"wrs", p.wrs},
                     {"bytes", p.bytes},
                     {"in_flight", p.posted - p.done},
                     {"fails", p.fails},
                     {"down", p.down},
                     {"share", p.share},
                     {"seg_lat_ns", p.seg_lat},
                     {"queue", p.queue_known ? json{{"excess_ns", p.excess_ns},
                                                    {"threshold_ns", p.threshold_ns},
                                                    {"congested", p.congested}}
                                             : json(nullptr)}});
  return {{"state", b->state},
          {"device", static_cast<const char*>(b->ctx->device)},
          {"primary", {{"wrs", b->prim.wrs},
                       {"bytes", b->prim.bytes},
                       {"in_flight", b->prim.posted - b->prim.done},
                       {"fails", b->prim.fails},
                       {"router", b->prim.router},
                       {"udp_sport", path_sport(b->prim) ? json(path_sport(b->prim)) : json(nullptr)}}},
          {"active", b->active.load()},
          {"paths", paths},
          {"fences", b->fences},
          {"splits", b->splits},
          {"homecomings", b->homecomings},
          {"segments", b->segments},
          {"steer", b->carrier_steer ? "queue-carrier" : !b->split ? "-" : !b->steer ? "off" : !b->steer_queue ? "latency" : b->steer_owd ? "queue" : "queue-unknown"},
          {"spread", b->spread_auto ? "auto" : b->split ? "split" : b->flowlet ? "flowlet" : "pin"},
          {"auto", !b->spread_auto ? json(nullptr)
                                   : json{{"now", b->auto_best < 0 ? "trying" : b->auto_best ? "split" : "pin"},
                                          {"split_ns_per_kib", 1024 * b->auto_npb[1]},
                                          {"pin_ns_per_kib", 1024 * b->auto_npb[0]},
                                          {"split_periods", b->auto_periods[1]},
                                          {"pin_periods", b->auto_periods[0]}}},
          {"steer_steps", b->steer_steps},
          {"carrier_steers", b->carrier_steers},
          {"carrier_steering",
           !b->carrier_steer ? json(nullptr) : [&] {
             json pv = json::object();
             for (const auto& [i, v] : b->peer_view)
               pv[std::to_string(i)] = json::array({v.verdict, std::round(v.excess_ns / 1e6), v.same ? 1 : 0});
             return json{{"application_qp_router", b->prim.router},
                         {"carrier_queue", json::array({b->carrier_dir.verdict, b->carrier_dir.excess_ns / 1e6,
                                                        b->carrier_dir.threshold_ns / 1e6})},
                         {"peer_view", pv},
                         {"peer_view_age_ms", b->peer_view_ms ? mono_ms() - b->peer_view_ms : -1},
                         {"hold_window_ms", b->chold.window_ms()},
                         {"holding", b->chold.holding()}};
           }()},
          {"steer_reversals", b->steer_reversals},
          {"all_stalled", b->all_stalled_count},
          {"held", b->held_total},
          {"held_now", b->held.size()},
          {"splits_open", b->groups.size()},
          {"to_primary", b->to_primary},
          {"carrier", b->carrier},
          {"primary_down", b->prim.down},
          {"messages_sent", b->cseq},
          {"messages_received", b->consumed},
          {"failovers", b->failovers},
          {"moves", b->moves},
          {"replayed", b->replayed},
          {"replayed_bytes", b->replayed_bytes},
          {"completions_owed", b->synthesized},
          {"errors_hidden", b->swallowed}};
}

json answer(const json& req, const std::string& cmd);

// The answers to the last requests with an id (see ask_peer).
std::mutex g_rid_mu;
std::deque<std::pair<uint64_t, json>>* g_rids = nullptr;

// Whether every float in j converts to the int or unsigned that the
// answers read fields as (beyond their range the conversion is undefined).
static bool floats_fit(const json& j, int depth = 0) {
  if (j.is_number_float()) return j.get<double>() > -1 && j.get<double>() < 2147483648.0;
  if (!j.is_structured()) return true;
  if (depth > 32) return false;
  for (const auto& x : j)
    if (!floats_fit(x, depth + 1)) return false;
  return true;
}

// Any holder of the job key reaches this: nothing it sends may throw out.
json bundle_answer(const json& req) try {
  ReentryGuard g;
  if (!req.is_object()) return {{"error", "a request is a JSON object"}};
  if (!floats_fit(req)) return {{"error", "a number out of range (or nested too deep)"}};
  const std::string cmd = req.contains("cmd") && req["cmd"].is_string() ? req["cmd"].get<std::string>() : "";
  uint64_t rid = req.contains("rid") && req["rid"].is_number_unsigned() ? req["rid"].get<uint64_t>() : 0;
  if (rid) {
    std::lock_guard l(g_rid_mu);
    if (!g_rids) g_rids = new std::deque<std::pair<uint64_t, json>>;
    for (const auto& [id, reply] : *g_rids)
      if (id == rid) return reply;
  }
  json reply = answer(req, cmd);
  if (rid) {
    std::lock_guard l(g_rid_mu);
    g_rids->emplace_back(rid, reply);
    if (g_rids->size() > 64) g_rids->pop_front();
  }
  return reply;
} catch (const std::exception& e) {
  return {{"error", std::string("cannot answer: ") + e.what()}};
}

json answer(const json& req, const std::string& cmd) {
  try {
    if (cmd == "bundle-join") return answer_join(req);
    if (cmd == "bundle-activate") return answer_activate(req);
    if (cmd == "bundle-abort") return answer_abort(req);
    if (cmd == "bundle-give-up") {
      Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
      if (!b) return {{"error", "no such QP"}};
      start_give_up(b, "the peer's shim gave up: " + req.value("why", std::string("?")));
      return {{"ok", true}};
    }
    if (cmd == "carrier-down") return answer_carrier_down(req);
    if (cmd == "carrier-prepare") return answer_carrier_prepare(req);
    if (cmd == "carrier-commit") return answer_carrier_commit(req);
    if (cmd == "path-renew") return answer_path_renew(req);
    if (cmd == "path-down") return answer_path_down(req);
    if (cmd == "steer-view") return answer_steer_view(req);
    if (cmd == "bundle-rkeys") {
      Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
      if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
      std::vector<uint32_t> want;
      for (const auto& x : req.value("want", json::array()))
        if (x.is_number_unsigned() && want.size() < 256) want.push_back(x.get<uint32_t>());
      std::lock_guard g(b->mu);
      return {{"rails", rkeys_json(b, &want)}};
    }
    if (cmd == "renew-now") {
      Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
      if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
      b->renew_now.store(true);
      wake_worker(b);
      return {{"ok", true}};
    }
  } catch (const json::exception& e) {
    return {{"error", std::string("malformed request: ") + e.what()}};
  }
  return {{"error", "unknown command " + cmd}};
}

// (bundle.h) shared_hops, asking the agent at `sock`. Here, outside the
// anonymous namespace that shared_hops lives in: tests call it.
int shared_hops_via(const std::string& sock, const std::string& local, const std::string& peer, int candidates,
                    int wait_ms, bool once, std::vector<uint16_t>* ports, std::vector<std::string>* hops) {
  if (sock.empty()) return 0;
  const int64_t deadline = mono_ms() + discovery_cap_ms(wait_ms) + 1000;
  std::string err;
  for (;;) {
    auto r = peer::request(sock,
                           {{"cmd", "route-hops"}, {"local", local}, {"peer", peer}, {"candidates", candidates},
                            {"wait_ms", wait_ms}},
                           once ? 300 : 1000, &err);
    // An agent that took the question but not yet answered is slow, not
    // gone (a guest's agent thread still starting its services took over
    // 300 ms): once, that is "ask again", which the caller bounds.
    if (!r && once && err.rfind("no answer", 0) == 0) return -1;
    if (!r || r->contains("error")) {
      log::once(LogLevel::info, "route-hops",
                "path discovery: the host agent does not answer (" + (r ? r->value("error", std::string("?")) : err) +
                    "); each bundle sends its own datagrams");
      return 0;
    }
    if (r->contains("ports") && r->contains("hops")) {
      *ports = (*r)["ports"].get<std::vector<uint16_t>>();
      *hops = (*r)["hops"].get<std::vector<std::string>>();
      return ports->size() == hops->size() ? 1 : 0;
    }
    if (once) return -1;
    if (mono_ms() >= deadline) return 0;
    usleep(10 * 1000);  // pending: another bundle's datagrams (or ours) are out
  }
}

Bundle* bundle_attach_for_test(QpRecord* r, const std::vector<ibv_qp*>& shadows) {
  auto* b = new Bundle;
  b->no_worker = true;
  b->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;  // (fences are WRITEs)
  b->primary = r;
  b->pqp = r->qp;
  b->ctx = r->ctx;
  for (size_t i = 0; i < shadows.size(); i++) {
    Path p;
    p.qp = shadows[i];
    p.qpn = shadows[i]->qp_num;
    p.pc = r->ctx;
    p.flow_label = flow_label_for(r->qpn, static_cast<int>(i));
    b->paths.push_back(std::move(p));
  }
  b->prim.flow_label = flow_label_for(r->qpn, -1);  // as bundle_label_primary gives it
  {
    std::lock_guard g(g_mu);
    if (!g_bundles) g_bundles = new std::vector<Bundle*>;
    g_bundles->push_back(b);
  }
  g_shadow_qps.fetch_add(1);
  b->tracking.store(true);
  std::lock_guard g(b->mu);
  track_shadows(b);
  r->bundle.store(b, std::memory_order_release);
  activate(b);
  std::lock_guard l(b->lk);
  b->flowlet = true;  // the spreading data path, whatever SHUNT_SPREAD says
  return b;
}

bool bundle_cm_route_dead(QpRecord* r) {
  Bundle* b = r ? r->bundle.load() : nullptr;
  if (!b) return false;
  std::lock_guard g(b->mu);
  if (b->dead || !b->active.load()) return false;
  std::lock_guard l(b->lk);
  if (!b->prim.down) return false;
  for (const auto& p : b->paths)
    if (p.rail == 0 && usable(p)) return false;  // a route on the application's NIC works
  return true;
}

void bundle_spread_for_test(QpRecord* r, int spread, uint64_t split_min) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  b->flowlet = spread == 1;
  b->split = spread >= 2;
  b->spread_auto = spread == 3;
  b->split_min = split_min;
}

void bundle_router_for_test(QpRecord* r, int path, const std::string& router) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  P(b, path < 0 ? kPrimary : path).router = router;
}

void bundle_detach_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  if (!b) return;
  {
    std::lock_guard g(b->mu);
    std::lock_guard l(b->lk);
    b->dead = true;
    b->active.store(false);
    b->tracking.store(false);
    for (auto& p : b->paths) {  // as destroy_shadows leaves them
      if (p.rec) g_shadow_qps.fetch_sub(1);
      retire_qp(p.qp);
    }
    g_shadow_qps.fetch_sub(1);
    r->bundle.store(nullptr);
  }
  bool worker;
  {
    std::lock_guard w(b->wmu);
    worker = b->worker;
  }
  // The worker sees `dead` within one of its 50 ms waits; the test's QPs and
  // CQs must outlive its last drain.
  for (int i = 0; worker && i < 400 && !b->worker_exited.load(); i++) usleep(5000);
}

int bundle_check_stalls_for_test(QpRecord* r, int64_t now_ms, int64_t stall_ms, int64_t retx_ms) {
  Bundle* b = r->bundle.load();
  std::lock_guard m(b->mu);
  return check_stalls(b, now_ms, stall_ms, [=](int) { return retx_ms; });
}

int bundle_probes_for_test(QpRecord* r, const std::vector<std::pair<uint16_t, bool>>& alive) {
  ProbeStats st;
  for (auto [port, up] : alive) st[{0, port}] = json{{"port", port}, {"alive", up}};
  return fail_silent_paths(r->bundle.load(), st);
}

bool bundle_renew_now_for_test(QpRecord* r) { return r->bundle.load()->renew_now.exchange(false); }

void bundle_back_in_service_for_test(QpRecord* r, int path) {
  Bundle* b = r->bundle.load();
  {
    std::lock_guard l(b->lk);
    b->paths[path].probe_alive = b->paths[path].probe_dead = false;  // as reset_half: its probes start over
  }
  back_in_service(b, path);
}

int bundle_port_event_for_test(const std::string& device, int port, bool up) {
  return on_port_event(device, port, up, false);
}

void bundle_probe_for_test(QpRecord* r, int path) {
  Bundle* b = r->bundle.load();
  b->no_worker = false;  // (before the worker exists) it is what polls the probe
  {
    std::lock_guard l(b->lk);
    probe(b, path);
  }
  wake_worker(b);
}

bool bundle_probation_for_test(QpRecord* r, int path) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  return b->paths[path].probation;
}

int bundle_carrier_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  return b->moving ? kWait : b->carrier;
}

bool bundle_move_sends_for_test(QpRecord* r, int to, uint64_t peer_consumed) {
  Bundle* b = r->bundle.load();
  int from;
  {
    std::lock_guard l(b->lk);
    from = b->carrier;
    b->moving = true;
    P(b, from).down = true;
  }
  json info;
  return move_sends(b, from, to, peer_consumed, &info);
}

std::string bundle_dir() {
  std::string d = peer::run_dir(config().str(Param::run_dir));
  return d.empty() ? d : d + "/bundles";
}

int bundle_locate(const std::string& gid_hex_s, uint32_t qpn) {
  for (char ch : gid_hex_s)
    if (!isxdigit(static_cast<unsigned char>(ch))) return 0;
  if (gid_hex_s.size() != 32) return 0;
  std::ifstream f(bundle_dir() + "/" + gid_hex_s + "-" + std::to_string(qpn));
  long pid = 0;
  int port = 0;
  if (!(f >> pid >> port) || pid <= 0) return 0;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return 0;
  return port;
}

}  // namespace shunt::verbs
