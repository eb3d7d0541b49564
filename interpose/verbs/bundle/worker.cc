// The failover worker: one thread per bundle that reports failures, renews paths, steers and returns them home;
// and every other thread of the bundle starts here.
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>
#include <pthread.h>

#include <algorithm>
#include <thread>
#include <optional>
#include <chrono>

#include "clocksync/clock_shm.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "core/threads.h"
#include "interpose/verbs/probe_ask.h"

namespace shunt::verbs::bundle {

namespace {

void wake_probed_workers();
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
    start_thread("probe generation watch", [shm_name] {
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
    });  // without it, the workers look at the count every 200 ms
  });
}

// What the worker keeps from one round to the next.
struct WorkerState {
  bool decides = false;
  int64_t cap = 0, hold = 0;
  std::vector<int64_t> due, backoff;
  std::vector<std::deque<int64_t>> fails;
  std::vector<bool> was_down;
  int64_t move_since = 0, next_steer = 0, next_probe_sync = 0, next_home = 0;
  ProbeAsk ask;  // whether a path's probes are lost (probe_ask.h)
  std::string shm_name;
  clocksync::ClockReader counts;  // the agent's clock segment: its count of liveness changes
  bool counts_open = false;
  std::vector<int> reported;
  int64_t probed_fail_ms = 0;  // the failure (Bundle::fail_ms) after which every path was probed
  bool unreachable_logged = false;
  bool recheck = false;  // a path whose probes are lost was kept (fail_silent_paths): ask again soon
};

// What one round found.
struct Round {
  int steer_to = -1;  // a steering move's target (-1: none)
  json steer_why;
  bool need_move = false, gave_up = false;
  int64_t fail_ms = 0;  // Bundle::fail_ms
  bool moving = false;  // a move of the carrier is needed or under way
  std::vector<int> down;
  std::vector<bool> unproven;  // renewed, and failed before its probe came back
  std::vector<bool> planned;   // stopped by a steering move, not failed
};

// Every 50 ms while something is to be done (a path down or on probation,
// a move, queue steering); every 200 ms while the bundle is whole, when it
// only looks at the agent's count (in-process failures wake it at once):
// on one-CPU soft-RoCE guests the 50 ms rounds of every probed bundle were
// a cost the job's throughput showed. Where the per-process watch wakes it
// when the count moves (pin or flowlet, without carrier steering), a whole
// bundle's worker sleeps up to 2 s: its home check and its registration
// are what is left to do.
void sleep_until_due(Bundle* b, const WorkerState& w) {
  int wait_ms = 50;
  {
    std::lock_guard l(b->lk);
    bool whole = b->move != Move::needed && !b->prim.down() && !(b->split && b->steer_queue);
    for (const auto& p : b->paths) whole &= !p.down() && !p.probation();
    if (whole) wait_ms = 200;
    if (whole && w.counts_open && g_gen_watch_ok.load() && !b->split && !b->carrier_steer) wait_ms = kQuietMs;
    if (w.recheck) wait_ms = std::min(wait_ms, static_cast<int>(ProbeAsk::kEveryMs));
  }
  std::unique_lock lock(b->wmu);
  b->wcv.wait_for(lock, std::chrono::milliseconds(wait_ms), [&] { return b->wake; });
  b->wake = false;
}

// The agent's probes and steering, outside move_mu: the agent's answer can
// take a while and no failover waits for it (steering touches shares only,
// under lk). false: the bundle is gone.
bool probes_and_steering(Bundle* b, WorkerState& w, Round* r) {
  bool probed;
  {
    std::lock_guard g(b->mu);
    if (b->dead) return false;
    probed = b->probed;
  }
  const int64_t t = mono_ms();
  if (probed && t >= w.next_probe_sync) {
    w.next_probe_sync = t + 500;
    // Renewed shadows: their new ports (nothing to ask while unchanged).
    if (register_probe_paths(b)) w.ask.ports_registered();
  }
  if (b->split || b->carrier_steer) ask_prim_router(b);
  const bool steer_due = probed && (b->split || b->carrier_steer) && b->steer_queue && t >= w.next_steer;
  bool check_due = false;
  if (probed) {
    if (w.ask.regular(t) && !w.shm_name.empty() && (!w.counts_open || w.counts.replaced(w.shm_name))) {
      w.counts_open = w.counts.open(w.shm_name, nullptr);
      if (w.counts_open) start_gen_watch(w.shm_name);
    }
    check_due = w.ask.due(t, w.counts_open ? std::optional<uint64_t>(w.counts.paths_gen()) : std::nullopt);
  }
  if (steer_due || check_due) {
    if (steer_due) w.next_steer = t + config().num(Param::steer_interval_ms);
    ProbeStats st;
    if (probe_stats(b, &st)) {
      if (check_due) {
        bool spared = false;
        fail_silent_paths(b, st, mono_ms(), &spared);
        // A path kept for its work completing: its verdict again next round.
        if (spared) w.ask.unanswered(t);
        w.recheck = spared;
      }
      if (steer_due && b->split) steer_tick(b, st);
      else if (steer_due) r->steer_to = carrier_steer_tick(b, st, w.decides, &r->steer_why);
    } else if (check_due) {
      w.ask.unanswered(t);
    }
  }
  return true;
}

// The answering side's round: it reports what failed here, and asks the
// deciding side for a carrier move; the deciding side decides.
void report_round(Bundle* b, WorkerState& w, const Round& r, int64_t now) {
  if (b->renew_now.exchange(false)) {  // the deciding side renews: it should not wait out its backoff
    std::string err;
    ask_peer(b, request(b, Msg::renew_now), 3000, &err);
  }
  if (r.need_move) {
    std::string err;
    int carrier;
    {
      std::lock_guard l(b->lk);
      carrier = b->carrier;
      b->move = next(b->move, MoveEvent::asked);
    }
    // The peer may be out of reach as long as the paths are (its host's
    // one link dark, say): this side holds its work and asks again each
    // round, until SHUNT_HOLD_MS from the first ask, as the deciding
    // side holds for a path to come back. A peer that answers no gives
    // the application its errors at once.
    if (!w.move_since) w.move_since = now;
    auto a = ask_peer(b, request(b, Msg::carrier_down, {{"carrier", carrier}, {"down", down_list(b)}}),
                      static_cast<int>(std::clamp<int64_t>(w.move_since + w.hold - now, 1000, 10000)), &err);
    if (a && a->value("ok", false)) {
      w.move_since = 0;
      w.unreachable_logged = false;
    } else if (a) {
      give_up(b, "the peer's shim refused the move: " + a->dump());
    } else if (mono_ms() - w.move_since >= w.hold) {
      give_up(b, "the peer's shim cannot be reached within SHUNT_HOLD_MS (" + std::to_string(w.hold) + " ms): " + err);
    } else {
      if (!w.unreachable_logged) event_peer_unreachable(b, err);
      w.unreachable_logged = true;
      std::lock_guard l(b->lk);
      if (b->carrier == carrier) b->move = next(b->move, MoveEvent::retry);
      else w.move_since = 0;  // the peer moved it meanwhile: nothing to ask
    }
    return;
  }
  // A steering move's old carrier is no failure: the deciding side
  // renews it with its own half.
  std::vector<int> failed;
  for (int i : r.down)
    if (!r.planned[i]) failed.push_back(i);
  if (failed != w.reported) {
    std::string err;
    auto a = ask_peer(b, request(b, Msg::path_down, {{"down", failed}}), 3000, &err);
    if (a) w.reported = failed;
  }
}

// The deciding side's move of a failed carrier, and of a congested one
// (steering). false: no path came back within SHUNT_HOLD_MS, and both ends
// gave up.
bool move_round(Bundle* b, WorkerState& w, const Round& r, int64_t now) {
  if (r.need_move) {
    if (!w.move_since) w.move_since = now;
    if (do_move(b)) {
      w.move_since = 0;
    } else if (now - w.move_since > w.hold) {
      std::string why = "no path came back within SHUNT_HOLD_MS (" + std::to_string(w.hold) + " ms)", err;
      give_up(b, why);
      // The other end holds its work too: it gives up with this side.
      ask_peer(b, request(b, Msg::give_up, {{"why", why}}), 3000, &err);
      return false;
    }
  }
  if (r.steer_to >= 0 && !r.need_move) {
    do_move(b, r.steer_to, r.steer_why);
    std::lock_guard l(b->lk);
    b->chold.moved(mono_ms());
  }
  return true;
}

// The deciding side's renewals: when each failed path is tried again
// (backoff, damping), and the tries that are due.
void renew_round(Bundle* b, WorkerState& w, const Round& r, int64_t now) {
  const bool port_back = b->renew_now.exchange(false);
  std::vector<int> due_now;
  for (int i : r.down) {
    if (!w.was_down[i]) {  // a new failure: when to try again
      w.was_down[i] = true;
      if (r.planned[i]) {  // the old carrier of a steering move: renewed now, nothing counted
        w.due[i] = now;
      } else if (r.unproven[i]) {  // the route is still dead: back off further
        w.due[i] = now + w.backoff[i];
        w.backoff[i] = std::min<int64_t>(w.backoff[i] * 2, w.cap);
      } else {  // it had worked: a failure that counts for the damping
        w.backoff[i] = 100;
        w.fails[i].push_back(now);
        while (!w.fails[i].empty() && now - w.fails[i].front() > 60000) w.fails[i].pop_front();
        w.due[i] = now + (w.fails[i].size() >= 3 ? w.cap : w.backoff[i]);
      }
    }
    if (port_back && w.fails[i].size() < 3) w.due[i] = now;  // the backoff, not the damping, is cut short
    if (now >= w.due[i]) due_now.push_back(i);
  }
  if (r.down.empty() && !r.need_move && now >= w.next_home) {
    w.next_home = now + kHomeCheckMs;
    return_home(b);
  }
  if (due_now.empty()) return;
  std::string err;
  std::vector<int> back = renew_paths(b, due_now, &err, false);
  for (int i : due_now) {
    if (std::find(back.begin(), back.end(), i) != back.end()) {
      w.was_down[i] = false;  // (its backoff is kept until its probe shows the route works)
    } else {
      w.backoff[i] = std::min<int64_t>(w.backoff[i] * 2, w.cap);
      w.due[i] = mono_ms() + w.backoff[i];
      event_renewal_deferred(b, i, err, w.backoff[i]);
    }
  }
}

// What the completion filter found since the last round is reported
// first, before the round acts on it. false: the bundle is gone.
bool report_found(Bundle* b) {
  std::lock_guard g(b->mu);  // (its QP lives while `dead` is not set)
  if (b->dead) return false;
  report_mail(b);
  return true;
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
  WorkerState w;
  w.decides = initiates(b);
  w.cap = config().num(Param::path_retry_max_ms);
  w.hold = config().num(Param::hold_ms);
  w.due.assign(b->paths.size(), 0);
  w.backoff.assign(b->paths.size(), 100);
  w.fails.resize(b->paths.size());
  w.was_down.assign(b->paths.size(), false);
  w.shm_name = expand_pattern(config().str(Param::clock_shm), static_cast<int>(getpid()));
  for (;;) {
    sleep_until_due(b, w);
    if (!report_found(b)) return;
    Round r;
    if (!probes_and_steering(b, w, &r)) return;
    r.unproven.assign(b->paths.size(), false);
    r.planned.assign(b->paths.size(), false);
    // The rest of the round under move_mu: bundle_on_destroy takes it before
    // it destroys the shadows, so no round touches a destroyed QP or CQ.
    std::unique_lock m(b->move_mu);
    {
      std::lock_guard g(b->mu);
      if (b->dead) return;
    }
    {
      std::lock_guard l(b->lk);
      r.need_move = b->move == Move::needed;
      r.gave_up = b->move == Move::gave_up;
      r.fail_ms = b->fail_ms;
      r.moving = b->move == Move::needed || b->move == Move::moving;
      for (size_t i = 0; i < b->paths.size(); i++)
        if (b->paths[i].down() && static_cast<int>(i) != b->carrier) {
          r.down.push_back(static_cast<int>(i));
          r.unproven[i] = unproven(b->paths[i].life);
          r.planned[i] = planned(b->paths[i].life);
        }
    }
    if (r.gave_up) return;
    refresh_rkeys(b);
    poll_overdue_probes(b);
    // A new failure (the application's QP's too, at both ends): are the
    // others behind the same fault? The stall watch fails those whose
    // probe goes unanswered while others answer. Once a move of the
    // carrier is done: a probe takes a path out of the rotation until it
    // completes, and the move's candidates must be in it at both ends (the
    // deciding end probes its candidates itself).
    if (r.fail_ms != w.probed_fail_ms && !r.moving) {
      probe_all(b);
      w.probed_fail_ms = r.fail_ms;
    }
    const int64_t now = mono_ms();
    if (!w.decides) {
      report_round(b, w, r, now);
      continue;
    }
    if (!move_round(b, w, r, now)) return;
    renew_round(b, w, r, now);
  }
}

// The worker's thread: asleep from the bundle's activation until its first
// wake-up (a failure, a probed or split bundle's start), then its rounds.
void worker_main(Bundle* b) {
  ReentryGuard guard;
  struct Exit {
    Bundle* b;
    ~Exit() {
      if (b->prim_router_fd >= 0) close(b->prim_router_fd), b->prim_router_fd = -1;
      b->worker_exited.store(true);
    }
  } exit{b};
  pthread_setname_np(pthread_self(), "shunt-failover");
  {
    std::unique_lock lock(b->wmu);
    b->wcv.wait(lock, [&] { return b->wake; });  // (its first round takes the wake-up)
  }
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;  // destroyed before it had anything to do
  }
  run_worker(b);
}

// Starts the worker's thread unless it runs. false: no thread could be made.
bool launch(Bundle* b) {
  {
    std::lock_guard w(b->wmu);
    if (b->worker) return true;
    b->worker = true;
  }
  // A worker that throws leaves its bundle without failover rather than
  // ending the job; worker_exited still tells its waiters it is gone.
  if (start_thread("bundle worker", [b] { worker_main(b); })) return true;
  std::lock_guard w(b->wmu);
  b->worker = false;  // the next wake_worker tries again
  return false;
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

}  // namespace

void start_worker(Bundle* b) {
  if (!b->no_worker) launch(b);
}

bool start_job(const char* what, std::function<void()> body, std::function<void(const std::string&)> on_throw) {
  return start_thread(what, std::move(body), std::move(on_throw));
}

void wake_worker(Bundle* b) {
  if (b->no_worker) return;
  signal_worker(b);
  launch(b);
}

void signal_worker(Bundle* b) {
  {
    std::lock_guard w(b->wmu);
    b->wake = true;
  }
  b->wcv.notify_one();
}

// A QP that retries forever (retry count 7: rxe never gives up then, and
// many applications ask for it) never reports a dead route with an error
// completion; it just stops completing. A path with work in flight whose
// last known completion has not moved for SHUNT_STALL_MS, while its port
// retransmitted in that time, has failed like any other: its work moves.

}  // namespace shunt::verbs::bundle
