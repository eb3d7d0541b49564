#include "clocksync/engine.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>

#include "clocksync/clock_shm.h"
#include "clocksync/loop.h"
#include "core/log.h"

namespace shunt::clocksync {

namespace {
constexpr int kRing = 8;               // pairs remembered per path and direction
constexpr size_t kPendingMax = 1024;   // send stamps awaited per rail
constexpr int64_t kLoopEvery = 100'000'000;
constexpr int64_t kPhcEvery = 1'000'000'000;
constexpr int64_t kMaxSleep = 1'000'000'000;  // a backstop; something is due sooner
constexpr size_t kMaxSourcePaths = 64;        // per peer, ours and reflected each
// A pair further ahead of the newest taken one is not taken on its sequence
// number alone (path_probe): a peer's pairs lost in a row, about 7 minutes
// of rail pairs at the defaults; beyond that it must prove it hears us.
constexpr uint64_t kMaxAhead = 1024;

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
}  // namespace

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
  std::array<TxPair, kRing> tx;
  std::array<RxPair, kRing> rx;
  uint64_t rx_max = 0;
  bool rx_any = false;
  // The newest pair heard outside the window and not taken (path_probe):
  // our next pair's feedback names it, so that a restarted peer can prove
  // that it hears us.
  RxPair heard;
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
  std::vector<Heard> heard;
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

namespace {
// A reflected path lives while the peer probes it, and a few seconds more.
int source_every(const EngineConfig& c) { return std::max(1, c.source_every); }
int spare_every(const EngineConfig& c) { return c.spare_every > 0 ? c.spare_every : source_every(c); }
// A reflected path follows the peer's cadence, which it does not know: the
// longer of the two.
int64_t reflected_dead(const EngineConfig& c) { return c.dead_ns * std::max(source_every(c), spare_every(c)); }
int64_t reflect_idle(const EngineConfig& c) { return std::max<int64_t>(2'000'000'000, 4 * reflected_dead(c)); }
// Rail paths: dead after rail_every x dead_ns, whether the sender sends
// them every rail_every rounds or more often (a peer with fewer rails).
int rail_every(const EngineConfig& c) { return std::max(1, c.rail_every); }
int64_t rail_dead(const EngineConfig& c) { return c.dead_ns * rail_every(c); }
using SourcePath = ProbeEngine::SourcePath;
using Peer = ProbeEngine::Peer;
// A peer that sent nothing on any path for this long is silent: its rails
// go out at least every rail_every rounds.
int64_t silent_gap(const EngineConfig& c) { return (int64_t(rail_every(c)) + 1) * c.interval_ns; }
// How a peer's silence stretches its paths' dead times at `now`
// (EngineConfig::silent_hold): proofs count from `since`, and dead times
// are `times` as long while the peer is silent on every path.
struct Hold {
  int64_t since = 0;
  int times = 1;
};
Hold hold_of(const EngineConfig& c, const Peer& p, int64_t self_resumed, int64_t now) {
  Hold h;
  if (c.silent_hold <= 1) return h;
  h.since = std::max(p.resumed_at, self_resumed);
  if (p.last_heard && now - p.last_heard > silent_gap(c)) h.times = c.silent_hold;
  return h;
}
int every_of(const EngineConfig& c, const SourcePath& sp) { return sp.spare ? spare_every(c) : source_every(c); }
// How long sp may go without a probe at `now` before it is dead.
int64_t dead_of(const EngineConfig& c, const SourcePath& sp, int64_t now, const Hold& h) {
  if (sp.reflected) return reflected_dead(c) * h.times;
  int e = every_of(c, sp);
  if (now < sp.grace_until) e = std::max(e, sp.grace_every);
  return c.dead_ns * e * h.times;
}
// When sp turns dead unless a probe comes first (dead_of over time).
int64_t dead_deadline(const EngineConfig& c, const SourcePath& sp, const Hold& h) {
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
uint64_t random_seq() {
  uint64_t v = (uint64_t(randombytes_random()) << 32) | randombytes_random();
  return (v >> 2) | 1;
}
}  // namespace

uint64_t node_id(std::string_view name) {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sodium_init() < 0) __builtin_trap();
  });
  uint8_t h[8];
  crypto_generichash(h, sizeof(h), reinterpret_cast<const uint8_t*>(name.data()), name.size(),
                     nullptr, 0);
  uint64_t v;
  std::memcpy(&v, h, 8);
  return v ? v : 1;
}

bool parse_peers(std::string_view text, std::vector<PeerSpec>* out, std::string* err) {
  size_t i = 0;
  while (i < text.size()) {
    while (i < text.size() && (text[i] == ' ' || text[i] == ';' || text[i] == '\n')) i++;
    size_t j = i;
    while (j < text.size() && text[j] != ' ' && text[j] != ';' && text[j] != '\n') j++;
    if (j == i) break;
    std::string_view item = text.substr(i, j - i);
    i = j;
    auto eq = item.find('=');
    if (eq == 0 || eq == std::string_view::npos || eq + 1 == item.size()) {
      if (err) *err = "peer '" + std::string(item) + "' is not NAME=ADDR[,ADDR]";
      return false;
    }
    PeerSpec p;
    p.name = std::string(item.substr(0, eq));
    std::string_view addrs = item.substr(eq + 1);
    while (!addrs.empty()) {
      auto c = addrs.find(',');
      std::string a(addrs.substr(0, c));
      sockaddr_in sa;
      if (!parse_ipv4(a, 1, &sa)) {
        if (err) *err = "peer " + p.name + ": not an IPv4 address: " + a;
        return false;
      }
      p.addrs.push_back(a);
      addrs = c == std::string_view::npos ? std::string_view{} : addrs.substr(c + 1);
    }
    out->push_back(std::move(p));
  }
  return true;
}

ProbeEngine::ProbeEngine(EngineConfig cfg)
    : cfg_(std::move(cfg)), ts_(cfg_.test_clock), self_id_(node_id(cfg_.name)),
      jitter_((uint64_t(randombytes_random()) << 32) | randombytes_random()) {
  // Lives as long as the engine, so wake() is safe from any thread at any time.
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  // The engine thread's wait set: registered as sockets come and go, so a
  // wakeup costs what is ready, not a scan of every socket (ppoll's).
  ep_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ >= 0 && ep_fd_ >= 0) watch(wake_fd_, kWakeTag);
  sleep_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (wake_fd_ >= 0 && sleep_fd_ >= 0) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    epoll_ctl(sleep_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  }
}

void ProbeEngine::watch(int fd, uint64_t tag) {
  epoll_event ev{};
  ev.events = EPOLLIN;  // EPOLLERR (a send stamp queued) is reported regardless
  ev.data.u64 = tag;
  if (ep_fd_ >= 0) epoll_ctl(ep_fd_, EPOLL_CTL_ADD, fd, &ev);
}

void ProbeEngine::unwatch(int fd) {
  if (ep_fd_ >= 0) epoll_ctl(ep_fd_, EPOLL_CTL_DEL, fd, nullptr);
}

ProbeEngine::~ProbeEngine() {
  stop();
  if (wake_fd_ >= 0) close(wake_fd_);
  if (ep_fd_ >= 0) close(ep_fd_);
  if (sleep_fd_ >= 0) close(sleep_fd_);
}

bool ProbeEngine::start(std::string* err) {
  if (thread_.joinable()) return true;
  if (cfg_.key == Key{}) {
    if (err)
      *err = "no SHUNT_JOB_KEY, so no probing: probes under a key anyone can derive could be forged "
             "by anyone on the network; set SHUNT_JOB_KEY to one secret on every host (shunt-run sets one)";
    return false;
  }
  if (cfg_.local_addrs.empty()) {
    if (err) *err = "no local probe addresses";
    return false;
  }
  for (const std::string& a : cfg_.local_addrs) {
    auto s = std::make_unique<ProbeSocket>();
    if (!s->open(a, cfg_.port, cfg_.want_hw, err)) {
      socks_.clear();
      return false;
    }
    log::info("clocksync: rail {} {}:{} ({} timestamps{}{})", socks_.size(), a, cfg_.port,
              to_string(s->mode()), s->ifname().empty() ? "" : ", ", s->ifname());
    socks_.push_back(std::move(s));
  }
  pending_.assign(socks_.size(), {});
  if (wake_fd_ < 0 || ep_fd_ < 0) {
    if (err) *err = std::string(wake_fd_ < 0 ? "eventfd: " : "epoll_create1: ") + strerror(errno);
    socks_.clear();
    return false;
  }
  for (size_t i = 0; i < socks_.size(); i++) watch(socks_[i]->fd(), i);
  if (!cfg_.shm_name.empty()) {
    shm_ = std::make_unique<Shm>();
    if (!shm_->pub.open(cfg_.shm_name, self_id_, cfg_.name, cfg_.max_peers, err)) {
      shm_.reset();
      socks_.clear();
      return false;
    }
  }
  stop_ = false;
  {
    std::lock_guard q(evq_mu_);
    evq_stop_ = false;
  }
  notifier_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "shunt-probe-ev");
    notify_loop();
  });
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "shunt-probe");
    run();
  });
  return true;
}

void ProbeEngine::stop() {
  stop_ = true;
  wake();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard q(evq_mu_);
    evq_stop_ = true;  // what is queued is still told
  }
  evq_cv_.notify_all();
  if (notifier_.joinable()) notifier_.join();
  if (shm_) shm_->pub.close(true);
  shm_.reset();
  socks_.clear();
}

void ProbeEngine::wake() {
  // Ends the engine thread's sleep so it recomputes what is due next.
  if (wake_fd_ < 0) return;
  uint64_t one = 1;
  ssize_t n = write(wake_fd_, &one, sizeof(one));
  (void)n;  // EAGAIN: the counter is already non-zero, the thread wakes anyway
}

void ProbeEngine::set_probing(bool on) {
  probing_.store(on);
  wake();
}

void ProbeEngine::pause_probing(int64_t from, int64_t until, int64_t every, int count) {
  {
    std::lock_guard lk(mu_);
    pause_ = {};
    if (until > from) {
      const bool periodic = every >= until - from + 2 * kPauseMargin && count > 1;
      pause_ = {from, until, periodic ? every : 0, periodic ? count : 1};
    }
  }
  wake();
}

ProbeEngine::Pause ProbeEngine::probing_pause() const {
  std::lock_guard lk(mu_);
  return pause_;
}

bool ProbeEngine::in_pause(int64_t now, int64_t margin, int64_t* end) const {
  const Pause& p = pause_;
  if (p.until <= p.from) return false;
  // The pause now is in, or the next (its margin may start before it).
  int64_t k = 0;
  if (p.every > 0 && now > p.from) k = std::min<int64_t>((now - p.from) / p.every, p.count - 1);
  for (int64_t j = k; j <= k + 1 && j < p.count; j++) {
    const int64_t s = p.from + j * p.every, e = p.until + j * p.every;
    if (now >= s - margin && now < e + margin) {
      if (end) *end = e + margin;
      return true;
    }
  }
  return false;
}

void ProbeEngine::add_peer(const PeerSpec& spec) {
  std::lock_guard lk(mu_);
  Peer* p = nullptr;
  for (auto& q : peers_)
    if (q->name == spec.name) p = q.get();
  // The same host under another name (one side found it from a connection,
  // by address; the other named it): merge by any rail address.
  for (size_t i = 0; !p && i < spec.addrs.size(); i++) {
    sockaddr_in a{};
    if (spec.addrs[i].empty() || !parse_ipv4(spec.addrs[i], cfg_.port, &a)) continue;
    for (auto& q : peers_)
      if (i < q->paths.size() && q->paths[i].remote.sin_addr.s_addr == a.sin_addr.s_addr) p = q.get();
  }
  if (p && p->by_address && !spec.by_address && p->name != spec.name) {
    p->name = spec.name;  // a real name wins over an address
    p->by_address = false;
    if (!p->id_confirmed) p->id = node_id(spec.name);
  }
  if (!p) {
    if (int(peers_.size()) >= cfg_.max_peers) {
      log::warn("clocksync: peer limit {} reached, {} not probed", cfg_.max_peers, spec.name);
      return;
    }
    peers_.push_back(std::make_unique<Peer>(cfg_.est, cfg_.pair_tol_ns));
    p = peers_.back().get();
    p->index = int(peers_.size()) - 1;
    p->name = spec.name;
    p->id = node_id(spec.name);
    p->by_address = spec.by_address;
    // Spread peers over the interval so the pairs of different peers do not collide.
    std::mt19937_64 rng(p->id ^ self_id_);
    p->next_send = ts_.now() + int64_t(rng() % uint64_t(cfg_.interval_ns));
    p->round_ns = cfg_.interval_ns;
  }
  size_t n = std::min(spec.addrs.size(), cfg_.local_addrs.size());
  if (p->paths.size() < n) p->paths.resize(n);
  for (size_t i = 0; i < n; i++) {
    // An empty address: that rail of the peer is not known (yet); not probed.
    if (spec.addrs[i].empty()) continue;
    if (spec.by_address && p->paths[i].remote.sin_addr.s_addr != 0) continue;
    parse_ipv4(spec.addrs[i], cfg_.port, &p->paths[i].remote);
    if (p->paths[i].next_seq == 0) p->paths[i].next_seq = random_seq();
  }
  wake();  // a new peer's first pair may be due before the engine's next wakeup
}

void ProbeEngine::on_path_change(std::function<void(const PathEvent&)> cb) {
  std::lock_guard lk(cb_mu_);
  path_cb_ = std::move(cb);
}

void ProbeEngine::add_path_listener(std::function<void(const PathEvent&)> cb) {
  std::lock_guard lk(cb_mu_);
  path_listeners_.push_back(std::move(cb));
}

void ProbeEngine::on_source_path_change(std::function<void(const PathEvent&)> cb) {
  std::lock_guard lk(cb_mu_);
  source_cb_ = std::move(cb);
}

int ProbeEngine::add_source_path(std::string_view peer, int rail, uint16_t src_port, std::string* err) {
  auto fail = [&](std::string why) {
    if (err) *err = std::move(why);
    return 0;
  };
  if (rail < 0 || size_t(rail) >= cfg_.local_addrs.size())
    return fail("no rail " + std::to_string(rail) + " (" + std::to_string(cfg_.local_addrs.size()) + " rails)");
  if (src_port == cfg_.port) return fail("source port " + std::to_string(src_port) + " is the probe port");
  // Bound before taking the lock (the engine thread keeps running meanwhile).
  auto sock = std::make_unique<ProbeSocket>();
  std::string why;
  if (!sock->open(cfg_.local_addrs[rail], src_port, cfg_.want_hw, &why, /*reuse_addr=*/false))
    return fail(why);
  int id;
  {
    std::lock_guard lk(mu_);
    Peer* p = nullptr;
    for (auto& q : peers_)
      if (q->name == peer) p = q.get();
    if (!p) return fail("unknown peer " + std::string(peer));
    if (size_t(rail) >= p->paths.size() || p->paths[rail].remote.sin_addr.s_addr == 0)
      return fail("peer " + p->name + " has no address on rail " + std::to_string(rail));
    size_t n = 0;
    for (auto& q : p->sources) n += !q->reflected;
    if (n >= kMaxSourcePaths)
      return fail("peer " + p->name + " has " + std::to_string(n) + " source paths, the most allowed");
    auto sp = std::make_unique<SourcePath>(cfg_.pair_tol_ns);
    id = sp->id = next_source_id_++;
    sp->peer = p->index;
    sp->rail = rail;
    sp->port = sock->port();
    sp->sock = std::move(sock);
    sp->ps.remote = p->paths[rail].remote;
    // Its queue is judged against the rail path's base and noise: the same
    // two hosts, probed since the peer was added, likely before the job
    // that asks for this path loaded the fabric.
    sp->ps.view.seed_queue(ts_.now(), p->paths[rail].view);
    sp->ps.next_seq = random_seq();
    sp->round = unsigned(id);  // the source paths take turns over the rounds
    log::info("clocksync: source path {} to {} rail {} from {}:{}", id, p->name, rail,
              cfg_.local_addrs[rail], sp->port);
    watch(sp->sock->fd(), kSourceTag | uint32_t(id));
    p->sources.push_back(std::move(sp));
  }
  return id;
}

bool ProbeEngine::remove_source_path(int id) {
  // Out of the epoll set, then closed, under the lock: the engine thread
  // finds a source path's events by id, so one that came before this finds
  // nothing.
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (size_t k = 0; k < p->sources.size(); k++)
      if (!p->sources[k]->reflected && p->sources[k]->id == id) {
        unwatch(p->sources[k]->sock->fd());
        p->sources.erase(p->sources.begin() + long(k));
        return true;
      }
  return false;
}

bool ProbeEngine::set_source_path_spare(int id, bool spare) {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (auto& sp : p->sources) {
      if (sp->reflected || sp->id != id) continue;
      if (sp->spare == spare) return true;
      const int before = every_of(cfg_, *sp);
      sp->spare = spare;
      if (every_of(cfg_, *sp) < before) {
        const int64_t now = ts_.now();
        sp->grace_every = now < sp->grace_until ? std::max(sp->grace_every, before) : before;
        sp->grace_until = now + cfg_.dead_ns * before;
        sp->round = 0;  // its pair in the next round
      }
      return true;
    }
  return false;
}

std::optional<SourcePathStats> ProbeEngine::source_path(int id) const {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    for (auto& sp : p->sources)
      if (!sp->reflected && sp->id == id)
        return SourcePathStats{sp->id, sp->rail, sp->port, false, sp->spare, sp->ps.view.stats(ts_.now())};
  return std::nullopt;
}

// What the engine thread must do next, in local time: the next pair to send,
// a path's dead deadline, an estimator window's end, the loop correction, a
// PHC refresh. It sleeps until then or until a socket becomes readable,
// never on a fixed tick (the tick cost more CPU than everything else).
int64_t ProbeEngine::next_due(int64_t now) const {
  int64_t due = now + kMaxSleep;
  bool probing = probing_.load();
  // Housekeeping (the loop correction, the PHC refresh) rides on the
  // wakeups probing makes anyway, the send rounds: while probing it may run
  // up to one round's spacing late (an interval, or a few where the paths'
  // cadences let the thread sleep through rounds). Its own wakeups were 10 a
  // second of the engine's 35 with one peer. The estimator's windows keep
  // theirs while the model is not valid (below): when they rode on the
  // rounds always, e2e test 40's estimates within their bound fell from
  // 97-98% to 94.6% in one run of five.
  int64_t house = now + kMaxSleep;
  int64_t round = kMaxSleep;  // the send rounds' spacing: that of the peer probed most often
  // A pause: no pair is due before its end, and no liveness deadline
  // before the margin after it.
  int64_t quiet_end = 0, frozen_end = 0;
  const bool q = in_pause(now, 0, &quiet_end), fz = in_pause(now, kPauseMargin, &frozen_end);
  if (q) due = std::min(due, quiet_end);
  if (fz) due = std::min(due, frozen_end);
  for (auto& p : peers_) {
    if (probing && !q) due = std::min(due, p->next_send);
    round = std::min(round, p->round_ns);
    // An estimator window's end: on time while the model is invalid or a
    // step is suspected (a step shows at once), else at the next send round
    // (a sample arriving after the end closes the window too): ending on
    // time woke the thread two more times a second of its eight.
    // While paused nothing that counts arrives (arrivals are dropped), so
    // a window's end waits for the pause's end too, a pending refit aside.
    const int64_t win = p->est.next_due();
    if (win == std::numeric_limits<int64_t>::min() ||
        (!q && (!probing || !p->est.model().valid || p->est.step_suspected())))
      due = std::min(due, win);
    if (fz) continue;
    // (A deadline computed before the peer turned silent is re-read when
    // it comes: tick() stretches it then.)
    const Hold h = hold_of(cfg_, *p, self_resumed_, now);
    for (auto& ps : p->paths) due = std::min(due, ps.view.dead_at(rail_dead(cfg_) * h.times, h.since));
    for (auto& sp : p->sources) {
      due = std::min(due, dead_deadline(cfg_, *sp, h));
      if (sp->reflected) due = std::min(due, sp->last_rx + reflect_idle(cfg_) + 1);
    }
  }
  // The loop correction and the clock segment's update wait out a pause:
  // the models do not change meanwhile and readers extrapolate them. A
  // paused engine that woke 5-6 times a second for them priced in
  // bench/probe-pause.sh as if those wakeups were free.
  if (!peers_.empty() && !q) house = std::min(house, last_loop_ + kLoopEvery);
  for (auto& s : socks_)
    if (s->mode() == StampMode::hardware) house = std::min(house, last_phc_ + kPhcEvery);
  if (probing && !peers_.empty() && house < now + kMaxSleep) house += round;
  return std::min(due, house);
}

void ProbeEngine::drain_stamps(ProbeSocket& s, std::vector<Pending>& pend, SourcePath* own,
                               int rail) {
  s.drain_send_stamps([&](int64_t id, int64_t ns) {
    auto it = std::find_if(pend.begin(), pend.end(), [&](const Pending& x) { return x.id == id; });
    if (it == pend.end()) return;
    Pending pd = *it;
    pend.erase(it);
    PathState* ps = nullptr;
    if (own) {
      ps = &own->ps;
    } else if (pd.peer < int(peers_.size())) {
      Peer& p = *peers_[pd.peer];
      if (!pd.sp && size_t(rail) < p.paths.size()) ps = &p.paths[rail];
      for (auto& q : p.sources)
        if (pd.sp && q.get() == pd.sp) ps = &q->ps;
    }
    if (!ps) return;
    TxPair& tp = ps->tx[pd.seq % kRing];
    int64_t local = ts_.local(ns);
    // A stamp far from when we sent is not ours (counter out of step).
    if (tp.seq != pd.seq || std::llabs(local - tp.app) > 1'000'000'000) return;
    tp.tx[pd.idx] = local;
    ctr_.tx_stamps++;
  });
}

// Whether the thread may sleep through arriving probes and read them at
// its next due time. A probe carries the kernel's receive stamp, so reading
// it late changes no delay; the feedback of our next pair and every dead
// deadline come after the read, so none of them sees it late either. A
// wakeup per arriving burst was most of the engine's wakeups (on a
// one-CPU soft-RoCE guest probing one peer over two rails: 24 a second, 10
// of them send rounds) and a wakeup, not a packet, is what costs there.
// Not where a socket stamps in user space (the stamp is the read), and not
// for 10 s after a read found a socket's queue long or datagrams arrived
// faster than a few dozen per interval (many peers, or a flood of spoofed
// probes): the socket buffer must not overflow between two due times. A
// first attempt without that check lost 27% of the peer's genuine probes
// under e2e test 41's flood.
bool ProbeEngine::defer_receipt(int64_t now) const {
  if (sleep_fd_ < 0 || now < prompt_until_) return false;
  for (auto& s : socks_)
    if (s->mode() == StampMode::user) return false;
  for (auto& p : peers_)
    for (auto& sp : p->sources)
      if (sp->sock && sp->sock->mode() == StampMode::user) return false;
  return true;
}

void ProbeEngine::run() {
  std::vector<PathEvent> events;
  constexpr int kMaxEvents = 32;
  constexpr int kLongQueue = 64;  // datagrams read at once from one socket
  constexpr int64_t kPromptFor = 10'000'000'000;
  epoll_event ev[kMaxEvents];
  bool ns_wait = true;  // epoll_pwait2 (Linux 5.11) until it says ENOSYS
  while (!stop_.load()) {
    int64_t wait;
    bool defer;
    {
      std::lock_guard lk(mu_);
      int64_t now = ts_.now();
      wait = std::max<int64_t>(0, next_due(now) - now);
      wake_planned_ = now + wait;
      defer = defer_receipt(now);
      ctr_.wakeups++;
    }
    const int sleep_on = defer ? sleep_fd_ : ep_fd_;
    // Nanosecond timeout: ms rounding would wake early (spin) or late.
    timespec to{time_t(wait / 1'000'000'000), long(wait % 1'000'000'000)};
    int n = ns_wait ? epoll_pwait2(sleep_on, ev, kMaxEvents, &to, nullptr) : -1;
    if (n < 0 && errno == ENOSYS) ns_wait = false;
    if (!ns_wait) n = epoll_wait(sleep_on, ev, kMaxEvents, int((wait + 999'999) / 1'000'000));  // late, never early
    // Deferred: now whatever arrived meanwhile (the wake fd among it).
    if (defer) n = epoll_wait(ep_fd_, ev, kMaxEvents, 0);
    int longest = 0, nread = 0;
    {
      std::lock_guard lk(mu_);
      for (int e = 0; e < n; e++) {
        const uint64_t tag = ev[e].data.u64;
        const bool err = ev[e].events & EPOLLERR;
        if (tag == kWakeTag) {
          uint64_t v;
          ssize_t r = read(wake_fd_, &v, sizeof(v));
          (void)r;
        } else if (!(tag & kSourceTag)) {
          size_t i = size_t(tag);
          if (i >= socks_.size()) continue;
          if (err) drain_stamps(*socks_[i], pending_[i], nullptr, int(i));
          // EPOLLERR without a queued stamp is a pending socket error: a receive clears it.
          const int got = receive(*socks_[i], int(i), nullptr);
          longest = std::max(longest, got);
          nread += got;
        } else {
          // By id: a path removed meanwhile is simply not found.
          SourcePath* sp = nullptr;
          for (auto& p : peers_)
            for (auto& q : p->sources)
              if (!q->reflected && q->id == int(uint32_t(tag))) sp = q.get();
          if (!sp) continue;
          if (err) drain_stamps(*sp->sock, sp->pending, sp, sp->rail);
          const int got = receive(*sp->sock, sp->rail, sp);
          longest = std::max(longest, got);
          nread += got;
        }
      }
      int64_t now = ts_.now();
      // More ready than one call returns: the rest on the next turn, at once.
      if (defer && n == kMaxEvents) prompt_until_ = std::max(prompt_until_, now + 1);
      if (longest >= kLongQueue) prompt_until_ = now + kPromptFor;
      // The rate over about a second: more than kLongQueue / 2 an interval
      // (the same datagrams spread over several sockets, or over a sleep).
      rate_count_ += uint64_t(nread);
      if (now - rate_since_ >= 1'000'000'000) {
        if (rate_since_ && double(rate_count_) * double(cfg_.interval_ns) >=
                               double(kLongQueue / 2) * double(now - rate_since_))
          prompt_until_ = now + kPromptFor;
        rate_since_ = now;
        rate_count_ = 0;
      }
      if (probing_.load() && !quiet(now)) send_due(now, defer);
      tick(now, &events);
      if (shm_ && std::any_of(events.begin(), events.end(), [](const PathEvent& e) { return e.source_id; }))
        shm_->pub.bump_paths_gen();
    }
    // To the notifier thread: a callback may read the engine (report(),
    // path()) and may be slow; the engine thread must not wait for it.
    if (!events.empty()) {
      {
        std::lock_guard q(evq_mu_);
        evq_.insert(evq_.end(), events.begin(), events.end());
      }
      evq_cv_.notify_one();
      events.clear();
    }
  }
}

void ProbeEngine::notify_loop() {
  std::unique_lock q(evq_mu_);
  for (;;) {
    evq_cv_.wait(q, [&] { return evq_stop_ || !evq_.empty(); });
    if (evq_.empty()) return;  // stopping, and everything told
    std::deque<PathEvent> batch;
    batch.swap(evq_);
    q.unlock();
    {
      std::lock_guard cl(cb_mu_);
      for (auto& e : batch) {
        if (e.source_id) {
          log::info("clocksync: source path {} ({} rail {} from port {}) is {}", e.source_id, e.peer,
                    e.path, e.port, e.alive ? "alive" : "dead");
          if (source_cb_) source_cb_(e);
        } else {
          log::info("clocksync: path {} rail {} is {}", e.peer, e.path, e.alive ? "alive" : "dead");
          if (path_cb_) path_cb_(e);
          for (auto& l : path_listeners_) l(e);
        }
      }
    }
    q.lock();
  }
}

void ProbeEngine::send_due(int64_t now, bool deferred) {
  std::vector<bool> sent(socks_.size(), false);
  // A rail socket's pairs (each due peer's rail pair, then the answers of
  // reflected paths) go out in one system call per socket and round where
  // the kernel stamps them; a user-space stamp is taken right after its
  // own pair's call.
  std::vector<std::vector<Queued>> batch(socks_.size());
  auto rail_pair = [&](int peer_idx, const Out& o) {
    if (o.sock->mode() == StampMode::user) return send_pair(peer_idx, o, now);
    batch[size_t(o.rail)].emplace_back();
    prepare_pair(peer_idx, o, now, &batch[size_t(o.rail)].back());
  };
  for (auto& p : peers_) {
    if (p->next_send > now) continue;
    // The rails go out together every `turn` rounds: rail_every, but no
    // more than twice the peer's rails, so the clock estimate gets a pair
    // every other round on average at least. The thread wakes only for the
    // rounds where something is due: every `step` rounds, the greatest
    // common divisor of the cadences (4 with the defaults: rails and source
    // paths every 4th, spares every 12th; a peer with one rail, 2). A path
    // goes out in the round whose span of `step` rounds holds a multiple of
    // its cadence.
    int addressed = 0;
    for (auto& ps : p->paths) addressed += ps.remote.sin_addr.s_addr != 0;
    const int turn = std::clamp(2 * addressed, 1, rail_every(cfg_));
    int step = turn;
    for (auto& sp : p->sources)
      if (!sp->reflected) step = std::gcd(step, every_of(cfg_, *sp));
    auto due = [step](unsigned& round, int every) {
      const unsigned r = round % unsigned(every);
      round += unsigned(step);
      return r == 0 || r + unsigned(step) > unsigned(every);
    };
    if (due(p->rail_round, turn))
      for (size_t r = 0; r < p->paths.size(); r++)
        if (p->paths[r].remote.sin_addr.s_addr != 0) {
          rail_pair(p->index, {socks_[r].get(), &p->paths[r], &pending_[r], nullptr, int(r), true});
          sent[r] = true;
        }
    // Source paths after the rail paths' pairs, on the same schedule.
    for (auto& sp : p->sources) {
      if (sp->reflected) {
        // One answer to each pair of the peer's (both probes of a pair may
        // have come since our last round): its cadence, spare or not, is
        // the peer's to choose.
        if (!sp->owed) continue;
        sp->owed = false;
        rail_pair(p->index, {socks_[sp->rail].get(), &sp->ps, &pending_[sp->rail], sp.get(), sp->rail, false});
        sent[sp->rail] = true;
        continue;
      }
      if (!due(sp->round, every_of(cfg_, *sp))) continue;  // not its round
      if (p->paths[sp->rail].remote.sin_addr.s_addr == 0) continue;
      sp->ps.remote = p->paths[sp->rail].remote;  // add_peer may have renamed/readdressed it
      send_pair(p->index, {sp->sock.get(), &sp->ps, &sp->pending, nullptr, sp->rail, false}, now);
      if (!deferred && sp->sock->mode() != StampMode::user) drain_stamps(*sp->sock, sp->pending, sp.get(), sp->rail);
    }
    // Keep the schedule, with a little jitter so hosts do not phase-lock.
    p->round_ns = cfg_.interval_ns * step;
    p->next_send += p->round_ns;
    if (p->next_send <= now) p->next_send = now + p->round_ns;
    p->next_send += std::uniform_int_distribution<int64_t>(0, cfg_.interval_ns / 20)(jitter_) - cfg_.interval_ns / 40;
  }
  for (auto& b : batch) send_queued(b);
  // Software send stamps are queued by the time send() returns: collect them
  // now rather than in a wakeup of their own (hardware ones come later, on
  // POLLERR). While reads are deferred they wait for the next due time's
  // read, which finds them with the datagrams (EPOLLERR) before the next
  // pair needs them: a recvmmsg fewer per socket and round (on a one-CPU
  // soft-RoCE guest a system call costs tens of microseconds).
  if (deferred) return;
  for (size_t r = 0; r < socks_.size(); r++)
    if (sent[r] && socks_[r]->mode() != StampMode::user) drain_stamps(*socks_[r], pending_[r], nullptr, int(r));
}

void ProbeEngine::send_pair(int peer_idx, const Out& o, int64_t now) {
  Queued q;
  prepare_pair(peer_idx, o, now, &q);
  int64_t ids[2];
  o.sock->send_pair(o.ps->remote, {q.b[0].data(), q.n[0]}, {q.b[1].data(), q.n[1]}, ids);
  pair_sent(q, ids);
}

// Several pairs from one socket (qs: one rail socket's) in one system call,
// each pair's two datagrams back to back as send_pair sends them.
void ProbeEngine::send_queued(std::vector<Queued>& qs) {
  if (qs.empty()) return;
  std::vector<const sockaddr_in*> to;
  std::vector<std::span<const uint8_t>> data;
  for (const Queued& q : qs)
    for (int k = 0; k < 2; k++) {
      to.push_back(&q.o.ps->remote);
      data.push_back({q.b[k].data(), q.n[k]});
    }
  std::vector<int64_t> ids(to.size());
  qs.front().o.sock->send_many(to, data, ids.data());
  for (size_t k = 0; k < qs.size(); k++) pair_sent(qs[k], &ids[2 * k]);
  qs.clear();
}

void ProbeEngine::prepare_pair(int peer_idx, const Out& o, int64_t now, Queued* q) {
  Peer& p = *peers_[peer_idx];
  PathState& ps = *o.ps;
  Probe pr;
  pr.path = uint8_t(o.rail);
  pr.sender_id = self_id_;
  // A peer found by address does not know our id for it yet: 0 is "whoever
  // listens on this address" until its first probe tells us its id.
  pr.receiver_id = p.by_address && !p.id_confirmed ? 0 : p.id;
  pr.seq = ps.next_seq++;
  pr.tx_app_ns = now;
  const TxPair& prev = ps.tx[(pr.seq - 1) % kRing];
  if (prev.seq == pr.seq - 1 && prev.tx[0] && prev.tx[1]) {
    pr.fu_seq = prev.seq;
    pr.fu_tx0 = prev.tx[0];
    pr.fu_tx1 = prev.tx[1];
  }
  // Feedback: the two newest pairs we received from this peer on this path.
  const RxPair* top[2] = {nullptr, nullptr};  // newest first
  for (const RxPair& r : ps.rx) {
    if (r.seq == kNoSeq) continue;
    if (!top[0] || r.seq > top[0]->seq) {
      top[1] = top[0];
      top[0] = &r;
    } else if (!top[1] || r.seq > top[1]->seq) {
      top[1] = &r;
    }
  }
  // A pair heard but not taken first (path_probe), once: the peer proves
  // with it that it hears us.
  if (ps.heard.seq != kNoSeq) {
    pr.feedback[pr.n_feedback++] = {ps.heard.seq, ps.heard.rx[0], ps.heard.rx[1], ps.rx_count};
    ps.heard = RxPair{};
  }
  for (const RxPair* r : top)
    if (r && pr.n_feedback < kMaxFeedback) pr.feedback[pr.n_feedback++] = {r->seq, r->rx[0], r->rx[1], ps.rx_count};
  // Gossip: our direct estimates of other peers, a few per probe, in turn.
  if (o.gossip && peers_.size() > 1) {
    for (size_t k = 0; k < peers_.size() && pr.n_gossip < kMaxGossip; k++) {
      const Peer& q = *peers_[(p.gossip_cursor + k) % peers_.size()];
      const ClockModel& m = q.est.model();
      if (&q == &p || !m.valid) continue;
      Gossip& g = pr.gossip[pr.n_gossip++];
      g.peer_id = q.id;
      g.offset_ns = std::llround(m.offset_at(now));
      g.drift_ps_s = std::llround(m.drift * 1e12);
      g.bound_ns = uint32_t(std::min(4e9, m.bound_at(now)));
      g.age_ms = uint32_t(std::min<int64_t>(UINT32_MAX, (now - m.t_ref) / 1'000'000));
    }
    p.gossip_cursor = int((p.gossip_cursor + kMaxGossip) % peers_.size());
  }
  q->peer_idx = peer_idx;
  q->o = o;
  q->seq = pr.seq;
  q->now = now;
  q->n[0] = encode(pr, cfg_.key, q->b[0]);
  pr.idx = 1;
  q->n[1] = encode(pr, cfg_.key, q->b[1]);
  ps.tx[pr.seq % kRing] = TxPair{pr.seq, {0, 0}, now};
}

// After the pair left (ids[i]: its datagrams' stamp ids, -1 if not sent).
void ProbeEngine::pair_sent(const Queued& q, const int64_t ids[2]) {
  const Out& o = q.o;
  PathState& ps = *o.ps;
  TxPair& tp = ps.tx[q.seq % kRing];
  ProbeSocket& s = *o.sock;
  for (int i = 0; i < 2; i++) {
    if (ids[i] < 0) {
      ctr_.send_errors++;
      continue;
    }
    ctr_.sent++;
    ctr_.bytes_sent += q.n[i] + 28;
    if (s.mode() == StampMode::user) {
      tp.tx[i] = ts_.now();
      continue;
    }
    auto& pend = *o.pend;
    if (pend.size() >= kPendingMax) pend.erase(pend.begin());
    pend.push_back({ids[i], q.peer_idx, q.seq, i, o.sp});
  }
  ps.view.on_sent(q.now, q.seq);
}

int ProbeEngine::receive(ProbeSocket& s, int rail, SourcePath* own) {
  static_assert(ProbeSocket::kMaxDatagram > kMaxProbeSize);
  const bool ignore = !probing_.load() || quiet(ts_.now());
  return s.recv_all(256, [&](std::span<const uint8_t> d, const sockaddr_in& from, int64_t rx_ns) {
    if (ignore) return;
    ctr_.received++;
    Probe pr;
    DecodeStatus st = d.size() > kMaxProbeSize ? DecodeStatus::short_or_long : decode(d, cfg_.key, &pr);
    if (st == DecodeStatus::bad_tag) {
      ctr_.dropped_auth++;
      // Most often a host of the job that made a key of its own; said once
      // per address (a flood of forged ones stops at the bound).
      if (bad_key_from_.size() < 256 && bad_key_from_.insert(from.sin_addr.s_addr).second) {
        char ip[INET_ADDRSTRLEN] = "?";
        inet_ntop(AF_INET, &from.sin_addr, ip, sizeof ip);
        log::warn("clocksync: probes from {} fail this job's key: every host of a job needs the same "
                  "SHUNT_JOB_KEY (or SHUNT_JOB_KEY_FILE on a shared file system)",
                  ip);
      }
      return;
    }
    if (st != DecodeStatus::ok || rx_ns == 0 || pr.path != rail ||
        (pr.receiver_id != 0 && pr.receiver_id != self_id_)) {
      ctr_.dropped_malformed++;
      return;
    }
    if (own)
      handle_source(*own, pr, from, ts_.local(rx_ns));
    else
      handle(rail, pr, from, ts_.local(rx_ns));
  });
}

ProbeEngine::Peer* ProbeEngine::find_peer(uint64_t id, const sockaddr_in& from, int rail) {
  for (auto& p : peers_)
    if (p->id == id) return p.get();
  // A peer known only by address (add_peer from a connection) learns its id here.
  for (auto& p : peers_)
    if (!p->id_confirmed && size_t(rail) < p->paths.size() &&
        p->paths[rail].remote.sin_addr.s_addr == from.sin_addr.s_addr) {
      p->id = id;
      return p.get();
    }
  return nullptr;
}

void ProbeEngine::handle(int rail, const Probe& pr, const sockaddr_in& from, int64_t rx) {
  Peer* p = find_peer(pr.sender_id, from, rail);
  if (!p || size_t(rail) >= p->paths.size()) {
    ctr_.dropped_unknown++;
    return;
  }
  if (from.sin_port != htons(cfg_.port)) {
    // From another port than the probe port: one of the peer's source paths.
    // We answer it (reflected) from our probe port to that port.
    SourcePath* sp = nullptr;
    size_t n = 0;
    for (auto& q : p->sources) {
      if (!q->reflected) continue;
      n++;
      if (q->rail == rail && q->ps.remote.sin_port == from.sin_port &&
          q->ps.remote.sin_addr.s_addr == from.sin_addr.s_addr)
        sp = q.get();
    }
    if (!sp) {
      if (n >= kMaxSourcePaths) {
        ctr_.dropped_unknown++;
        return;
      }
      auto q = std::make_unique<SourcePath>(cfg_.pair_tol_ns);
      q->peer = p->index;
      q->rail = rail;
      q->port = ntohs(from.sin_port);
      q->reflected = true;
      q->ps.remote = from;
      q->ps.next_seq = random_seq();
      q->last_rx = rx;
      sp = q.get();
      p->sources.push_back(std::move(q));
    }
    // Answered when heard but not taken too: the answer's feedback is how
    // the peer proves it hears us (path_probe).
    const Taken t = path_probe(*p, sp->ps, sp->filter, pr, rx, false);
    if (t == Taken::yes) sp->last_rx = rx;
    if (t != Taken::dropped) sp->owed = true;
    return;
  }
  if (path_probe(*p, p->paths[rail], p->filter, pr, rx, true) != Taken::yes) return;
  // Gossip about hosts we also probe.
  for (int k = 0; k < pr.n_gossip; k++) {
    const Gossip& g = pr.gossip[k];
    if (g.peer_id == self_id_ || g.peer_id == p->id) continue;
    auto it = std::find_if(p->heard.begin(), p->heard.end(), [&](const Heard& h) { return h.id == g.peer_id; });
    if (it == p->heard.end()) {
      if (p->heard.size() >= size_t(cfg_.max_peers)) continue;
      it = p->heard.insert(p->heard.end(), Heard{});
    }
    *it = Heard{g.peer_id, double(g.offset_ns), double(g.drift_ps_s) * 1e-12, double(g.bound_ns),
                pr.tx_app_ns, rx};
  }
}

void ProbeEngine::handle_source(SourcePath& sp, const Probe& pr, const sockaddr_in& from, int64_t rx) {
  // Only the peer it goes to answers a source path, from its probe port.
  Peer& p = *peers_[sp.peer];
  if (from.sin_port != htons(cfg_.port) || find_peer(pr.sender_id, from, sp.rail) != &p) {
    ctr_.dropped_unknown++;
    return;
  }
  path_probe(p, sp.ps, sp.filter, pr, rx, false);
}

namespace {
// Whether `pr` names, in its feedback, a pair of ours on this path that is
// among our last kRing and that no probe taken so far had named: it was
// made after the peer received that pair, so it is no replay. Our sequence
// numbers start at random (random_seq), so no earlier probe can name one.
bool names_new_pair(const PathState& ps, const Probe& pr) {
  for (int k = 0; k < pr.n_feedback; k++) {
    const Feedback& f = pr.feedback[k];
    if (f.seq == kNoSeq || (ps.fwd_any && f.seq <= ps.last_fwd)) continue;
    if (ps.tx[f.seq % kRing].seq == f.seq) return true;
  }
  return false;
}
}  // namespace

// A probe that passed the checks, on one path: receive and replay
// bookkeeping, liveness, and the one-way delays its stamps complete. `clock`:
// the samples also feed the peer's clock estimate (rail paths only).
//
// Replays: the window is the peer's newest pair taken and the kRing before
// it; a pair in it is taken once, a pair up to kMaxAhead past it advances
// it. Any other pair (an older one, a restarted peer's, one far ahead:
// every probe is authenticated, so a peer's or a replay) is taken only if
// it names a pair of ours no probe had named yet (names_new_pair), and the
// window then starts over at it. Else it is heard, not taken: our next
// pair's feedback names it, the restarted peer's answer names that pair,
// and the window moves there, a send round or two after the restart. So
// no sequence number, however large, holds the window, and a replayed
// probe (which names only pairs already named, or none of ours) is never
// taken outside the window.
ProbeEngine::Taken ProbeEngine::path_probe(Peer& pe, PathState& ps, PairFilter& filter, const Probe& pr,
                                           int64_t rx, bool clock) {
  Peer* p = &pe;
  RxPair& slot = ps.rx[pr.seq % kRing];
  const bool in_window = ps.rx_any && pr.seq + kRing > ps.rx_max && pr.seq <= ps.rx_max + kMaxAhead;
  if (!in_window) {
    if (!names_new_pair(ps, pr)) {
      if (ps.heard.seq != pr.seq) ps.heard = RxPair{pr.seq, {0, 0}};
      ps.heard.rx[pr.idx] = rx;
      ctr_.dropped_replay++;
      return Taken::heard;
    }
    ps.rx.fill(RxPair{});
    ps.rx_any = false;
    ps.rev_any = false;
    ps.heard = RxPair{};
    ps.view.on_peer_restart();
  } else if (slot.seq == pr.seq && slot.rx[pr.idx] != 0) {
    ctr_.dropped_replay++;
    return Taken::dropped;
  }
  p->id_confirmed = true;
  if (p->last_heard && rx - p->last_heard > silent_gap(cfg_)) p->resumed_at = std::max(p->resumed_at, rx);
  p->last_heard = std::max(p->last_heard, rx);
  if (slot.seq != pr.seq) slot = RxPair{pr.seq, {0, 0}};
  slot.rx[pr.idx] = rx;
  ps.rx_max = ps.rx_any ? std::max(ps.rx_max, pr.seq) : pr.seq;
  ps.rx_any = true;
  ps.rx_count++;
  ps.view.on_received(rx, pr.seq);
  const ClockModel& m = p->est.model();

  // Reverse sample: the peer's send stamps of its previous pair and our receive stamps.
  if (pr.fu_seq != kNoSeq && (!ps.rev_any || pr.fu_seq > ps.last_rev)) {
    const RxPair& r = ps.rx[pr.fu_seq % kRing];
    if (r.seq == pr.fu_seq) {
      ps.last_rev = pr.fu_seq;
      ps.rev_any = true;
      if (clock && r.rx[0]) {
        p->naive_r = r.rx[0] - pr.fu_tx0;
        p->naive_r_t = r.rx[0];
        p->have_r = true;
      }
      if (auto d = filter.accept({pr.fu_tx0, pr.fu_tx1, r.rx[0], r.rx[1]})) {
        if (clock) p->est.add_reverse({r.rx[0], *d});
        if (m.valid) ps.view.add_delay(rx, false, double(*d) + m.offset_at(r.rx[0]));
      }
    }
  }
  // Forward samples: the peer's receive stamps of our pairs, oldest first.
  int order[kMaxFeedback] = {0, 1};
  if (pr.n_feedback == 2 && pr.feedback[1].seq < pr.feedback[0].seq) std::swap(order[0], order[1]);
  for (int k = 0; k < kMaxFeedback; k++) {
    if (order[k] >= pr.n_feedback) continue;
    const Feedback& f = pr.feedback[order[k]];
    if (f.seq == kNoSeq || (ps.fwd_any && f.seq <= ps.last_fwd)) continue;
    const TxPair& t = ps.tx[f.seq % kRing];
    if (t.seq != f.seq || !t.tx[0] || !t.tx[1]) continue;
    ps.last_fwd = f.seq;
    ps.fwd_any = true;
    ps.view.on_feedback(rx, f.rx_count, f.seq);
    if (clock && f.rx0) {
      p->naive_f = f.rx0 - t.tx[0];
      p->naive_f_t = t.tx[0];
      p->have_f = true;
    }
    if (auto d = filter.accept({t.tx[0], t.tx[1], f.rx0, f.rx1})) {
      if (clock) p->est.add_forward({t.tx[0], *d});
      if (m.valid) ps.view.add_delay(rx, true, double(*d) - m.offset_at(t.tx[0]));
    }
    // The queue detector takes every pair, queued ones above all (the pair
    // filter keeps those that met no queue): the lesser of its two delays,
    // against the clock model once it exists, else raw (the offset is
    // constant enough over seconds; PathView rebases the detector on the
    // model when it appears).
    if (f.rx0 && f.rx1) {
      const double raw = double(std::min(f.rx0 - t.tx[0], f.rx1 - t.tx[1]));
      const std::function<double(int64_t)> offset = [&m](int64_t at) { return m.offset_at(at); };
      ps.view.add_queue_sample(rx, raw, m.valid ? &offset : nullptr);
    }
  }
  return Taken::yes;
}

void ProbeEngine::forget_reflected(Peer& p, size_t k) {
  SourcePath* sp = p.sources[k].get();
  auto& pend = pending_[sp->rail];
  pend.erase(std::remove_if(pend.begin(), pend.end(), [&](const Pending& x) { return x.sp == sp; }),
             pend.end());
  p.sources.erase(p.sources.begin() + long(k));
}

void ProbeEngine::tick(int64_t now, std::vector<PathEvent>* events) {
  const bool fz = frozen(now);  // a pause (pause_probing): every path stays as it was
  // This thread woke that late (not scheduled: a starved host): no probe
  // went out meanwhile, and what the peers sent waited in the sockets.
  if (wake_planned_ && now - wake_planned_ > silent_gap(cfg_)) self_resumed_ = now;
  wake_planned_ = 0;
  for (auto& p : peers_) {
    p->est.tick(now);
    if (fz) continue;
    const Hold h = hold_of(cfg_, *p, self_resumed_, now);
    for (size_t r = 0; r < p->paths.size(); r++)
      if (p->paths[r].view.update_liveness(now, rail_dead(cfg_) * h.times, h.since))
        events->push_back({p->name, int(r), p->paths[r].view.alive(), now});
    for (size_t k = 0; k < p->sources.size();) {
      SourcePath& sp = *p->sources[k];
      if (sp.reflected && now - sp.last_rx > reflect_idle(cfg_)) {
        forget_reflected(*p, k);  // the peer stopped probing it (removed, or its traffic is lost)
        continue;
      }
      if (sp.grace_until && now >= sp.grace_until) sp.grace_until = 0;
      if (sp.ps.view.update_liveness(now, dead_of(cfg_, sp, now, h), h.since) && !sp.reflected)
        events->push_back({p->name, sp.rail, sp.ps.view.alive(), now, sp.id, sp.port});
      k++;
    }
  }
  if (now - last_loop_ >= kLoopEvery) {
    last_loop_ = now;
    correct_loops(now);
    publish(now);
  }
  if (now - last_phc_ >= kPhcEvery) {
    last_phc_ = now;
    for (auto& s : socks_) s->refresh_phc();
    for (auto& p : peers_)
      for (auto& sp : p->sources)
        if (sp->sock) sp->sock->refresh_phc();
  }
}

void ProbeEngine::correct_loops(int64_t now) {
  // Hosts: 0 = us, 1.. = peers. Edges: our direct estimates, and the peers'
  // gossiped estimates between two of our peers (both ends' views averaged,
  // since they come from the same probes and are not independent).
  int n = int(peers_.size()) + 1;
  std::vector<Edge> edges;
  std::map<std::pair<int, int>, std::pair<Edge, int>> between;
  for (int i = 0; i < int(peers_.size()); i++) {
    const Peer& p = *peers_[i];
    const ClockModel& m = p.est.model();
    if (m.valid) edges.push_back({0, i + 1, m.offset_at(now), std::max(1.0, m.bound_at(now))});
    if (!m.valid) continue;
    for (const Heard& h : p.heard) {
      int j = -1;
      for (int k = 0; k < int(peers_.size()); k++)
        if (peers_[k]->id == h.id) j = k;
      if (j < 0 || j == i || now - h.local_rx > 2'000'000'000) continue;
      // The sender's clock now is ours plus its offset.
      double elapsed = double(now) + m.offset_at(now) - double(h.sender_time);
      Edge e{i + 1, j + 1, h.offset_ns + h.drift * elapsed,
             std::max(1.0, h.bound_ns + 1e-7 * std::fabs(elapsed))};
      auto key = std::make_pair(std::min(i, j), std::max(i, j));
      auto it = between.find(key);
      if (it == between.end()) {
        between[key] = {e, 1};
      } else {
        Edge& a = it->second.first;
        double off = e.from == a.from ? e.offset_ns : -e.offset_ns;
        // Two views further apart than their bounds allow: one is stale (a
        // step one end has seen and the other not yet). Use neither.
        if (it->second.second < 0 || std::fabs(a.offset_ns - off) > a.bound_ns + e.bound_ns) {
          it->second.second = -1;
          continue;
        }
        a.bound_ns = std::max(std::min(a.bound_ns, e.bound_ns), std::fabs(a.offset_ns - off) / 2);
        a.offset_ns = (a.offset_ns + off) / 2;
        it->second.second++;
      }
    }
  }
  for (auto& [k, v] : between)
    if (v.second > 0) edges.push_back(v.first);
  LoopSolution sol;
  bool ok = solve_loops(n, 0, edges, &sol);
  for (int i = 0; i < int(peers_.size()); i++) {
    Peer& p = *peers_[i];
    p.corr_valid = ok && p.est.model().valid && std::isfinite(sol.bound_ns[i + 1]);
    if (!p.corr_valid) continue;
    p.corr_offset = sol.offset_ns[i + 1];
    // Never claim more than the direct estimate can be off by.
    p.corr_bound = std::min(sol.bound_ns[i + 1], p.est.model().bound_at(now));
    p.corr_at = now;
  }
}

PeerClock ProbeEngine::clock_of(const Peer& p, int64_t now) const {
  PeerClock c;
  const ClockModel& m = p.est.model();
  c.at = now;
  if (p.have_f && p.have_r && std::llabs(p.naive_f_t - p.naive_r_t) < 2 * cfg_.interval_ns * rail_every(cfg_)) {
    c.naive_valid = true;
    c.naive_offset_ns = double(p.naive_f - p.naive_r) / 2;
  }
  if (!m.valid) return c;
  c.valid = true;
  c.direct_offset_ns = m.offset_at(now);
  c.direct_bound_ns = m.bound_at(now);
  c.drift_ppb = m.drift * 1e9;
  c.half_rtt_ns = m.half_rtt_ns;
  c.age_ns = double(now - m.t_ref);
  c.offset_ns = c.direct_offset_ns;
  c.bound_ns = c.direct_bound_ns;
  if (p.corr_valid) {
    // The correction was computed at corr_at; carry it forward with the drift.
    double dt = double(now - p.corr_at);
    c.offset_ns = p.corr_offset + m.drift * dt;
    c.bound_ns = p.corr_bound + m.bound_rate * std::max(0.0, dt);
    // The correction may only move the estimate within the direct bound: a
    // loop still holding a stale view (a step not yet seen everywhere, or one
    // this estimator just took) must not pull it out.
    if (std::fabs(c.offset_ns - c.direct_offset_ns) > c.direct_bound_ns) {
      c.offset_ns = c.direct_offset_ns;
      c.bound_ns = c.direct_bound_ns;
    }
  }
  return c;
}

void ProbeEngine::publish(int64_t now) {
  if (!shm_) return;
  for (int i = 0; i < int(peers_.size()); i++) {
    const Peer& p = *peers_[i];
    PeerClock c = clock_of(p, now);
    PublishedClock pc;
    pc.peer_id = p.id;
    pc.name = p.name;
    pc.t_ref = now;
    pc.offset_ns = c.offset_ns;
    pc.drift = c.drift_ppb * 1e-9;
    pc.bound_ns = c.bound_ns;
    pc.bound_rate = p.est.model().bound_rate;
    pc.updated = now;
    pc.valid = c.valid;
    shm_->pub.publish(i, pc);
  }
}

std::vector<PeerReport> ProbeEngine::report() const {
  std::lock_guard lk(mu_);
  int64_t now = ts_.now();
  std::vector<PeerReport> out;
  for (auto& p : peers_) {
    PeerReport r;
    r.name = p->name;
    r.id = p->id;
    r.clock = clock_of(*p, now);
    for (auto& ps : p->paths) {
      r.paths.push_back(ps.view.stats(now));
      char ip[INET_ADDRSTRLEN] = "";
      if (ps.remote.sin_addr.s_addr) inet_ntop(AF_INET, &ps.remote.sin_addr, ip, sizeof ip);
      r.addrs.push_back(ip);
    }
    for (auto& sp : p->sources)
      r.source_paths.push_back({sp->id, sp->rail, sp->port, sp->reflected, sp->spare, sp->ps.view.stats(now)});
    r.pairs_kept = p->filter.accepted();
    r.pairs_dropped = p->filter.rejected();
    r.pair_tol_ns = p->filter.tolerance();
    r.steps = p->est.steps_detected();
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<std::pair<std::string, std::vector<bool>>> ProbeEngine::rails_alive() const {
  std::lock_guard lk(mu_);
  std::vector<std::pair<std::string, std::vector<bool>>> out;
  for (auto& p : peers_) {
    std::vector<bool> alive;
    for (auto& ps : p->paths) alive.push_back(ps.view.alive());
    out.emplace_back(p->name, std::move(alive));
  }
  return out;
}

std::optional<PeerClock> ProbeEngine::clock(std::string_view peer) const {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    if (p->name == peer) return clock_of(*p, ts_.now());
  return std::nullopt;
}

std::optional<PathStats> ProbeEngine::path(std::string_view peer, int rail) const {
  std::lock_guard lk(mu_);
  for (auto& p : peers_)
    if (p->name == peer && rail >= 0 && size_t(rail) < p->paths.size())
      return p->paths[rail].view.stats(ts_.now());
  return std::nullopt;
}

EngineCounters ProbeEngine::counters() const {
  std::lock_guard lk(mu_);
  return ctr_;
}

StampMode ProbeEngine::stamp_mode() const {
  StampMode m = StampMode::hardware;
  for (auto& s : socks_) m = std::min(m, s->mode());
  return socks_.empty() ? StampMode::user : m;
}

}  // namespace shunt::clocksync
