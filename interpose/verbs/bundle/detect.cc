// Detection outside the data path: the stall watch, port and device events, and paths whose probes are lost.
#include "interpose/verbs/bundle/parts.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>
#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/rails.h"
#include "interpose/verbs/retransmits.h"

namespace shunt::verbs::bundle {

namespace {

// What a look of the stall watch found of a bundle's paths.
struct Looked {
  std::vector<int> stalled;     // no progress for a stall time, the port retransmitting
  std::vector<int> flapping;    // kFlapHiccups hiccups within kFlapWindows stall times
  std::vector<int> unanswered;  // probed after a failure, silent while others answered
  std::vector<int> waiting;     // stalled, but no other path has shown a route to the peer since
  bool others = false;          // some usable path is none of those (idle, or progressing)
  bool checking = false;        // some path's probe is out (a witness, or after a failure)
  bool suspect = false;         // a path held for kHiccupLooks looks, no drain yet
  int64_t witness_since = 0;    // a path held for half a stall, the port retransmitting,
                                // since then (0: none): idle paths are to be probed
};

// Whether a usable path of b other than pi shows that a route to the peer
// works since since_ms: its work moved after it, or its probe (the carrier
// is not probed) completed at or after it and no later than proven_by (a
// witness's answer must be a grace old: witness_grace_ms). Under b->lk.
bool answered_since(Bundle* b, int pi, int64_t since_ms, int64_t proven_by = INT64_MAX) {
  auto answered = [&](const Path& q) {
    return usable(q) && ((q.proven_ms >= since_ms && q.proven_ms <= proven_by) || q.progress_ms > since_ms);
  };
  if (pi != kPrimary && answered(b->prim)) return true;
  for (size_t i = 0; i < b->paths.size(); i++)
    if (static_cast<int>(i) != pi && answered(b->paths[i])) return true;
  return false;
}

// How long a witness's answer must be old before a path it outlived
// fails: the path's own retransmission (one ACK timeout of the
// application's QP after the peer answers again) gets through in that
// time when what held both was the peer, not the route. At most a quarter
// stall: a witness sent at half a stall has then waited its grace out by
// the time the stall is judged, and a dead route fails no later than it
// did without witnesses.
int64_t witness_grace_ms(const Bundle* b, int64_t stall_ms) {
  const int t = std::min<int>(b->rts.timeout, 31);
  const int64_t ack_ms = t ? static_cast<int64_t>((4096ull << t) / 1000000) : 0;
  return std::clamp<int64_t>(ack_ms, stall_ms / 8, stall_ms / 4);
}

// A look at b's paths. Stalled: work that has not progressed since
// `stall_ms` ago, with a retransmission on the port since it last
// progressed. Flapping: a link that goes dark for less than a stall at a
// time, again and again, never stalls a path for good, and halves what it
// carries (each loss waits out an ACK timeout). Unanswered: after a
// failure every path is probed; one whose probe a quarter stall later has
// not completed, with nothing of its work completed since it went out,
// while another path's later probe completed, sits behind the same fault
// (a leaf's uplinks, a spine), and failing it now frees the work it holds
// a second or more before its own probes are lost. (Not waiting for its
// port to retransmit: with an ACK timeout of a second or more, as jobs
// set, the first retransmission comes as late as the probes' verdict.)
// Under b->lk, within the look b->looks (called twice in one look, it
// counts it once). retx_ms(rail): when the port of that rail of b last
// retransmitted. `done` moves only as completions are polled, and a rank
// busy elsewhere leaves them in the CQ: a hold counts as a hiccup only
// once a drain found it (drained: this call follows one). A stalled path
// fails only once another path has shown that a route to the peer works
// (witnessed): a peer that stopped answering on every path (its host
// starved of CPU, as a job's start can do to a soft-RoCE guest) is no dead
// route, and failing the path would only cost a replay. A path held for
// half a stall with its port retransmitting asks for witnesses, probes on
// idle paths, so that one has answered by the time the stall is judged.
Looked look_at_paths(Bundle* b, int64_t now, int64_t stall_ms, const RetxFn& retx_ms, bool drained) {
  Looked out;
  std::vector<int> stalled;
  auto look = [&](Path& p, int pi) {
    if (p.down() || !p.qp) return;
    out.checking |= p.life == Life::checking;
    const bool held = !(p.posted == p.done || p.done != p.watch_done || p.watch_ms == 0);
    if (held && now - p.watch_ms >= stall_ms / 2 && retx_ms(p.rail) >= p.watch_ms)
      out.witness_since = out.witness_since ? std::min(out.witness_since, p.watch_ms) : p.watch_ms;
    // A probe of shunt's, sent and done since the look that last found the
    // path idle or progressing, is no work of the path's: its hold is no
    // hiccup, its completion no progress (a witness proves a route after a
    // grace, by proven_ms).
    const bool probe_only = p.probe_ms >= p.watch_ms && p.proven_ms >= p.probe_ms;
    // A witness's probe fails its path (stalled, unanswered) only where a
    // path failed since it went out: else a peer slow to answer (a starved
    // guest) failed witnesses that merely answered late.
    const bool judged = !p.witness || b->fail_ms >= p.probe_ms;
    if (!held) {
      // Done after the looks between found it held, a drain included: a hiccup.
      if (p.done != p.watch_done && p.hold_drained && !p.probation() && !probe_only &&
          retx_ms(p.rail) >= p.watch_ms) {
        p.hiccup_at = static_cast<uint8_t>((p.hiccup_at + 1) % p.hiccups.size());
        p.hiccups[p.hiccup_at] = now;
      }
      if (p.done != p.watch_done && !probe_only) p.progress_ms = now;
      p.watch_done = p.done;
      p.watch_ms = now;
      p.watch_look = b->looks;
      p.hold_drained = false;
    } else if (judged && now - p.watch_ms >= stall_ms && retx_ms(p.rail) >= p.watch_ms) {
      stalled.push_back(pi);
      return;
    } else if (judged && p.probation() && p.probe_ms >= p.watch_ms && now - p.probe_ms >= stall_ms / 4 &&
               answered_since(b, pi, p.probe_ms)) {
      out.unanswered.push_back(pi);
      return;
    } else if (b->looks - p.watch_look >= static_cast<uint64_t>(kHiccupLooks) && retx_ms(p.rail) >= p.watch_ms) {
      if (drained) p.hold_drained = true;
      else if (!p.hold_drained) out.suspect = true;
    }
    const int64_t oldest = p.hiccups[(p.hiccup_at + 1) % p.hiccups.size()];
    if (oldest && now - oldest <= kFlapWindows * stall_ms) out.flapping.push_back(pi);
    else out.others |= !p.probation();
  };
  look(b->prim, kPrimary);
  for (size_t i = 0; i < b->paths.size(); i++) look(b->paths[i], static_cast<int>(i));
  const int64_t grace = witness_grace_ms(b, stall_ms);
  for (int pi : stalled) {
    const Path& p = P(b, pi);
    (answered_since(b, pi, p.watch_ms, now - grace) ? out.stalled : out.waiting).push_back(pi);
  }
  return out;
}

// Probes idle usable paths as witnesses for paths held since since_ms,
// once (not again while they stay held): up to two on each rail (two
// source ports, most often two routes), never the carrier (the
// application's work goes there). Each is out of the rotation until its
// probe completes; one that does not, while another answers, fails as
// behind the same fault once a path failed after it went out (Path::witness).
// Returns how many were probed. Under b->lk.
int probe_witnesses(Bundle* b, int64_t since_ms, int64_t now) {
  if (b->witness_ms >= since_ms) return 0;
  b->witness_ms = now;
  int sent = 0;
  for (size_t k = 0; k < rail_count(b); k++) {
    int n = 0;
    for (size_t i = 0; i < b->paths.size() && n < 2; i++) {
      const Path& q = b->paths[i];
      if (q.rail != static_cast<int>(k) || !q.qp || !usable(q) || q.posted != q.done) continue;
      if (static_cast<int>(i) == b->carrier) continue;
      probe(b, static_cast<int>(i));
      b->paths[i].witness = q.probation();
      n += q.probation();
    }
    sent += n;
  }
  return sent;
}

}  // namespace

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
    b->looks++;
    if (!b->active.load() || b->move == Move::gave_up) return 0;
    const Looked first = look_at_paths(b, now, stall_ms, retx_ms, false);
    if (first.stalled.empty() && first.waiting.empty() && first.flapping.empty() && first.unanswered.empty() &&
        !first.suspect && !first.witness_since)
      return 0;
  }
  drain(b);
  After a;
  size_t stalled = 0;
  bool first = false, witnesses = false;
  {
    std::lock_guard l(b->lk);
    const Looked s = look_at_paths(b, now, stall_ms, retx_ms, true);
    stalled = s.stalled.size() + s.waiting.size();
    if (s.witness_since && probe_witnesses(b, s.witness_since, now)) {
      b->witness_probes++;
      witnesses = true;
    }
    if (s.others) {
      for (int pi : s.stalled) path_failed(b, pi, kStalled, &a);
      for (int pi : s.unanswered) path_failed(b, pi, kUnanswered, &a);
      for (int pi : s.flapping) {
        P(b, pi).hiccups.fill(0);  // (its next port starts a count of its own)
        path_failed(b, pi, kFlapping, &a);
      }
      flush_held(b, b->ctx);
    }
    bool all = !s.others && !s.checking && stalled;
    first = all && !b->all_stalled;
    if (first) b->all_stalled_count++;
    b->all_stalled = all;
  }
  if (first) event_all_stalled(b, stalled);
  if (a.down.empty()) {
    if (witnesses) wake_worker(b);  // it polls for probes that are overdue
    return 0;
  }
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
int fail_silent_paths(Bundle* b, const ProbeStats& stats, int64_t now, bool* spared) {
  After a;
  // Work of the path found done at one of the stall watch's last two looks
  // proves that its route carries packets, whatever its probes say: datagrams
  // lost or late behind the path's own traffic in a queue that is full but
  // moving. On four one-CPU soft-RoCE guests running an all-to-all with no
  // fault on a busy host, the application's QP failed so ("its own probes
  // are lost"), and the failover cost the run much of its throughput.
  // A dark route ends the completions at once: its probes are lost a
  // second after their last answer, when the last look that found work
  // done is over half a second old, so it fails as soon as before.
  const int64_t stall_ms = config().num(Param::stall_ms);
  const int64_t proof_ms = 2 * watch_tick_ms(stall_ms);
  auto carrying = [&](const Path& p) { return stall_ms && p.progress_ms && now - p.progress_ms < proof_ms; };
  if (spared) *spared = false;
  {
    std::lock_guard m(b->mu);
    if (b->dead || !b->active.load()) return 0;
    std::lock_guard l(b->lk);
    if (b->move == Move::gave_up) return 0;
    std::vector<int> lost;
    bool others = false;
    // The application's QP is judged like a shadow where its port is known
    // (shunt set its flow label) and probed.
    auto judge = [&](Path& p, int pi) {
      if (p.down() || !p.qp) return;
      auto it = path_sport(p) ? stats.find({p.rail, path_sport(p)}) : stats.end();
      bool known = it != stats.end();
      if (known && it->second.value("alive", false)) p.probe_alive = true;
      const bool probes_lost = known && !it->second.value("alive", false) && p.probe_alive;
      if (probes_lost && !carrying(p)) {
        lost.push_back(pi);
      } else {
        if (probes_lost && spared) *spared = true;
        others |= usable(p);
      }
    };
    judge(b->prim, kPrimary);
    for (size_t i = 0; i < b->paths.size(); i++) judge(b->paths[i], static_cast<int>(i));
    // A failed shadow's port is still probed: once its probes, lost since
    // it failed (or since it was renewed into a dead route and before it
    // failed again), get through again, its route is back, and it is
    // renewed without waiting out its backoff (as when a port comes up;
    // the damping of a flapping path still holds).
    for (auto& p : b->paths) {
      if (!p.down() && !unproven(p.life)) {  // in service
        p.probe_dead = false;
        continue;
      }
      auto it = stats.find({p.rail, path_sport(p)});
      if (it == stats.end()) continue;
      if (!it->second.value("alive", false)) p.probe_dead = true;
      else if (p.probe_dead && p.down()) p.probe_dead = false, b->renew_now.store(true);
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


// A port went down (or the whole device, port 0): every path of every
// bundle on it fails at once, without waiting for a retry timeout or a
// stall. It came back: failed paths are renewed without waiting out their
// backoff. Returns how many bundles it touched.
int on_port_event(const std::string& device, int port, bool up, bool wake) {
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
      if (b->move == Move::gave_up) continue;
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

namespace {

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
      event_port_unwatched(name, errno);
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
    event_port(e.device, ev.event_type, port);
    on_port_event(e.device, port, up);
  }
}

// The watch thread: port events as they come, and a look for stalls every
// SHUNT_STALL_MS/8.
void run_stall_watch() {
  ReentryGuard guard;
  pthread_setname_np(pthread_self(), "shunt-watch");
  const int64_t stall_ms = config().num(Param::stall_ms);
  const int64_t tick = watch_tick_ms(stall_ms);
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
          event_port_channel_closed(e.device);
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

}  // namespace

void start_stall_watch() {
  pid_t me = getpid();
  if (g_watch_pid.load() == me) {
    watch_resync(false);  // a new device may have a bundle now
    return;
  }
  if (g_watch_pid.exchange(me) == me) return;
  if (g_watch_wake >= 0) close(g_watch_wake);  // a forked child's copy of its parent's
  g_watch_wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (!start_job("stall watch", run_stall_watch)) g_watch_pid.store(0);  // the next bundle tries again
}

// Tells the watch that the live bundles changed; with wait, returns once
// it acted on that (1 s at most).
void watch_resync(bool wait) {
  if (g_watch_pid.load() != getpid() || g_watch_wake < 0) return;
  uint64_t mine = g_watch_asked.fetch_add(1) + 1, one = 1;
  (void)!write(g_watch_wake, &one, sizeof one);
  for (int i = 0; wait && i < 1000 && g_watch_seen.load() < mine; i++) usleep(1000);
}

}  // namespace shunt::verbs::bundle
