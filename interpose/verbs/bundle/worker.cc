// The failover worker: one thread per bundle that reports failures, renews paths, steers and returns them home.
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>
#include <pthread.h>
#include <algorithm>
#include <thread>
#include <optional>
#include <chrono>

#include "clocksync/clock_shm.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/runtime.h"
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

}  // namespace

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


// A QP that retries forever (retry count 7: rxe never gives up then, and
// many applications ask for it) never reports a dead route with an error
// completion; it just stops completing. A path with work in flight whose
// last known completion has not moved for SHUNT_STALL_MS, while its port
// retransmitted in that time, has failed like any other: its work moves.

}  // namespace shunt::verbs::bundle
