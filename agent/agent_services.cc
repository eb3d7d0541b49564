#include "agent/agent_services.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "agent/agent.h"
#include "agent/diagnose_service.h"
#include "clocksync/engine.h"
#include "core/event_log.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "core/threads.h"
#include "peer/agent_socket.h"
#include "peer/control.h"
#include "telemetry/http_server.h"
#include "telemetry/metrics.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;

// Never destroyed: the metrics thread may call it while exit() runs the
// static destructors.
std::function<clocksync::ProbeEngine*()>& engine_fn() {
  static auto* f = new std::function<clocksync::ProbeEngine*()>;
  return *f;
}
std::atomic<bool> g_stop{false};
int64_t g_started_ns = 0;

// Agent thread: the whole view, for the metrics thread and shuntctl.
json telemetry_command(const json&) {
  HostView v;
  v.members = agent::members();
  v.peers = peers_view(engine_fn() ? engine_fn()() : nullptr);
  v.agent_pid = getpid();
  v.uptime_s = static_cast<double>(mono_ns() - g_started_ns) * 1e-9;
  v.diagnosis = diagnosis_now();
  v.exited_dropped = agent::exited_dropped();
  v.retired = agent::retired();
  json out = host_view_json(v);
  out["event_log"] = valid_utf8(event_log_path());
  return out;
}

std::string scrape(std::string* err) {
  auto ans = peer::request(agent::socket_path(), {{"cmd", "telemetry"}}, 2000, err);
  if (!ans) return "";
  if (ans->contains("error")) {
    const json& e = (*ans)["error"];
    *err = e.is_string() ? e.get<std::string>() : to_text(e);
    return "";
  }
  // The metrics thread's edge: nothing from the answer may end the process.
  try {
    return render_metrics(host_view_from(*ans));
  } catch (const std::exception& e) {
    *err = std::string("cannot render the agent's answer: ") + e.what();
    return "";
  }
}

bool write_textfile(const std::string& path) {
  std::string err, text = scrape(&err);
  if (text.empty()) return false;
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    log::once(LogLevel::warn, "metrics-textfile",
              fmt::format("SHUNT_METRICS_TEXTFILE: cannot write {}: {}", tmp, strerror(errno)));
    return false;
  }
  bool ok = true;
  for (size_t off = 0; ok && off < text.size();) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) off += static_cast<size_t>(n);
  }
  ok = ::close(fd) == 0 && ok;
  // The rename replaces the file at once: a reader sees the old one or the new one, whole.
  if (!ok || rename(tmp.c_str(), path.c_str()) != 0) {
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

HttpAnswer answer_http(const std::string&, const std::string& path) {
  if (path == "/metrics") {
    std::string err, body = scrape(&err);
    if (body.empty()) return {"503 Service Unavailable", "text/plain", "no answer from the agent: " + err + "\n"};
    return {"200 OK", "text/plain; version=0.0.4; charset=utf-8", body};
  }
  if (path == "/") return {"200 OK", "text/plain", "shunt host agent: metrics at /metrics\n"};
  return {"404 Not Found", "text/plain", "not found\n"};
}

// One listening socket for an address getaddrinfo gave; -1 and errno when not.
int listen_one(const addrinfo& ai) {
  // Non-blocking: a client that goes between poll and accept must not park
  // the loop in accept (the textfile would stop being written too).
  int fd = ::socket(ai.ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return -1;
  int one = 1, zero = 0;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  // ":PORT" binds "::" for IPv4 too, as a Prometheus exporter's ":PORT" does.
  if (ai.ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
  if (::bind(fd, ai.ai_addr, ai.ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
    int e = errno;
    ::close(fd);
    errno = e;
    return -1;
  }
  return fd;
}

int listen_on(const std::string& text) {
  std::string host;
  int port = 0;
  if (!parse_listen_addr(text, &host, &port)) {
    log::warn("SHUNT_METRICS_ADDR: '{}' is not HOST:PORT, :PORT or [IPV6]:PORT", text);
    return -1;
  }
  addrinfo hints{}, *res = nullptr;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res); rc != 0) {
    log::warn("metrics: cannot listen on {}: {}", text, gai_strerror(rc));
    return -1;
  }
  // The wildcard's IPv6 form first: it takes IPv4 clients too.
  std::vector<const addrinfo*> order;
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET6 && host.empty()) order.push_back(a);
  for (const addrinfo* a = res; a; a = a->ai_next)
    if (a->ai_family == AF_INET || (a->ai_family == AF_INET6 && !host.empty())) order.push_back(a);
  int fd = -1, err = EADDRNOTAVAIL;
  for (const addrinfo* a : order) {
    if ((fd = listen_one(*a)) >= 0) break;
    err = errno;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    // Another job's agent on this host may hold the port: then this job has
    // no endpoint of its own, which its operator needs to hear.
    log::warn("metrics: cannot listen on {}: {}{}; this agent serves no /metrics (set SHUNT_METRICS_ADDR)", text,
              strerror(err), err == EADDRINUSE ? " (another process, perhaps another job's agent, holds it)" : "");
    return -1;
  }
  log::info("metrics: serving http://{}/metrics", text);
  return fd;
}

void metrics_loop(std::string addr, std::string textfile, int64_t interval_ms) {
  ReentryGuard g;  // the endpoint's own sockets are never counted
  pthread_setname_np(pthread_self(), "shunt-metrics");
  int lfd = addr.empty() || addr == "off" ? -1 : listen_on(addr);
  std::unique_ptr<HttpServer> http;
  if (lfd >= 0) http = std::make_unique<HttpServer>(lfd, answer_http, HttpServer::Limits{});
  int64_t next_file = mono_ns();
  while (!g_stop.load()) {
    if (!textfile.empty() && mono_ns() >= next_file) {
      write_textfile(textfile);
      next_file = mono_ns() + interval_ms * 1'000'000;
    }
    // Until the next textfile, a client, or a second (the stop flag):
    // not every 100 ms as it did, idle wakeups being CPU a one-CPU guest's
    // job does not get.
    int wait = 1000;
    if (!textfile.empty()) wait = static_cast<int>(std::clamp<int64_t>((next_file - mono_ns()) / 1'000'000 + 1, 1, 1000));
    if (http) http->serve(wait);
    else poll(nullptr, 0, wait);
  }
  http.reset();
  if (lfd >= 0) ::close(lfd);
}

void on_path(const clocksync::ProbeEngine* e, const clocksync::PathEvent& ev) {
  std::string local, remote;
  const auto& la = e->config().local_addrs;
  if (ev.path >= 0 && static_cast<size_t>(ev.path) < la.size()) local = la[ev.path];
  std::vector<clocksync::PeerSpec> specs;
  std::string err;
  clocksync::parse_peers(config().str(Param::peers), &specs, &err);
  for (auto& s : specs)
    if (s.name == ev.peer && static_cast<size_t>(ev.path) < s.addrs.size()) remote = s.addrs[ev.path];
  std::string path = local + "->" + remote;
  event(ev.alive ? "path_up" : "path_down",
        {{"peer", ev.peer.c_str()}, {"rail", ev.path}, {"path", path.c_str()}, {"engine_ns", static_cast<long long>(ev.at)}});
}

void start() {
  g_started_ns = mono_ns();
  start_event_log();
  if (auto* e = engine_fn() ? engine_fn()() : nullptr)
    e->on_path_change([e](const clocksync::PathEvent& ev) { on_path(e, ev); });
  const Config& c = config();
  std::string addr = c.str(Param::metrics_addr);
  std::string textfile = expand_pattern(c.str(Param::metrics_textfile), getpid());
  if ((addr.empty() || addr == "off") && textfile.empty()) return;
  g_stop.store(false);
  start_thread("metrics", [addr, textfile, every = c.num(Param::metrics_interval_ms)] {
    metrics_loop(addr, textfile, every);
  });
}
}  // namespace

bool parse_listen_addr(const std::string& text, std::string* host, int* port) {
  size_t c = text.rfind(':');
  if (c == std::string::npos || c + 1 >= text.size()) return false;
  std::string h = text.substr(0, c);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') {
    h = h.substr(1, h.size() - 2);
    in6_addr a6;
    if (inet_pton(AF_INET6, h.c_str(), &a6) != 1) return false;
  } else if (h.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != std::string::npos ||
             h.size() > 253) {
    return false;  // a name or an IPv4 literal; an IPv6 one goes in brackets
  }
  const std::string p = text.substr(c + 1);
  if (p.size() > 5 || p.find_first_not_of("0123456789") != std::string::npos) return false;
  long n = std::stol(p);
  if (n > 65535) return false;
  *host = h;
  *port = static_cast<int>(n);
  return true;
}

void register_agent_services(std::function<clocksync::ProbeEngine*()> engine) {
  engine_fn() = std::move(engine);
  agent::register_service({"telemetry", start, [] { g_stop.store(true); }});
  agent::register_command("telemetry", telemetry_command);
  register_diagnose(engine_fn());
}

}  // namespace shunt::telemetry
