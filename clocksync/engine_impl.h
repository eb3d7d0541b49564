// The probe engine's private parts, shared by its source files: the state
// of a path, a peer and a source path, what a pair carries on its way out,
// and the cadences and dead times the configuration gives each kind of path.
// Only clocksync/engine*.cc include it.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "clocksync/clock_shm.h"
#include "clocksync/engine.h"

namespace shunt::clocksync {

namespace detail {
inline constexpr int kRing = 8;               // pairs remembered per path and direction
inline constexpr size_t kPendingMax = 1024;   // send stamps awaited per rail
inline constexpr int64_t kLoopEvery = 100'000'000;
inline constexpr int64_t kPhcEvery = 1'000'000'000;
inline constexpr int64_t kMaxSleep = 1'000'000'000;  // a backstop; something is due sooner
inline constexpr size_t kMaxSourcePaths = 64;        // per peer, ours and reflected each
// A pair further ahead of the newest taken one is not taken on its sequence
// number alone (path_probe): a peer's pairs lost in a row, about 7 minutes
// of rail pairs at the defaults; beyond that it must prove it hears us.
inline constexpr uint64_t kMaxAhead = 1024;

struct TxPair {
  uint64_t seq = kNoSeq;
  int64_t tx[2] = {0, 0};  // local clock, kernel send stamps
  int64_t app = 0;         // local clock before sending
};
struct RxPair {
  uint64_t seq = kNoSeq;
  int64_t rx[2] = {0, 0};
};
struct Heard {  // the newest gossip a peer sent about another host
  uint64_t id = 0;
  double offset_ns = 0, drift = 0, bound_ns = 0;
  int64_t sender_time = 0;  // the sender's clock when it held
  int64_t local_rx = 0;
};
}  // namespace detail

struct ProbeEngine::Pending {
  int64_t id;
  int peer;
  uint64_t seq;
  int idx;
  SourcePath* sp;  // on a rail socket: the reflected path it was for, or null (the rail path)
};

struct PathState {
  sockaddr_in remote{};
  uint64_t next_seq = 0;
  std::array<detail::TxPair, detail::kRing> tx;
  std::array<detail::RxPair, detail::kRing> rx;
  uint64_t rx_max = 0;
  bool rx_any = false;
  // The newest pair heard outside the window and not taken (path_probe):
  // our next pair's feedback names it, so that a restarted peer can prove
  // that it hears us.
  detail::RxPair heard;
  uint32_t rx_count = 0;
  uint64_t last_fwd = 0, last_rev = 0;  // newest pair seq already turned into a sample
  bool fwd_any = false, rev_any = false;
  PathView view;
};

struct ProbeEngine::SourcePath {
  int id = 0;        // 0: reflected
  int peer = 0;      // index in peers_
  int rail = 0;
  uint16_t port = 0;  // our source port, or the peer's (reflected)
  bool reflected = false;
  std::unique_ptr<ProbeSocket> sock;  // ours only; a reflected path uses the rail socket
  std::vector<Pending> pending;       // ours only: send id -> probe
  PathState ps;
  PairFilter filter;
  int64_t last_rx = 0;  // reflected: forgotten after reflect_idle() without a probe
  unsigned round = 0;   // ours: rounds so far, from a start of its own (see send_due)
  bool spare = false;   // ours: every = spare_every, else source_every
  // Ours, made faster: until grace_until it is dead after grace_every rounds'
  // worth of dead time, as before (its last probes were that far apart).
  int64_t grace_until = 0;
  int grace_every = 0;
  bool owed = false;    // reflected: a probe came since our last answer

  explicit SourcePath(int64_t tol) : filter(tol) {}
};

// Where a pair goes out: the socket, the path's state, where its send stamps
// are awaited, and whether it carries gossip (rail paths only).
struct ProbeEngine::Out {
  ProbeSocket* sock;
  PathState* ps;
  std::vector<Pending>* pend;
  SourcePath* sp;  // a reflected path sent on the rail socket, else null
  int rail;
  bool gossip;
};

struct ProbeEngine::Queued {
  int peer_idx;
  Out o;
  uint64_t seq;
  int64_t now;
  std::array<uint8_t, kMaxProbeSize> b[2];
  size_t n[2];
};

struct ProbeEngine::Peer {
  std::string name;
  int index = 0;  // in peers_ (peers are never removed)
  uint64_t id = 0;
  bool id_confirmed = false;
  bool by_address = false;  // named after its address until a named spec merges in
  std::vector<PathState> paths;
  std::vector<std::unique_ptr<SourcePath>> sources;  // ours and reflected
  OffsetEstimator est;
  PairFilter filter;
  int64_t next_send = 0;
  unsigned rail_round = 0;  // rounds so far (in steps): when the rails are due
  int64_t round_ns = 0;     // from one send round to the next (interval x step)
  int gossip_cursor = 0;
  int64_t naive_f = 0, naive_r = 0, naive_f_t = 0, naive_r_t = 0;
  bool have_f = false, have_r = false;
  std::vector<detail::Heard> heard;
  double corr_offset = 0, corr_bound = 0;  // loop-corrected at corr_at
  int64_t corr_at = 0;
  bool corr_valid = false;
  // The newest probe taken from the peer on any path, and when it was heard
  // again after a silence of all of them (silent_hold).
  int64_t last_heard = 0, resumed_at = 0;

  Peer(const EstimatorParams& e, int64_t tol) : est(e), filter(tol) {}
};

struct ProbeEngine::Shm {
  ClockPublisher pub;
};

namespace detail {
// A reflected path lives while the peer probes it, and a few seconds more.
inline int source_every(const EngineConfig& c) { return std::max(1, c.source_every); }
inline int spare_every(const EngineConfig& c) { return c.spare_every > 0 ? c.spare_every : source_every(c); }
// A reflected path follows the peer's cadence, which it does not know: the
// longer of the two.
inline int64_t reflected_dead(const EngineConfig& c) { return c.dead_ns * std::max(source_every(c), spare_every(c)); }
inline int64_t reflect_idle(const EngineConfig& c) { return std::max<int64_t>(2'000'000'000, 4 * reflected_dead(c)); }
// Rail paths: dead after rail_every x dead_ns, whether the sender sends
// them every rail_every rounds or more often (a peer with fewer rails).
inline int rail_every(const EngineConfig& c) { return std::max(1, c.rail_every); }
inline int64_t rail_dead(const EngineConfig& c) { return c.dead_ns * rail_every(c); }
using SourcePath = ProbeEngine::SourcePath;
using Peer = ProbeEngine::Peer;
// A peer that sent nothing on any path for this long is silent: its rails
// go out at least every rail_every rounds.
inline int64_t silent_gap(const EngineConfig& c) { return (int64_t(rail_every(c)) + 1) * c.interval_ns; }
// A peer whose next probe is overdue (nothing for rail_every rounds) may be
// turning silent: a path's dead time held meanwhile ends, if the peer is
// heard again within the silent gap, at that probe (the deadline re-read
// then has passed). Judged on the silent gap alone, a path whose last proof
// was the peer's probe before last (its last probe came before our pair
// reached it, so named no new one of ours) came due a round after that
// probe, 150 ms short of a silent gap of 200: the peer stalled and the path
// died at its plain dead time.
inline int64_t overdue_gap(const EngineConfig& c) { return int64_t(rail_every(c)) * c.interval_ns; }
// How a peer's silence stretches its paths' dead times at `now`
// (EngineConfig::silent_hold): proofs count from `since`, and dead times
// are `times` as long while the peer is silent on every path.
struct Hold {
  int64_t since = 0;
  int times = 1;
};
inline Hold hold_of(const EngineConfig& c, const Peer& p, int64_t self_resumed, int64_t now) {
  Hold h;
  if (c.silent_hold <= 1) return h;
  h.since = std::max(p.resumed_at, self_resumed);
  if (p.last_heard && now - p.last_heard > overdue_gap(c)) h.times = c.silent_hold;
  return h;
}
inline int every_of(const EngineConfig& c, const SourcePath& sp) { return sp.spare ? spare_every(c) : source_every(c); }
// How long sp may go without a probe at `now` before it is dead.
inline int64_t dead_of(const EngineConfig& c, const SourcePath& sp, int64_t now, const Hold& h) {
  if (sp.reflected) return reflected_dead(c) * h.times;
  int e = every_of(c, sp);
  if (now < sp.grace_until) e = std::max(e, sp.grace_every);
  return c.dead_ns * e * h.times;
}
// When sp turns dead unless a probe comes first (dead_of over time).
inline int64_t dead_deadline(const EngineConfig& c, const SourcePath& sp, const Hold& h) {
  if (sp.reflected) return sp.ps.view.dead_at(reflected_dead(c) * h.times, h.since);
  const int64_t at = sp.ps.view.dead_at(c.dead_ns * every_of(c, sp) * h.times, h.since);
  if (!sp.grace_until) return at;
  const int64_t longer =
      sp.ps.view.dead_at(c.dead_ns * std::max(every_of(c, sp), sp.grace_every) * h.times, h.since);
  return longer < sp.grace_until ? longer : std::max(at, sp.grace_until);
}
// Where a path's pair sequence numbers start: at random (below 2^62, never
// 0), so that no probe from before, ours or an earlier engine's on this
// host, names a pair of ours in its feedback (what path_probe takes as proof
// that a probe is new).
uint64_t random_seq();  // in engine.cc
}  // namespace detail

}  // namespace shunt::clocksync
