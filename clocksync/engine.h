// The probe engine: one per host, its own thread, no globals. It sends a
// coded probe pair every interval on every path (local rail n -> the peer's
// n-th address), estimates each peer's clock from the kernel timestamps,
// corrects the estimates over loops of hosts, publishes them in shared
// memory, and keeps per-path delay, loss and liveness for failover and
// steering.
//
// Protocol (see wire.h): every probe carries the sender's kernel send stamps
// of its previous pair on that path (follow-up) and the receive stamps of the
// receiver's latest pairs (feedback), so both ends see both directions' one-
// way delays without any extra message. Feedback also proves the path works
// both ways, which is what liveness is based on.
//
// Source paths (add_source_path): extra paths to a peer on one rail whose
// probes leave from a chosen local UDP source port, so they can follow a
// flow with that source port (see SourcePathStats).
//
// The thread sleeps until the next thing is due (a pair to send, a path's
// dead deadline, an estimator window's end, the loop correction) or a socket
// is readable; it never ticks.
//
// Embedding: construct with an EngineConfig (engine_config_from() builds one
// from the SHUNT_* variables), add_peer() for every host to probe (now or
// later, from any thread), start(), then read report()/clock()/path() or
// register on_path_change(). stop() (or the destructor) joins the thread.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "clocksync/estimator.h"
#include "clocksync/filter.h"
#include "clocksync/path_view.h"
#include "clocksync/probe_socket.h"
#include "clocksync/test_clock.h"
#include "clocksync/wire.h"

namespace shunt {
class Config;
}

namespace shunt::clocksync {

struct PeerSpec {
  std::string name;                // the name the peer calls itself (its SHUNT_PROBE_NAME)
  std::vector<std::string> addrs;  // IPv4, one per rail, in rail order ("" = that rail unknown)
  // Found from a connection: named after its address, merged into (and
  // renamed by) any peer with the same address on the same rail.
  bool by_address = false;
};

struct EngineConfig {
  std::string name;                     // this host in the mesh
  std::vector<std::string> local_addrs; // rails, in order
  uint16_t port = 7471;
  int64_t interval_ns = 100'000'000;
  int64_t dead_ns = 250'000'000;
  // A peer's rail paths go out together in every Nth round, or every 2Mth
  // for a peer with 2M < N rails (one rail: every second round), and are
  // dead after N x dead_ns: the clock estimate still gets a pair every
  // other round on average.
  int rail_every = 1;
  // Source paths are probed in every Nth round only, and declared dead after
  // N x dead_ns: they are most of the probes (a bundle has one per shadow).
  int source_every = 1;
  // A spare source path (set_source_path_spare) goes out in every Nth round
  // instead, and is dead after N x dead_ns; 0: as source_every. The peer
  // answers each of its pairs once, whatever either cadence.
  int spare_every = 0;
  // While a peer is silent on every path (nothing from it for rail_every
  // rounds: its next probe is overdue), its paths die only after this many
  // times their dead time; heard again after rail_every + 1 rounds or more,
  // each path has its whole dead time from then to prove itself (sooner,
  // the hold just ends); the same after this engine's own thread woke late. A
  // peer host stalled (a starved guest) or a probe thread not scheduled is
  // no dead route, and there is nowhere to move when every path of the peer
  // is lost at once. A route lost while the peer is heard on others dies on
  // time. 1: no hold.
  int silent_hold = 4;
  int64_t pair_tol_ns = 10'000;
  // Authenticates every probe (derive_probe_key of the job's secret). All
  // zero: none, and start() refuses to probe.
  Key key{};
  TestClockSpec test_clock;             // identity unless testing
  std::string shm_name;                 // empty: do not publish
  bool want_hw = true;                  // use hardware stamps where the NIC has them
  EstimatorParams est;
  int max_peers = 256;
};

// From the SHUNT_* configuration; also parses SHUNT_PEERS into `peers`.
bool engine_config_from(const Config& c, EngineConfig* out, std::vector<PeerSpec>* peers,
                        std::string* err);
// "NAME=ADDR[,ADDR] NAME=..." (also ';' between entries).
bool parse_peers(std::string_view text, std::vector<PeerSpec>* out, std::string* err);
// A host's 64-bit id in probes: keyed by nothing, derived from its name.
uint64_t node_id(std::string_view name);

struct PeerClock {
  bool valid = false;
  int64_t at = 0;            // local ns the numbers below hold for
  double offset_ns = 0;      // peer clock minus ours, loop-corrected where loops exist
  double bound_ns = 0;
  double direct_offset_ns = 0, direct_bound_ns = 0;  // from this pair's probes alone
  double drift_ppb = 0;
  double half_rtt_ns = 0;
  double age_ns = 0;         // since the newest data in the model (holdover age)
  bool naive_valid = false;
  double naive_offset_ns = 0;  // NTP-style: (latest forward - latest reverse) / 2
};

// A source path: probes to a peer on one rail that leave from a chosen local
// UDP port of the rail's address instead of the probe port, so they hash
// like a flow using that source port (a verbs bundle's shadow QP) wherever
// ECMP ignores the destination port. The peer answers from its probe port to
// that source port: on its side the path is *reflected*, created by the
// first probe and forgotten after a few seconds without one. Both ends keep
// separate liveness, loss and one-way delays for it; the clock estimate
// comes from the rail paths only.
struct SourcePathStats {
  int id = 0;               // add_source_path's id; 0 on a reflected path
  int rail = 0;
  uint16_t port = 0;        // our source port; on a reflected path, the peer's
  bool reflected = false;   // the peer's source path, which we answer
  bool spare = false;       // ours: probed at the spare cadence
  PathStats stats;
};

struct PeerReport {
  std::string name;
  uint64_t id = 0;
  PeerClock clock;
  std::vector<PathStats> paths;  // index = rail
  std::vector<std::string> addrs; // the peer's address on each rail ("" where unknown)
  std::vector<SourcePathStats> source_paths;
  uint64_t pairs_kept = 0, pairs_dropped = 0, steps = 0;
  int64_t pair_tol_ns = 0;  // the pair filter's tolerance now (filter.h)
};

struct PathEvent {
  std::string peer;
  int path = 0;        // rail
  bool alive = false;
  int64_t at = 0;      // local ns
  int source_id = 0;   // a source path's id (on_source_path_change only)
  uint16_t port = 0;   // its source port
};

struct EngineCounters {
  uint64_t sent = 0, received = 0;
  uint64_t dropped_malformed = 0, dropped_auth = 0, dropped_unknown = 0, dropped_replay = 0;
  uint64_t send_errors = 0, tx_stamps = 0;
  uint64_t bytes_sent = 0;  // probe datagrams including IPv4 and UDP headers
  uint64_t wakeups = 0;     // times the engine thread woke (it sleeps until something is due)
};

struct PathState;  // engine_impl.h

class ProbeEngine {
 public:
  explicit ProbeEngine(EngineConfig cfg);
  ~ProbeEngine();
  ProbeEngine(const ProbeEngine&) = delete;
  ProbeEngine& operator=(const ProbeEngine&) = delete;

  // Opens the rails' sockets, starts the thread; false without a key
  // (EngineConfig::key), the reason in *err.
  bool start(std::string* err);
  void stop();
  // Adds a peer (thread-safe, any time). A known name, or an address known on
  // the same rail, merges; a named spec renames a peer found by address.
  void add_peer(const PeerSpec& p);
  // Off: no probes sent and arriving ones ignored (holdover, for tests/bench).
  void set_probing(bool on);
  // A pause of probing from `from` to `until` (local ns, the clock of
  // time().now()), and with `every` > 0 again every `every` ns, `count`
  // pauses in all: no pair is sent and arriving probes are ignored, and no
  // path is judged dead or alive from kPauseMargin before a pause to
  // kPauseMargin after it, so that every host of a job can pause at the
  // same wall-clock time by its own clock (the hosts' clocks and the
  // commands' arrival differ by less than the margin) without a peer taking
  // the silence for a failure. What it is for: the cost of probing measured
  // inside one running job, with the probing on and paused in turns
  // (bench/probe-pause.sh). A later call replaces an earlier one; until <=
  // from cancels. `every` must leave liveness judged between two pauses
  // (>= until - from + 2 x kPauseMargin), else it is taken as one pause.
  static constexpr int64_t kPauseMargin = 3'000'000'000;
  struct Pause {
    int64_t from = 0, until = 0, every = 0;  // until <= from: none
    int count = 0;
    bool operator==(const Pause&) const = default;
  };
  void pause_probing(int64_t from, int64_t until, int64_t every = 0, int count = 1);
  Pause probing_pause() const;  // the schedule in force ({}: none)
  // Called on every liveness change of a rail path, in order, from the
  // engine's notifier thread, never the thread that probes: a callback that
  // waits (for a lock another thread holds through netlink round trips, as
  // the sockets' rail thread did) would stop every probe to every peer, and
  // a peer declares our paths dead after SHUNT_PATH_DEAD_MS without one.
  void on_path_change(std::function<void(const PathEvent&)> cb);
  // Also tells `cb` of every rail path's liveness change, after the
  // on_path_change callback (notifier thread). Never removed: what it calls
  // must outlive the engine.
  void add_path_listener(std::function<void(const PathEvent&)> cb);

  // Adds a source path to `peer` (its current name) on `rail`: probes from
  // the rail's address and local UDP port `src_port` (0: any free port; not
  // the probe port), bound without SO_REUSEADDR so a port another socket
  // holds is an error, not shared. The peer must have an address on that
  // rail. Returns the path's id (> 0), or 0 with the reason in *err.
  // Thread-safe, any time (before start() too).
  int add_source_path(std::string_view peer, int rail, uint16_t src_port, std::string* err);
  // Stops probing it and closes its socket before returning (the port is
  // free again). False if no such id. Not from on_source_path_change.
  bool remove_source_path(int id);
  // Probes it as a spare (EngineConfig::spare_every) or, with false, as
  // every source path (source_every). A path made faster keeps the longer
  // dead time for one more of its old dead times (its probes were that far
  // apart) and goes out in the next round. False if no such id.
  bool set_source_path_spare(int id, bool spare);
  std::optional<SourcePathStats> source_path(int id) const;
  // Liveness changes of our source paths (notifier thread, in order with
  // the rail paths').
  void on_source_path_change(std::function<void(const PathEvent&)> cb);

  std::vector<PeerReport> report() const;
  // Each peer's name and whether each rail path to it is alive: what
  // report() says of liveness without computing every path's delay
  // quantiles (for those who look often).
  std::vector<std::pair<std::string, std::vector<bool>>> rails_alive() const;
  std::optional<PeerClock> clock(std::string_view peer) const;
  std::optional<PathStats> path(std::string_view peer, int rail) const;
  EngineCounters counters() const;
  StampMode stamp_mode() const;
  const TimeSource& time() const { return ts_; }
  const EngineConfig& config() const { return cfg_; }

  struct Peer;        // engine_impl.h
  struct SourcePath;  // engine_impl.h

 private:
  struct Pending;
  struct Out;  // where a pair goes: socket, path state, stamp bookkeeping
  void run();
  void wake();
  int64_t next_due(int64_t now) const;
  void drain_stamps(ProbeSocket& s, std::vector<Pending>& pend, SourcePath* own, int rail);
  void send_due(int64_t now, bool deferred);
  struct Queued;  // a pair encoded, waiting for its socket's batch
  void send_pair(int peer_idx, const Out& o, int64_t now);
  void prepare_pair(int peer_idx, const Out& o, int64_t now, Queued* q);
  void pair_sent(const Queued& q, const int64_t ids[2]);
  void send_queued(std::vector<Queued>& qs);
  int receive(ProbeSocket& s, int rail, SourcePath* own);  // -> datagrams read
  bool defer_receipt(int64_t now) const;
  void handle(int rail, const Probe& pr, const sockaddr_in& from, int64_t rx_local);
  void handle_source(SourcePath& sp, const Probe& pr, const sockaddr_in& from, int64_t rx_local);
  enum class Taken { dropped, heard, yes };  // heard: outside the window, named in our feedback
  Taken path_probe(Peer& p, PathState& ps, PairFilter& filter, const Probe& pr, int64_t rx, bool clock);
  void forget_reflected(Peer& p, size_t k);
  void tick(int64_t now, std::vector<PathEvent>* events);
  void correct_loops(int64_t now);
  void publish(int64_t now);
  Peer* find_peer(uint64_t id, const sockaddr_in& from, int rail);
  PeerClock clock_of(const Peer& p, int64_t now) const;

  EngineConfig cfg_;
  TimeSource ts_;
  uint64_t self_id_;
  std::mt19937_64 jitter_;  // the send schedule's jitter (seeded once; a system call per round before)
  std::vector<std::unique_ptr<ProbeSocket>> socks_;
  std::vector<std::vector<Pending>> pending_;  // per rail: send id -> probe
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Peer>> peers_;
  int next_source_id_ = 1;
  EngineCounters ctr_;
  std::set<uint32_t> bad_key_from_;  // engine thread: addresses whose probes failed the key, said once each
  std::function<void(const PathEvent&)> path_cb_, source_cb_;
  std::vector<std::function<void(const PathEvent&)>> path_listeners_;
  std::mutex cb_mu_;
  std::atomic<bool> stop_{false}, probing_{true};
  Pause pause_;  // under mu_ (pause_probing)
  // Whether `now` is in a pause widened by `margin` on each side; *end: where
  // that widened pause ends.
  bool in_pause(int64_t now, int64_t margin, int64_t* end = nullptr) const;
  bool quiet(int64_t now) const { return in_pause(now, 0); }
  bool frozen(int64_t now) const { return in_pause(now, kPauseMargin); }
  std::thread thread_;
  // Liveness changes, from the engine thread to the notifier thread, which
  // logs them and calls the callbacks.
  std::thread notifier_;
  std::mutex evq_mu_;
  std::condition_variable evq_cv_;
  std::deque<PathEvent> evq_;  // under evq_mu_
  bool evq_stop_ = false;      // under evq_mu_
  void notify_loop();
  int wake_fd_ = -1;  // eventfd, the engine's lifetime: add_peer, set_probing, stop end its sleep
  // epoll set of the engine thread, the engine's lifetime: wake_fd_, the
  // rails' sockets (tag: rail index) and own source paths' (kSourceTag | id).
  int ep_fd_ = -1;
  // The thread's sleep set while receipt is deferred (defer_receipt()):
  // wake_fd_ only, so arriving probes do not end the sleep.
  int sleep_fd_ = -1;
  int64_t prompt_until_ = 0;  // receipt is not deferred before this (local time)
  int64_t rate_since_ = 0;    // datagrams read since then, for their rate
  uint64_t rate_count_ = 0;
  static constexpr uint64_t kWakeTag = ~0ull;
  static constexpr uint64_t kSourceTag = 1ull << 32;
  void watch(int fd, uint64_t tag);
  void unwatch(int fd);
  int64_t last_loop_ = 0, last_phc_ = 0;
  // When the thread meant to wake next (the sleep it took), and the last
  // time it woke late by more than a silent gap (see silent_hold).
  int64_t wake_planned_ = 0, self_resumed_ = 0;
  struct Shm;
  std::unique_ptr<Shm> shm_;
};

}  // namespace shunt::clocksync
