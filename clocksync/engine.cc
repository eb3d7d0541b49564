// The probe engine (engine.h): construction and the thread's start and
// stop, peers, the probing switch and pauses, the callbacks' registration,
// and the public queries. Its other parts: engine_loop.cc (the engine
// thread's loop, its wakeups and the liveness deadlines), engine_send.cc
// (pairs out), engine_receive.cc (probes in), engine_source.cc (source and
// reflected paths) and engine_clock.cc (the loop correction and the clocks
// reported and published); what they share is in engine_impl.h.
#include "clocksync/engine_impl.h"

#include <arpa/inet.h>
#include <pthread.h>
#include <sodium.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <random>

#include "core/log.h"

namespace shunt::clocksync {

using namespace detail;

namespace detail {
// (engine_impl.h)
uint64_t random_seq() {
  uint64_t v = (uint64_t(randombytes_random()) << 32) | randombytes_random();
  return (v >> 2) | 1;
}
}  // namespace detail

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
