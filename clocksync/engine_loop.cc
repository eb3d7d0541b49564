// The probe engine's thread (engine.cc has the rest): what is due next and
// the sleep until then, the wakeup's reads, sends and liveness deadlines
// (tick), and the notifier thread that tells the liveness changes.
#include "clocksync/engine_impl.h"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <limits>

#include "core/log.h"

namespace shunt::clocksync {

using namespace detail;

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

}  // namespace shunt::clocksync
