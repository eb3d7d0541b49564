#include "agent/agent.h"

#include <fcntl.h>
#include <signal.h>
#include <poll.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "agent/control_server.h"
#include "core/event_log.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "core/threads.h"
#include "interpose/stats_sources.h"
#include "interpose/verbs/busy.h"
#include "peer/agent_socket.h"
#include "peer/control.h"
#include "telemetry/retired.h"
#include "telemetry/stats_file.h"

namespace shunt::agent {

void register_builtin_services();  // services.cc

namespace {
using nlohmann::json;

// Nesting of a request (a report is about 8 deep): copying and writing out
// a JSON value recurses once per level.
constexpr int kMaxDepth = 64;

// Exited processes whose last reports stay in members (their series stay in
// /metrics): beyond this many the oldest go. A job that starts processes
// under the preload all week (data loader workers each epoch, tools run
// from the job's shell) would otherwise grow the table, every status and
// every scrape for good.
constexpr size_t kMaxExited = 256;

struct State {
  std::mutex mu;  // registration and start
  std::map<std::string, Handler> commands;
  std::set<std::string> controls;  // commands that change what the agent does
  std::vector<Service> services;
  std::vector<ReportListener> report_listeners;
  std::atomic<bool> started{false};
  std::string dir, sock_path, lock_path;
  int lock_fd = -1, listen_fd = -1;
  std::atomic<bool> is_agent{false};
  json members = json::object();
  peer::ControlServer server;
  int64_t started_ms = 0;
  // This process's reports: numbered, under the time it began reporting
  // (a later process with the same pid has another), and none but the
  // last once it exits.
  std::atomic<uint64_t> report_seq{0};
  int64_t born_ns = mono_ns();  // when this process began reporting
  std::atomic<bool> exiting{false};
  // The agent's own entry in members: built when something reads members,
  // not every report interval (on one-CPU guests a snapshot a second of a
  // process with 48 shadow QPs cost about a tenth of its CPU).
  int64_t own_at_ms = -1;
  uint64_t own_snapshots = 0;
  uint64_t exited_dropped = 0;  // exited members let go (kMaxExited)
  json retired = json::array();  // their counters (telemetry::fold_exited)
};
State& st() {
  static State* s = new State;  // built on first use: see log.cc
  return *s;
}

// Takes the host lock without blocking; on success becomes the agent.
bool try_lock(State& s) {
  if (s.lock_fd < 0) s.lock_fd = open(s.lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (s.lock_fd < 0 || flock(s.lock_fd, LOCK_EX | LOCK_NB) != 0) return false;
  // We hold the lock, so any socket file left there is a dead agent's.
  unlink(s.sock_path.c_str());
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  snprintf(a.sun_path, sizeof a.sun_path, "%s", s.sock_path.c_str());
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0) {
    log::warn("host agent: cannot listen on {}: {}", s.sock_path, strerror(errno));
    if (fd >= 0) ::close(fd);
    flock(s.lock_fd, LOCK_UN);
    return false;
  }
  chmod(s.sock_path.c_str(), 0600);  // this user's and root's alone (each client's uid is checked too)
  s.listen_fd = fd;
  s.server.start(fd);
  s.is_agent.store(true);
  s.started_ms = mono_ms();
  log::info("host agent: serving {}", s.sock_path);
  for (auto& svc : s.services)
    if (svc.start) svc.start();
  return true;
}

// A report to the listeners (agent thread). A listener that throws is one
// listener's fault: the others still run.
void notify(State& s, const std::string& pid, const json& snap) {
  for (auto& l : s.report_listeners) {
    try {
      l(pid, snap);
    } catch (const std::exception& e) {
      log::once(LogLevel::warn, "agent-listener", std::string("host agent: a report listener failed: ") + e.what());
    }
  }
}

// Whether a member's report says its process exited (its last report
// came, or sweep_gone found it gone).
bool exited(const json& m) {
  if (!m.is_object()) return false;
  auto f = m.find("final");
  return f != m.end() && f->is_boolean() && f->get<bool>();
}

// The oldest exited members (by their last report) go while more than
// kMaxExited are kept; their counters stay in retired.
void prune_exited(State& s) {
  size_t n = 0;
  for (const auto& [pid, m] : s.members.items()) n += exited(m);
  while (n > kMaxExited) {
    std::string oldest;
    int64_t at = INT64_MAX;
    for (const auto& [pid, m] : s.members.items()) {
      if (!exited(m)) continue;
      auto r = m.find("reported_ms");
      const int64_t t = r != m.end() && r->is_number_integer() ? r->get<int64_t>() : INT64_MIN;
      if (oldest.empty() || t < at) oldest = pid, at = t;
    }
    telemetry::fold_exited(s.retired, s.members[oldest]);
    s.members.erase(oldest);
    s.exited_dropped++;
    n--;
  }
}

// A report goes into members(), then to the listeners.
void stored(State& s, const std::string& pid, json snap) {
  json& at = s.members[pid];
  at = std::move(snap);
  notify(s, pid, at);
  if (exited(at)) prune_exited(s);
}

// Why a report is not taken ("" when it is): the fields that the agent,
// its listeners and the metrics read must have their types, so a careless
// sender's report cannot make them throw later.
std::string report_problem(const json& req) {
  auto has = [](const json& o, const char* k, bool (json::*is)() const noexcept) {
    auto it = o.find(k);
    return it == o.end() || ((*it).*is)();
  };
  auto pid = req.find("pid");
  if (pid == req.end() || !pid->is_number_integer() || pid->get<int64_t>() < 1 || pid->get<int64_t>() > INT32_MAX)
    return "a report needs a pid (a positive integer)";
  auto snap = req.find("snapshot");
  if (snap == req.end() || !snap->is_object()) return "a report needs a snapshot (an object)";
  if (!has(req, "seq", &json::is_number_unsigned)) return "a report's seq is an unsigned integer";
  if (!has(req, "born", &json::is_number_integer)) return "a report's born is an integer";
  if (!has(req, "final", &json::is_boolean)) return "a report's final is true or false";
  if (!has(*snap, "mode", &json::is_string)) return "a report's mode is a string";
  if (!has(*snap, "verbs", &json::is_object)) return "a report's verbs is an object";
  if (snap->contains("verbs") && !has((*snap)["verbs"], "qps", &json::is_array)) return "a report's verbs.qps is an array";
  for (const char* list : {"sockets", "bundles"}) {
    if (!has(*snap, list, &json::is_array)) return std::string("a report's ") + list + " is an array";
    if (!snap->contains(list)) continue;
    for (const auto& e : (*snap)[list])
      if (!e.is_object()) return std::string("a report's ") + list + " are objects";
  }
  if (snap->contains("sockets"))
    for (const auto& so : (*snap)["sockets"])
      if (!has(so, "peer", &json::is_string) || !has(so, "local", &json::is_string) ||
          !has(so, "open", &json::is_boolean) || !has(so, "upgraded", &json::is_boolean) ||
          !has(so, "tx_bytes", &json::is_number_unsigned) || !has(so, "rx_bytes", &json::is_number_unsigned))
        return "a report's socket has peer and local (strings), open and upgraded (true or false), "
               "tx_bytes and rx_bytes (unsigned integers)";
  return "";
}

// The agent's own process: its full snapshot into members, at most once per
// report interval, when a request is about to read members.
void refresh_own(State& s) {
  const int64_t now = mono_ms();
  if (s.own_at_ms >= 0 && now - s.own_at_ms < config().num(Param::report_interval_ms)) return;
  json snap = telemetry::stats_json();
  snap["reported_ms"] = now;
  snap["final"] = false;
  s.own_at_ms = now;
  s.own_snapshots++;
  stored(s, std::to_string(getpid()), std::move(snap));
}

json take_report(State& s, const json& req, uid_t peer_uid) {
  if (peer_uid != 0 && peer_uid != geteuid()) return {{"error", "reports are taken from this user and root only"}};
  if (std::string why = report_problem(req); !why.empty()) return {{"error", why}};
  json snap = req["snapshot"];
  const std::string pid = std::to_string(req["pid"].get<int64_t>());
  // A process's periodic report and its last one (at exit) travel on two
  // connections and may be read in either order: one overtaken by a later
  // report of the same process is dropped (else an exited process showed
  // as running again, e2e test 50, one run in three on a slow host).
  const uint64_t seq = req.value("seq", uint64_t{0});
  const int64_t born = req.value("born", int64_t{0});
  if (auto it = s.members.find(pid); seq && it != s.members.end() && it->is_object()) {
    auto b = it->find("born"), q = it->find("seq");
    if (b != it->end() && b->is_number_integer() && b->get<int64_t>() == born && q != it->end() &&
        q->is_number_unsigned() && q->get<uint64_t>() >= seq)
      return {{"ok", true}, {"stale", true}};
  }
  snap["reported_ms"] = mono_ms();
  snap["final"] = req.value("final", false);
  snap.erase("lost");  // the agent's to say (sweep_gone), never a sender's
  snap["seq"] = seq;
  snap["born"] = born;
  stored(s, pid, std::move(snap));
  return {{"ok", true}};
}

// One member in `status`: read field by field, each of the type it must
// have or its default (the agent's own report is stored unchecked).
json member_status(const std::string& pid, const json& m) {
  auto get = [&m](const char* k) -> const json* {
    auto it = m.is_object() ? m.find(k) : m.end();
    return it == m.end() ? nullptr : &*it;
  };
  const json *mode = get("mode"), *verbs = get("verbs"), *sockets = get("sockets"), *fin = get("final"),
             *at = get("reported_ms"), *lost = get("lost");
  size_t qps = 0;
  if (verbs && verbs->is_object())
    if (auto q = verbs->find("qps"); q != verbs->end() && q->is_array()) qps = q->size();
  return {{"pid", strtol(pid.c_str(), nullptr, 10)},
          {"mode", mode && mode->is_string() ? mode->get<std::string>() : ""},
          {"qps", qps},
          {"sockets", sockets && sockets->is_array() ? sockets->size() : 0},
          {"exited", fin && fin->is_boolean() && fin->get<bool>()},
          {"lost", lost && lost->is_boolean() && lost->get<bool>()},
          {"report_age_ms", mono_ms() - (at && at->is_number_integer() ? at->get<int64_t>() : 0)}};
}

json handle_request(State& s, const json& req, uid_t peer_uid) {
  if (!req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return {{"error", "a request is an object with a string \"cmd\""}};
  const std::string cmd = req["cmd"];
  if (cmd == "report") return take_report(s, req, peer_uid);
  if ((cmd == "status" || cmd == "members") && s.is_agent.load()) refresh_own(s);
  if (cmd == "status") {
    json m = json::array();
    for (const auto& [pid, snap] : s.members.items()) m.push_back(member_status(pid, snap));
    json services = json::array();
    for (auto& svc : s.services) services.push_back(svc.name);
    return {{"agent_pid", getpid()}, {"version", SHUNT_VERSION}, {"run_dir", s.dir},
            {"uptime_ms", mono_ms() - s.started_ms}, {"services", services}, {"members", m},
            {"own_snapshots", s.own_snapshots}, {"exited_dropped", s.exited_dropped}};
  }
  if (cmd == "members") return {{"members", s.members}};
  auto it = s.commands.find(cmd);
  if (it == s.commands.end()) return {{"error", "unknown command " + cmd}};
  if (s.controls.count(cmd) && peer_uid != 0 && peer_uid != geteuid())
    return {{"error", cmd + " is taken from this user and root only"}};
  return it->second(req);
}

// Every request gets an answer: whatever a request or a command's handler
// throws is the request's error, never the agent thread's end.
json handle(State& s, const json& req, uid_t peer_uid) {
  try {
    return handle_request(s, req, peer_uid);
  } catch (const std::exception& e) {
    const std::string cmd = req.is_object() && req.contains("cmd") && req["cmd"].is_string() ? req["cmd"] : "";
    return {{"error", cmd + (cmd.empty() ? "" : ": ") + e.what()}};
  }
}

// One request line (without its newline) to its answer line. A string
// that is not UTF-8 is written with U+FFFD for its bad bytes: dump() would
// throw.
std::string answer(State& s, const std::string& line, uid_t peer_uid) {
  json ans;
  if (json_nesting(line) > kMaxDepth) {
    ans = {{"error", "a request nests deeper than " + std::to_string(kMaxDepth) + " levels"}};
  } else {
    json req = json::parse(line, nullptr, false);
    ans = req.is_discarded() ? json{{"error", "malformed JSON"}} : handle(s, req, peer_uid);
  }
  return to_text(ans) + "\n";
}

void serve(State& s, int timeout_ms) {
  s.server.serve(timeout_ms, [&s](const std::string& line, uid_t uid) { return answer(s, line, uid); });
}

void report(State& s, bool final) {
  // Numbered before the exit check, and the last report after exiting is
  // set: a periodic report that passes the check is numbered below the
  // last one, and the agent drops it if it comes second. Numbered after
  // the check, one could take a number above the last report's and
  // overtake it: the process then showed as running for good (e2e 54 in a
  // CI run).
  const uint64_t seq = ++s.report_seq;
  if (!final && s.exiting.load()) return;
  if (s.is_agent.load()) {
    // The listeners follow the agent's own sockets every interval (their
    // bytes, their peers); the rest waits for a reader (refresh_own).
    json snap = telemetry::stats_json(telemetry::Detail::sockets);
    snap["final"] = final;
    notify(s, std::to_string(getpid()), snap);
    return;
  }
  json snap = telemetry::stats_json();
  std::string err;
  // The last report (at exit) waits as long as the others: at 300 ms a busy
  // agent missed one in about five runs of e2e test 50 (a process counted
  // as running, its last bytes lost), none in ten at 1 s. An agent that is
  // gone costs nothing (the connect fails at once).
  peer::request(s.sock_path,
                {{"cmd", "report"}, {"pid", getpid()}, {"final", final}, {"seq", seq},
                 {"born", s.born_ns}, {"snapshot", snap}},
                1000, &err);
}

// A member that stopped reporting and whose process is gone (killed, or its
// last report lost on a busy host) is counted as exited, with the counters
// of its last report: it never sends another, and it showed as running for
// good. A member still reporting is never swept (its pid may be of another
// pid namespace, where kill() cannot see it).
void sweep_gone(State& s) {
  const int64_t now = mono_ms();
  const int64_t stale = std::max<int64_t>(2000, 3 * config().num(Param::report_interval_ms));
  const std::string own = std::to_string(getpid());
  for (auto& [pid, m] : s.members.items()) {
    if (pid == own || !m.is_object()) continue;
    if (exited(m)) continue;
    auto at = m.find("reported_ms");
    if (at == m.end() || !at->is_number_integer() || now - at->get<int64_t>() < stale) continue;
    const long p = std::strtol(pid.c_str(), nullptr, 10);
    if (p <= 0 || p > INT_MAX || kill(static_cast<pid_t>(p), 0) == 0 || errno != ESRCH) continue;
    m["final"] = true;
    m["lost"] = true;  // no last report came
    notify(s, pid, m);
  }
  prune_exited(s);
}

void run() {
  ReentryGuard g;  // this thread's own sockets are never counted
  pthread_setname_np(pthread_self(), "shunt-agent");
  State& s = st();
  int64_t interval = config().num(Param::report_interval_ms);
  int64_t next_try = 0, next_report = 0, next_sample = 0;
  for (;;) {
    // Nothing thrown here may end the thread (that would end the process).
    try {
      int64_t now = mono_ms();
      if (!s.is_agent.load() && now >= next_try) {
        next_try = now + 500;
        try_lock(s);
      }
      if (now >= next_sample) next_sample = verbs::busy_next_ms(now, verbs::sample_busy(now), interval);
      if (now >= next_report) {
        next_report = now + interval;
        report(s, false);
        if (s.is_agent.load()) sweep_gone(s);
      }
      // Until the next report, and the next try for the lock while another
      // process holds it (an agent's next_try stays in the past: counting it
      // made this loop wake every millisecond, a fifth of a one-CPU guest).
      // The agent sleeps in poll() until then: a client's connection or
      // request wakes it. (It woke every 100 ms regardless.)
      int64_t due = std::min(next_sample, s.is_agent.load() ? next_report : std::min(next_report, next_try));
      int wait = static_cast<int>(std::max<int64_t>(1, due - mono_ms()));
      if (s.is_agent.load())
        serve(s, wait);
      else
        poll(nullptr, 0, std::min(wait, 500));
    } catch (const std::exception& e) {
      log::once(LogLevel::warn, "agent-loop", std::string("host agent: ") + e.what());
      poll(nullptr, 0, 100);
    }
  }
}

void at_exit_hook() {
  State& s = st();
  // The agent's own entry is kept by its thread; the others send a last one
  // so the agent's totals include everything they did.
  s.exiting = true;
  if (s.started.load() && !s.is_agent.load()) report(s, true);
}

void after_fork_child() {
  // The child has no agent thread. Its copies of the lock and the listening
  // socket must go (closing a copy never releases the parent's lock); it
  // starts its own thread on first use like any process.
  State& s = st();
  if (s.lock_fd >= 0) ::close(s.lock_fd);
  if (s.listen_fd >= 0) ::close(s.listen_fd);
  s.server.forget();
  s.report_seq = 0;
  s.born_ns = mono_ns();  // the child's reports are its own, under the parent's pid no more
  s.lock_fd = s.listen_fd = -1;
  s.is_agent.store(false);
  s.started.store(false);
  s.members = json::object();
  s.own_at_ms = -1;
}

struct ForkSafety {
  ForkSafety() {
    on_fork([] { st().mu.lock(); }, [] { st().mu.unlock(); },
            [] {
              st().mu.unlock();
              after_fork_child();
            });
  }
} g_fork_safety;
}  // namespace

void ensure_started() {
  State& s = st();
  if (s.started.load(std::memory_order_acquire)) return;
  if (current_mode() == Mode::off || config().num(Param::agent) != 0) return;
  // The event log's state is created lazily, on first use. Create it here,
  // on the caller's thread and before the agent thread exists: created by
  // that thread's first report instead, a fork in the middle of it left
  // the child a half-done static initialization, and the child hung at its
  // own first report or at exit (test 14, about 1 run in 40 under load).
  (void)telemetry::event_log_path();
  register_builtin_services();
  // The verbs and socket sections of this process's reports: registered by
  // the library constructor, and here too (a no-op then) for an agent
  // started before it ran (by a socket that another library's constructor
  // opened).
  register_stats_sources();
  ReentryGuard g;
  std::string refused;
  {
    std::lock_guard lk(s.mu);
    if (s.started.load()) return;
    s.started.store(true, std::memory_order_release);
    s.dir = peer::run_dir(config().str(Param::run_dir), &refused);
    s.sock_path = s.dir.empty() ? "" : s.dir + "/agent.sock";
    set_socket_path(s.sock_path);
    s.lock_path = s.dir.empty() ? "" : s.dir + "/agent.lock";
  }
  // Logged with s.mu released: the fork handlers take the log's lock first.
  if (!refused.empty()) log::once(LogLevel::warn, "run-dir-refused", "host agent: " + refused);
  if (s.dir.empty()) {
    if (refused.empty()) log::once(LogLevel::warn, "run-dir", "no usable run directory (SHUNT_RUN_DIR): no host agent");
    return;
  }
  at_exit(at_exit_hook);
  start_thread("host agent", run);
}

bool is_host_agent() { return st().is_agent.load(); }
std::string control_answer_for_test(const std::string& line, unsigned uid) { return answer(st(), line, uid); }
void store_report_for_test(const std::string& pid, json report) { stored(st(), pid, std::move(report)); }

void register_command(const std::string& name, Handler h, Access access) {
  std::lock_guard lk(st().mu);
  st().commands[name] = std::move(h);
  if (access == Access::control) st().controls.insert(name);
}

void register_service(Service svc) {
  std::lock_guard lk(st().mu);
  st().services.push_back(std::move(svc));
}

const json& members() {
  State& s = st();
  if (s.is_agent.load()) refresh_own(s);
  return s.members;
}

const json& members_as_reported() { return st().members; }

uint64_t exited_dropped() { return st().exited_dropped; }

const json& retired() { return st().retired; }

void on_report(ReportListener l) {
  std::lock_guard lk(st().mu);
  st().report_listeners.push_back(std::move(l));
}

}  // namespace shunt::agent
