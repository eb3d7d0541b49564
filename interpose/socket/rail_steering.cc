#include "interpose/socket/rail_steering.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/mptcp.h>
#include <net/if.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "clocksync/engine.h"
#include "core/log.h"
#include "core/roce_rails.h"
#include "core/runtime.h"
#include "interpose/socket/mptcp_pm.h"
#include "interpose/socket/mptcp_upgrade.h"
#include "interpose/socket/subflow_watch.h"

namespace shunt::sock {

namespace {
using nlohmann::json;
using Clock = std::chrono::steady_clock;
constexpr int kTickMs = 50;
constexpr int64_t kQuietDumpMs = 1000;  // the in-band dump while no subflow is busy
constexpr int64_t kFlapWindowMs = 30000;

struct Rail {
  Endpoint addr;               // the port-less endpoint that steering flips
  std::set<std::string> dead;  // probe peers whose path on this rail is dead
  std::set<std::string> seen;  // ... that was alive once (a path not yet up is no failure)
  bool inband_bad = false;
  bool backup = false;
  int64_t good_since = 0, last_restore = -kFlapWindowMs, hold_ms = 0;
  uint64_t failures = 0;
  std::string reason;
};

struct State {
  std::mutex mu;  // held through a tick, netlink round trips included
  bool stopping = false;
  std::thread thread;
  std::vector<Rail> rails;
  bool retry = false;  // a change failed for a reason other than permission
  std::vector<std::string> missing;
  std::string status = "not started";
  bool steering = false;  // endpoints writable
  PathManager pm;
  // The probe engine's path liveness, read every tick; a change pokes the
  // thread (add_path_listener) so that it ticks at once. The poke has a
  // mutex of its own that nothing holds for longer than a flag's write: the
  // listener runs on the engine's thread, and while it waited for `mu`
  // (a tick's endpoint set-up took up to a second on a soft-RoCE guest) the
  // engine sent no probe to any peer, whose paths to this host then died,
  // a bundle's application QP among them, for good.
  clocksync::ProbeEngine* engine = nullptr;
  std::mutex wake_mu;
  std::condition_variable wake_cv;
  bool poke = false;  // under wake_mu
  // What `shuntctl sockets` shows of the rails, copied after each tick: the
  // agent's command took `mu` and so waited out a tick (up to a second of
  // endpoint set-up at start on a soft-RoCE guest).
  std::mutex snap_mu;
  json snap;  // under snap_mu; null until the first copy
};

// Copies the rails' state for sockets_json. Under s.mu.
void publish(State& s) {
  json j = {{"status", s.status}, {"missing", s.missing}};
  json rails = json::array();
  for (size_t i = 0; i < s.rails.size(); i++) {
    const Rail& r = s.rails[i];
    rails.push_back({{"rail", i}, {"addr", r.addr.addr_str()}, {"endpoint_id", r.addr.id}, {"backup", r.backup},
                     {"reason", r.reason}, {"dead_to", std::vector<std::string>(r.dead.begin(), r.dead.end())},
                     {"inband_stalled", r.inband_bad}, {"failures", r.failures}, {"hold_ms", r.hold_ms}});
  }
  j["rails"] = rails;
  std::lock_guard l(s.snap_mu);
  s.snap = std::move(j);
}

void poke(State& s) {
  {
    std::lock_guard w(s.wake_mu);
    s.poke = true;
  }
  s.wake_cv.notify_all();
}
State* g = nullptr;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch()).count();
}

// Whether the host's MPTCP sockets move data: the in-band dump looks for
// stuck subflows, and while no reported socket's byte counts change (a verbs
// job's idle bootstrap connection) there is nothing to find, so the quiet
// dump waits. Until when (ms) the last change counts as activity: two
// reports. The reports' bytes by pid; agent thread only, built on first use
// (the agent thread may report before this library's constructors ran, when
// a socket was made in another library's constructor).
std::atomic<int64_t> g_sockets_busy_until{0};
std::map<std::string, uint64_t>& report_bytes() {
  static auto* m = new std::map<std::string, uint64_t>;
  return *m;
}

void on_member_report(const std::string& pid, const json& report) {
  uint64_t bytes = 0;
  auto it = report.find("sockets");
  if (it != report.end() && it->is_array())
    for (const auto& so : *it)
      if (so.value("open", false) && so.value("upgraded", false))
        bytes += so.value("tx_bytes", uint64_t{0}) + so.value("rx_bytes", uint64_t{0});
  uint64_t& seen = report_bytes()[pid];
  const bool moved = bytes != seen;
  seen = bytes;
  if (report.value("final", false)) report_bytes().erase(pid);
  if (!moved) return;
  const int64_t now = now_ms();
  const bool was = g_sockets_busy_until.exchange(now + 2 * config().num(Param::report_interval_ms)) > now;
  if (!was && g) poke(*g);  // busy again: dump now
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i <= s.size()) {
    size_t j = s.find_first_of(", ", i);
    if (j == std::string::npos) j = s.size();
    if (j > i) out.push_back(s.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::vector<std::string> rail_addrs() {
  const Config& c = config();
  // Rails are named or are the RoCE ports' (probe_rails), never every
  // interface by default: a host's management interface is no rail, and
  // its MPTCP endpoints are the administrator's.
  const std::string& named = c.str(Param::socket_rails);
  if (named == "none") return {};
  if (named != "auto") {
    if (!named.empty()) return split(named);
    return probe_rails(c).addrs;
  }
  std::vector<std::pair<unsigned, std::string>> found;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return {};
  for (ifaddrs* i = ifa; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    if ((i->ifa_flags & IFF_LOOPBACK) || !(i->ifa_flags & IFF_UP)) continue;
    char buf[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, buf, sizeof buf);
    found.emplace_back(if_nametoindex(i->ifa_name), buf);
  }
  freeifaddrs(ifa);
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(f.second);
  return out;
}

constexpr int64_t kAssertMs = 1000;
constexpr int64_t kIdleAssertMs = 5000;  // while no socket moves data
// The join listener's port may still be held by TIME-WAIT subflows of an
// earlier job (the kernel's listener cannot reuse it: EADDRINUSE); the port
// is announced, so the next free one does as well.
constexpr int kJoinPortTries = 16;

bool same_addr(const Endpoint& a, const Endpoint& b) {
  return a.family == b.family && memcmp(&a.addr, &b.addr, a.family == AF_INET ? 4 : 16) == 0;
}

// One failed change: a missing permission leaves the configured state (and
// lists the command); anything else is retried on the next check.
void failed(State& s, const std::string& cmd, const std::string& err) {
  if (s.pm.last_errno() == EPERM || s.pm.last_errno() == EACCES) {
    if (std::find(s.missing.begin(), s.missing.end(), cmd) == s.missing.end()) s.missing.push_back(cmd);
    return;
  }
  s.retry = true;
  log::once(LogLevel::warn, "mptcp-add:" + cmd, "sockets: `" + cmd + "` failed (" + err + "); retrying");
}

// The limits before shunt raised them, by whichever raised them first in this
// process (prepare_limits or the agent), so the agent puts them back at exit.
std::mutex g_limits_mu;
bool g_limits_saved = false;
uint32_t g_old_limits[2] = {0, 0};

// Raises the limits to n subflows and n accepted announcements where lower.
// False (with *err, and the command that would do it in *cmd) when they
// could not be set.
bool raise_limits(PathManager& pm, uint32_t n, bool log_raise, std::string* err, std::string* cmd = nullptr) {
  uint32_t sub = 0, acc = 0;
  if (!pm.get_limits(&sub, &acc, err)) return true;  // no limits to read: nothing to do
  if (sub >= n && acc >= n) return true;
  uint32_t want_sub = std::max(sub, n), want_acc = std::max(acc, n);
  if (!pm.set_limits(want_sub, want_acc, err)) {
    if (cmd)
      *cmd = "ip mptcp limits set subflows " + std::to_string(want_sub) + " add_addr_accepted " + std::to_string(want_acc);
    return false;
  }
  std::lock_guard l(g_limits_mu);
  if (!g_limits_saved) {
    g_old_limits[0] = sub;
    g_old_limits[1] = acc;
    g_limits_saved = true;
  }
  if (log_raise) log::info("sockets: MPTCP limits were {}/{}: raised again", sub, acc);
  return true;
}

// Makes the endpoints and limits the rails need exist, now and whenever
// someone removed them (an `ip mptcp endpoint flush`, another tool): the
// rail endpoints keep their backup state, the signal endpoints come back.
void assert_endpoints(State& s, bool first) {
  std::string err;
  s.retry = false;
  uint32_t n = static_cast<uint32_t>(std::min<size_t>(s.rails.size(), 8));
  // Limits first: a peer's announcement that arrives before them is dropped
  // for good by this connection.
  std::string cmd;
  if (!raise_limits(s.pm, n, !first, &err, &cmd)) failed(s, cmd, err);
  std::vector<Endpoint> have;
  if (!s.pm.endpoints(&have, &err)) {
    s.retry = true;
    return;
  }
  auto find = [&](const Endpoint& want, bool signal) -> const Endpoint* {
    for (auto& e : have)
      if (same_addr(e, want) && (signal ? (e.flags & MPTCP_PM_ADDR_FLAG_SIGNAL) && e.port : e.port == 0)) return &e;
    return nullptr;
  };
  uint16_t port = static_cast<uint16_t>(config().num(Param::mptcp_join_port));
  bool added = false;
  for (size_t i = 0; i < s.rails.size(); i++) {
    Rail& r = s.rails[i];
    Endpoint want = r.addr;
    want.id = 0;
    want.port = 0;
    want.flags = 0;
    if (!find(want, false)) {
      if (s.pm.add(want, &err)) {
        added = true;
        if (!first) log::info("sockets: MPTCP endpoint {} was gone: added again", want.addr_str());
      } else {
        failed(s, want.ip_command(), err);
      }
    }
    if (i == 0) continue;
    Endpoint sig = want;
    sig.flags = MPTCP_PM_ADDR_FLAG_SIGNAL;
    if (find(sig, true)) continue;
    bool ok = false;
    for (int t = 0; t < kJoinPortTries && !ok; t++) {
      sig.port = static_cast<uint16_t>(port + t);
      ok = s.pm.add(sig, &err);
      if (!ok && s.pm.last_errno() != EADDRINUSE) break;
    }
    if (ok) {
      added = true;
      if (!first || sig.port != port)
        log::info("sockets: signal endpoint {} port {} added{}", sig.addr_str(), sig.port,
                  sig.port != port ? " (join port " + std::to_string(port) + " still in use)" : "");
    } else {
      sig.port = port;
      failed(s, sig.ip_command(), err);
    }
  }
  if (added && !s.pm.endpoints(&have, &err)) return;
  for (auto& r : s.rails) {
    Endpoint want = r.addr;
    want.port = 0;
    const Endpoint* e = find(want, false);
    if (!e) continue;
    bool flagged = (e->flags & MPTCP_PM_ADDR_FLAG_BACKUP) != 0;
    r.addr = *e;
    // At start, a backup flag is stale (an agent that exited during a
    // failure); later, an endpoint that came back must keep the rail's state.
    bool want_backup = first ? false : r.backup;
    if (flagged != want_backup && !s.pm.set_backup(r.addr, want_backup, &err)) failed(s, "set backup", err);
  }
}

void setup(State& s) {
  std::vector<std::string> addrs = rail_addrs();
  std::string err;
  if (addrs.empty()) {
    s.status = "no rails (SHUNT_SOCKET_RAILS, SHUNT_PROBE_ADDRS, no active RoCE port): MPTCP endpoints left as they are";
    return;
  }
  if (!s.pm.open(&err)) {
    s.status = err;
    log::once(LogLevel::warn, "mptcp-pm", "sockets: " + err + ": subflows only as the kernel's own settings give");
    return;
  }
  for (auto& a : addrs) {
    Rail r;
    if (!parse_addr(a, &r.addr)) {
      log::error("sockets: rail address '{}' is no IP address", a);
      continue;
    }
    s.rails.push_back(r);
  }
  assert_endpoints(s, true);
  s.steering = s.missing.empty();
  s.status = !s.missing.empty() ? "incomplete" : s.retry ? "retrying" : "ok";
  if (!s.missing.empty()) {
    std::string cmds;
    for (auto& m : s.missing) cmds += "; " + m;
    log::once(LogLevel::warn, "mptcp-missing",
              "sockets: cannot set the MPTCP endpoints (needs CAP_NET_ADMIN); using what is configured. "
              "To give every rail a subflow run as root (also in `shuntctl sockets`): " + cmds.substr(2));
  }
  log::info("sockets: {} rails, MPTCP endpoints {}", s.rails.size(), s.status);
}

void set_backup(State& s, Rail& r, bool backup, const std::string& why) {
  std::string err;
  if (s.steering && !s.pm.set_backup(r.addr, backup, &err)) {
    log::once(LogLevel::warn, "mptcp-setflags", "sockets: cannot mark a rail backup: " + err);
    return;
  }
  r.backup = backup;
  if (backup) {
    r.failures++;
    r.reason = why;
    log::info("sockets: rail {} failing ({}): marked backup", r.addr.addr_str(), why);
  } else {
    log::info("sockets: rail {} healthy for {} ms: restored", r.addr.addr_str(), r.hold_ms);
    r.reason.clear();
  }
}

// One look: the probes' verdicts, and the subflows' health where `inband`
// (a sock_diag dump; without it a rail keeps its last in-band verdict).
// Returns whether the next look should dump again at once
// (look_again_soon).
bool tick(State& s, bool inband) {
  std::vector<AddrHealth> health;
  std::string err;
  if (inband) {
    std::vector<in6_addr> addrs;
    for (auto& r : s.rails) addrs.push_back(r.addr.addr);
    if (!s.rails.empty() && !subflow_health(addrs, s.rails[0].addr.family, &health, &err)) health.clear();
  }
  if (s.engine) {
    for (auto& r : s.rails) r.dead.clear();
    // Liveness only: the full report() sorted every path's delays 20 times
    // a second, a cost a one-CPU soft-RoCE guest's throughput showed.
    for (const auto& [peer, alive] : s.engine->rails_alive())
      for (size_t i = 0; i < alive.size() && i < s.rails.size(); i++)
        if (alive[i]) s.rails[i].seen.insert(peer);
        else if (s.rails[i].seen.count(peer)) s.rails[i].dead.insert(peer);
  }
  int64_t now = now_ms();
  int64_t base = config().num(Param::rail_restore_ms);
  for (size_t i = 0; i < s.rails.size(); i++) {
    Rail& r = s.rails[i];
    // In-band: every busy subflow of the rail stuck. Once the rail is
    // backup it carries nothing new, so a clean dump does not prove health;
    // the hold time and its doubling do the rest.
    if (i < health.size()) r.inband_bad = health[i].busy > 0 && health[i].stalled == health[i].busy;
    bool bad = !r.dead.empty() || r.inband_bad;
    if (bad) {
      r.good_since = 0;
      if (!r.backup) {
        r.hold_ms = now - r.last_restore < kFlapWindowMs ? std::min(std::max(r.hold_ms, base) * 2, base * 32) : base;
        set_backup(s, r, true, !r.dead.empty() ? "probes lost" : "subflows stalled");
      }
    } else if (r.backup) {
      // A subflow still in RTO backoff would take new data and sit on it
      // until its next retransmission: wait until the rail's subflows are
      // moving again (or idle) before giving it traffic back.
      if (i < health.size() && (health[i].stalled > 0 || health[i].backing_off > 0)) {
        r.good_since = 0;
        continue;
      }
      if (!r.good_since) r.good_since = now;
      if (now - r.good_since >= r.hold_ms) {
        set_backup(s, r, false, "");
        r.last_restore = now;
      }
    }
  }
  std::vector<RailLook> looks(s.rails.size());
  for (size_t i = 0; i < s.rails.size(); i++) {
    looks[i].backup = s.rails[i].backup;
    looks[i].probes_dead = !s.rails[i].dead.empty();
    if (i < health.size()) looks[i].health = health[i];
  }
  return look_again_soon(looks);
}

void run(State& s) {
  pthread_setname_np(pthread_self(), "shunt-rails");
  ReentryGuard guard;
  bool inband = config().num(Param::rail_inband) == 0;
  std::unique_lock lk(s.mu);
  int64_t next_assert = now_ms() + kAssertMs, next_dump = 0;
  while (!s.stopping) {
    // The endpoints are checked every second while the host's sockets move
    // data (or a change is being retried), every 5 s while they are idle,
    // and at once when they start moving again.
    // What falls due within a tick of now is done now: the endpoint check
    // and the quiet dump (both every second while sockets move data) share
    // a wakeup instead of taking one each a few ms apart.
    const bool idle = now_ms() >= g_sockets_busy_until.load();
    if (!idle && next_assert > now_ms() + kAssertMs) next_assert = now_ms();
    if (now_ms() + kTickMs > next_assert) {
      assert_endpoints(s, false);
      if (s.status != "incomplete") s.status = s.retry ? "retrying" : "ok";
      next_assert = now_ms() + (idle && !s.retry ? kIdleAssertMs : kAssertMs);
    }
    // While no subflow is busy, dump every kQuietDumpMs only: a dump every
    // tick cost a one-CPU soft-RoCE guest running a verbs job (its sockets
    // idle) about 2% of its CPU. A subflow that gets busy cannot be judged
    // stuck before kStallMs (subflow_watch.cc) anyway. And not at all while
    // no process's reports show its sockets' bytes moving (a report that
    // does pokes this thread), after one dump that found nothing busy.
    bool dump = inband && now_ms() + kTickMs > next_dump && (next_dump == 0 || !idle);
    bool moving = tick(s, dump);
    if (moving) next_dump = 0;
    else if (dump) next_dump = now_ms() + kQuietDumpMs;
    // Every tick while something moves (a busy subflow, a rail held as
    // backup); otherwise only for the next dump or endpoint check, or when
    // the probe engine pokes: 20 ticks a second cost a one-CPU soft-RoCE
    // guest running a verbs job (idle sockets) 3-4% of its CPU.
    int64_t wait = kTickMs;
    if (!moving) {
      int64_t due = inband && !idle ? std::min(next_assert, next_dump) : next_assert;
      wait = std::clamp<int64_t>(due - now_ms(), kTickMs, kIdleAssertMs);
    }
    publish(s);
    lk.unlock();
    {
      std::unique_lock w(s.wake_mu);
      s.wake_cv.wait_for(w, std::chrono::milliseconds(wait), [&] { return s.poke; });
      s.poke = false;
    }
    lk.lock();
  }
  for (auto& r : s.rails)
    if (r.backup) set_backup(s, r, false, "");
}

void start(const std::function<clocksync::ProbeEngine*()>& engine) {
  if (current_mode() != Mode::active || sockets_mode() != SocketsMode::mptcp) return;
  auto* s = new State;
  g = s;
  if (config().num(Param::mptcp_endpoints) != 0) {
    std::lock_guard lk(s->mu);
    s->status = "off (SHUNT_MPTCP_ENDPOINTS)";
    publish(*s);
    return;
  }
  {
    std::lock_guard lk(s->mu);
    setup(*s);
    publish(*s);
    if (s->rails.empty() || !s->steering) return;
    s->engine = engine ? engine() : nullptr;
  }
  // The listener only pokes (never s->mu: see State). The state is never
  // freed, so the listener may outlive stop().
  if (s->engine)
    s->engine->add_path_listener([s](const clocksync::PathEvent&) { poke(*s); });
  std::lock_guard lk(s->mu);
  s->thread = std::thread(run, std::ref(*s));
}

void stop() {
  State* s = g;
  if (!s) return;
  {
    std::lock_guard lk(s->mu);
    s->stopping = true;
  }
  poke(*s);
  if (s->thread.joinable()) s->thread.join();
  std::string err;
  {
    std::lock_guard l(g_limits_mu);
    if (g_limits_saved) s->pm.set_limits(g_old_limits[0], g_old_limits[1], &err);
  }
}

json endpoint_json(const Endpoint& e) {
  return {{"id", e.id}, {"addr", e.addr_str()}, {"port", e.port}, {"flags", e.flags},
          {"signal", (e.flags & MPTCP_PM_ADDR_FLAG_SIGNAL) != 0}, {"backup", (e.flags & MPTCP_PM_ADDR_FLAG_BACKUP) != 0}};
}

json sockets_json() {
  json j = {{"sockets_mode", sockets_mode() == SocketsMode::mptcp ? "mptcp" : "observe"},
            {"upgraded_in_agent_process", upgraded_count()}};
  State* s = g;
  if (!s) {
    j["status"] = "off";
    return j;
  }
  {
    std::lock_guard l(s->snap_mu);
    if (s->snap.is_null()) {
      j["status"] = "starting";
      j["missing"] = json::array();
      j["rails"] = json::array();
    } else {
      j.update(s->snap);
    }
  }
  // The kernel's endpoints and limits on a netlink socket of this call's
  // own (the rail thread's is the thread's).
  PathManager pm;
  std::vector<Endpoint> eps;
  std::string err;
  json ej = json::array();
  if (pm.open(&err) && pm.endpoints(&eps, &err))
    for (auto& e : eps) ej.push_back(endpoint_json(e));
  j["endpoints"] = ej;
  uint32_t sub = 0, acc = 0;
  if (pm.get_limits(&sub, &acc, &err)) j["limits"] = {{"subflows", sub}, {"add_addr_accepted", acc}};
  return j;
}
}  // namespace

void prepare_limits() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Only where an agent keeps the endpoints (and puts the limits back).
    if (current_mode() != Mode::active || sockets_mode() != SocketsMode::mptcp ||
        config().num(Param::mptcp_endpoints) != 0 || config().num(Param::agent) != 0)
      return;
    size_t n = rail_addrs().size();
    if (n < 2) return;
    PathManager pm;
    std::string err;
    if (!pm.open(&err) || !raise_limits(pm, static_cast<uint32_t>(std::min<size_t>(n, 8)), false, &err))
      log::once(LogLevel::info, "mptcp-prepare-limits", "sockets: MPTCP limits not raised before the first connection: " + err);
  });
}

RailService rail_service(std::function<clocksync::ProbeEngine*()> engine) {
  return {[engine] { start(engine); }, stop, sockets_json, on_member_report};
}

}  // namespace shunt::sock
