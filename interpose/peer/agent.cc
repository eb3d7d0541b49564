#include "interpose/peer/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "interpose/core/log.h"
#include "interpose/core/mono.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/control.h"
#include "telemetry/event_log.h"
#include "telemetry/stats_file.h"

namespace shunt::agent {

void register_builtin_services();  // services.cc

namespace {
using nlohmann::json;

struct Client {
  int fd;
  std::string buf;
};

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
  std::vector<Client> clients;
  int64_t started_ms = 0;
  // This process's reports: numbered, under the time it began reporting
  // (a later process with the same pid has another), and none but the
  // last once it exits.
  std::atomic<uint64_t> report_seq{0};
  int64_t born_ns = mono_ns();  // when this process began reporting
  std::atomic<bool> exiting{false};
};
State& st() {
  static State* s = new State;  // built on first use: see log.cc
  return *s;
}

// Takes the host lock without blocking; on success becomes the agent.
bool try_lock(State& s) {
  if (s.lock_fd < 0) s.lock_fd = open(s.lock_path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
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
  chmod(s.sock_path.c_str(), 0666);  // reading needs no privilege; reports are checked by uid
  s.listen_fd = fd;
  s.is_agent.store(true);
  s.started_ms = mono_ms();
  log::info("host agent: serving {}", s.sock_path);
  for (auto& svc : s.services)
    if (svc.start) svc.start();
  return true;
}

// A report goes into members(), then to the listeners (agent thread).
void stored(State& s, const std::string& pid, json snap) {
  json& at = s.members[pid];
  at = std::move(snap);
  for (auto& l : s.report_listeners) l(pid, at);
}

json handle(State& s, const json& req, uid_t peer_uid) {
  if (!req.is_object() || !req.contains("cmd") || !req["cmd"].is_string())
    return {{"error", "a request is an object with a string \"cmd\""}};
  std::string cmd = req["cmd"];
  if (cmd == "report") {
    if (peer_uid != 0 && peer_uid != getuid()) return {{"error", "reports are taken from this user and root only"}};
    if (!req.contains("pid") || !req["pid"].is_number_integer() || !req.contains("snapshot"))
      return {{"error", "report needs pid and snapshot"}};
    json snap = req["snapshot"];
    const std::string pid = std::to_string(req["pid"].get<long>());
    // A process's periodic report and its last one (at exit) travel on two
    // connections and may be read in either order: one overtaken by a later
    // report of the same process is dropped (else an exited process showed
    // as running again, e2e test 50, one run in three on a slow host).
    const uint64_t seq = req.value("seq", uint64_t{0});
    const int64_t born = req.value("born", int64_t{0});
    if (auto it = s.members.find(pid); seq && it != s.members.end() && it->value("born", int64_t{0}) == born &&
                                       it->value("seq", uint64_t{0}) >= seq)
      return {{"ok", true}, {"stale", true}};
    snap["reported_ms"] = mono_ms();
    snap["final"] = req.value("final", false);
    snap["seq"] = seq;
    snap["born"] = born;
    stored(s, pid, std::move(snap));
    return {{"ok", true}};
  }
  if (cmd == "status") {
    json m = json::array();
    for (auto& [pid, snap] : s.members.items())
      m.push_back({{"pid", std::stol(pid)},
                   {"mode", snap.value("mode", "")},
                   {"qps", snap.contains("verbs") ? snap["verbs"]["qps"].size() : 0},
                   {"sockets", snap.contains("sockets") ? snap["sockets"].size() : 0},
                   {"exited", snap.value("final", false)},
                   {"report_age_ms", mono_ms() - snap.value("reported_ms", int64_t{0})}});
    json services = json::array();
    for (auto& svc : s.services) services.push_back(svc.name);
    return {{"agent_pid", getpid()}, {"version", SHUNT_VERSION}, {"run_dir", s.dir},
            {"uptime_ms", mono_ms() - s.started_ms}, {"services", services}, {"members", m}};
  }
  if (cmd == "members") return {{"members", s.members}};
  auto it = s.commands.find(cmd);
  if (it == s.commands.end()) return {{"error", "unknown command " + cmd}};
  if (s.controls.count(cmd) && peer_uid != 0 && peer_uid != getuid())
    return {{"error", cmd + " is taken from this user and root only"}};
  try {
    return it->second(req);
  } catch (const std::exception& e) {
    return {{"error", std::string(cmd) + ": " + e.what()}};
  }
}

void serve(State& s, int timeout_ms) {
  std::vector<pollfd> fds{{s.listen_fd, POLLIN, 0}};
  for (auto& c : s.clients) fds.push_back({c.fd, POLLIN, 0});
  if (poll(fds.data(), fds.size(), timeout_ms) <= 0) return;
  if (fds[0].revents & POLLIN) {
    for (int c; (c = ::accept4(s.listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0;)
      if (s.clients.size() < 256) s.clients.push_back({c, ""});
      else ::close(c);
  }
  for (size_t i = 1; i < fds.size(); i++) {
    if (!fds[i].revents) continue;
    Client& c = s.clients[i - 1];
    char buf[65536];
    ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    bool drop = r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR);
    if (r > 0) c.buf.append(buf, static_cast<size_t>(r));
    size_t nl;
    while (!drop && (nl = c.buf.find('\n')) != std::string::npos) {
      std::string line = c.buf.substr(0, nl);
      c.buf.erase(0, nl + 1);
      ucred cred{};
      socklen_t cl = sizeof cred;
      getsockopt(c.fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl);
      json req = json::parse(line, nullptr, false);
      json ans = req.is_discarded() ? json{{"error", "malformed JSON"}} : handle(s, req, cred.uid);
      drop = !peer::write_all(c.fd, ans.dump() + "\n", 1000);
    }
    if (c.buf.size() > peer::kMaxLine) {
      log::warn("host agent: dropped a client sending a line over {} bytes", peer::kMaxLine);
      drop = true;
    }
    if (drop) {
      ::close(c.fd);
      c.fd = -1;
    }
  }
  std::erase_if(s.clients, [](const Client& c) { return c.fd < 0; });
}

void report(State& s, bool final) {
  if (!final && s.exiting.load()) return;
  json snap = telemetry::stats_json();
  if (s.is_agent.load()) {
    snap["reported_ms"] = mono_ms();
    snap["final"] = final;
    stored(s, std::to_string(getpid()), std::move(snap));
    return;
  }
  std::string err;
  // The last report (at exit) waits as long as the others: at 300 ms a busy
  // agent missed one in about five runs of e2e test 50 (a process counted
  // as running, its last bytes lost), none in ten at 1 s. An agent that is
  // gone costs nothing (the connect fails at once).
  peer::request(s.sock_path,
                {{"cmd", "report"}, {"pid", getpid()}, {"final", final}, {"seq", ++s.report_seq},
                 {"born", s.born_ns}, {"snapshot", snap}},
                1000, &err);
}

void run() {
  ReentryGuard g;  // this thread's own sockets are never counted
  pthread_setname_np(pthread_self(), "shunt-agent");
  State& s = st();
  int64_t interval = config().num(Param::report_interval_ms);
  int64_t next_try = 0, next_report = 0;
  for (;;) {
    int64_t now = mono_ms();
    if (!s.is_agent.load() && now >= next_try) {
      try_lock(s);
      next_try = now + 500;
    }
    if (now >= next_report) {
      report(s, false);
      next_report = now + interval;
    }
    // Until the next report, and the next try for the lock while another
    // process holds it (an agent's next_try stays in the past: counting it
    // made this loop wake every millisecond, a fifth of a one-CPU guest).
    // The agent sleeps in poll() until then: a client's connection or
    // request wakes it. (It woke every 100 ms regardless.)
    int64_t due = s.is_agent.load() ? next_report : std::min(next_report, next_try);
    int wait = static_cast<int>(std::max<int64_t>(1, due - mono_ms()));
    if (s.is_agent.load())
      serve(s, wait);
    else
      poll(nullptr, 0, std::min(wait, 500));
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
  for (auto& c : s.clients) ::close(c.fd);
  s.clients.clear();
  s.report_seq = 0;
  s.born_ns = mono_ns();  // the child's reports are its own, under the parent's pid no more
  s.lock_fd = s.listen_fd = -1;
  s.is_agent.store(false);
  s.started.store(false);
  s.members = json::object();
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
  std::lock_guard lk(s.mu);
  if (s.started.load()) return;
  s.started.store(true, std::memory_order_release);
  ReentryGuard g;
  s.dir = peer::run_dir(config().str(Param::run_dir));
  if (s.dir.empty()) {
    log::once(LogLevel::warn, "run-dir", "no usable run directory (SHUNT_RUN_DIR): no host agent");
    return;
  }
  s.sock_path = s.dir + "/agent.sock";
  s.lock_path = s.dir + "/agent.lock";
  at_exit(at_exit_hook);
  std::thread(run).detach();
}

bool is_host_agent() { return st().is_agent.load(); }
std::string socket_path() { return st().sock_path; }

void register_command(const std::string& name, Handler h, Access access) {
  std::lock_guard lk(st().mu);
  st().commands[name] = std::move(h);
  if (access == Access::control) st().controls.insert(name);
}

void register_service(Service svc) {
  std::lock_guard lk(st().mu);
  st().services.push_back(std::move(svc));
}

const json& members() { return st().members; }

void on_report(ReportListener l) {
  std::lock_guard lk(st().mu);
  st().report_listeners.push_back(std::move(l));
}

}  // namespace shunt::agent
