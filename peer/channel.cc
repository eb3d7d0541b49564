#include "peer/channel.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <thread>
#include <vector>

#include "core/event_log.h"
#include "core/log.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "core/threads.h"
#include "peer/control.h"

namespace shunt::peer {

namespace {
using nlohmann::json;

// Anyone who reaches the port can open a connection, so those still to
// prove the key have a bound of their own, a short deadline, and give way
// to newer ones; those that proved it have theirs. (One bound for both let
// 64 silent connections, renewed every few seconds, refuse every peer.)
constexpr int kMaxSessions = 64, kMaxPending = 32, kMaxPendingPerAddr = 8;
constexpr int kAcceptsPerRound = 128;  // then the connections' own bytes get their turn
constexpr size_t kMaxUnsent = 1 << 20;  // replies a client leaves unread
constexpr int64_t kHandshakeMs = 2000, kIdleMs = 60000;

struct Conn {
  int fd;
  uint32_t addr;
  std::string who;
  ServerSession session;
  int64_t deadline, active;
  std::vector<uint8_t> out;
};

struct Listener {
  int fd = -1;
  Key job{};
  RequestHandler handler;
  std::atomic<bool> stop{false};
  std::thread thread;
  std::atomic<uint64_t> accepted{0}, authenticated{0}, dropped{0}, requests{0};
  int64_t log_window = 0;
  int logged = 0;
};
Listener* g_listener = nullptr;

// One line per dropped connection, at most 10 a second (a flood of junk
// must not flood the log).
void log_drop(Listener& l, const std::string& who, const std::string& why) {
  l.dropped++;
  int64_t now = mono_ms();
  if (now - l.log_window >= 1000) l.log_window = now, l.logged = 0;
  if (l.logged++ < 10) log::warn("peer channel: {} dropped: {}", who, why);
}

// A peer whose connection fails the job key's check: most often a node of
// the same job that made a key of its own (shunt-run on each node), which
// otherwise shows only as bundles that never form. Said once per address,
// as a line and an event; a flood of forged addresses stops at the bound.
void on_key_mismatch(const std::string& ip) {
  if (!first_key_mismatch(ip)) return;
  log::warn("peer channel: {} does not hold this job's key, so no bundles with it: every node of a job needs "
            "the same SHUNT_JOB_KEY (or SHUNT_JOB_KEY_FILE on a shared file system)",
            ip);
  telemetry::event("key_mismatch", {{"peer", ip}});
}

bool flush(Conn& c) {
  while (!c.out.empty()) {
    ssize_t r = ::send(c.fd, c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) {
      c.out.erase(c.out.begin(), c.out.begin() + r);
      continue;
    }
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
  }
  return true;
}

void drop(Listener& l, Conn& c, const std::string& why) {
  if (!why.empty()) log_drop(l, c.who, why);
  ::close(c.fd);
  c.fd = -1;
}

// Reads and answers what one connection sent; false: drop it (*why).
bool serve_one(Listener& l, Conn& c, short revents, int64_t now, std::string* why) {
  if (revents & (POLLIN | POLLHUP | POLLERR)) {
    uint8_t buf[16384];
    ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) {
      // closed by the peer: not an error worth a line
      if (!c.session.authenticated()) *why = "closed before authenticating";
      return false;
    }
    if (r > 0) {
      bool was = c.session.authenticated();
      uint64_t before = c.session.requests();
      bool ok = c.session.on_bytes(buf, static_cast<size_t>(r), l.handler, &c.out, why);
      if (!ok && why->rfind("wrong job key", 0) == 0) on_key_mismatch(c.who.substr(0, c.who.rfind(':')));
      if (!was && c.session.authenticated()) l.authenticated++;
      if (c.session.authenticated()) c.deadline = now + kIdleMs, c.active = now;
      l.requests += c.session.requests() - before;
      if (!ok) return false;
    }
  }
  if (!flush(c)) return *why = "cannot send", false;
  if (c.out.size() > kMaxUnsent) return *why = "does not read its replies", false;
  if (now > c.deadline) {
    if (c.session.authenticated()) return false;  // idle: said by nobody
    return *why = "no handshake in time", false;
  }
  return true;
}

// Sessions over the bound: those idle longest give way.
void bound_sessions(Listener& l, std::vector<std::unique_ptr<Conn>>& conns) {
  for (;;) {
    int n = 0;
    Conn* idlest = nullptr;
    for (auto& c : conns) {
      if (c->fd < 0 || !c->session.authenticated()) continue;
      n++;
      if (!idlest || c->active < idlest->active) idlest = c.get();
    }
    if (n <= kMaxSessions) return;
    drop(l, *idlest, "evicted: idle longest of " + std::to_string(n) + " sessions");
  }
}

void accept_new(Listener& l, std::vector<std::unique_ptr<Conn>>& conns, int64_t now) {
  sockaddr_in a{};
  socklen_t al = sizeof a;
  for (int k = 0, fd; k < kAcceptsPerRound &&
                      (fd = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&a), &al, SOCK_NONBLOCK | SOCK_CLOEXEC)) >= 0;
       k++, al = sizeof a) {
    char ip[INET_ADDRSTRLEN] = "?";
    inet_ntop(AF_INET, &a.sin_addr, ip, sizeof ip);
    std::string who = std::string(ip) + ":" + std::to_string(ntohs(a.sin_port));
    l.accepted++;
    std::vector<uint32_t> pending;
    std::vector<Conn*> of;
    for (auto& c : conns)
      if (c->fd >= 0 && !c->session.authenticated()) pending.push_back(c->addr), of.push_back(c.get());
    int v = pending_to_evict(pending, a.sin_addr.s_addr, kMaxPendingPerAddr, kMaxPending);
    if (v >= 0) drop(l, *of[v], "evicted: not authenticated, and a newer connection came");
    auto c = std::make_unique<Conn>(
        Conn{fd, a.sin_addr.s_addr, who, ServerSession(l.job, random_nonce()), now + kHandshakeMs, now, {}});
    c->out = c->session.hello();
    flush(*c);
    conns.push_back(std::move(c));
  }
}

void serve(Listener& l) {
  ReentryGuard g;
  pthread_setname_np(pthread_self(), "shunt-peer");
  std::vector<std::unique_ptr<Conn>> conns;
  while (!l.stop.load()) {
    std::vector<pollfd> fds{{l.fd, POLLIN, 0}};
    for (auto& c : conns) fds.push_back({c->fd, static_cast<short>(POLLIN | (c->out.empty() ? 0 : POLLOUT)), 0});
    // Until a connection's deadline (a handshake's, an idle one's), or 5 s;
    // stop_listener shuts the listening socket down, which wakes the poll.
    // (It woke every 200 ms regardless: on a one-CPU guest, idle wakeups
    // are CPU the job does not get.)
    int64_t wait = 5000;
    for (auto& c : conns) wait = std::min(wait, c->deadline - mono_ms() + 1);
    poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0)));
    int64_t now = mono_ms();
    // The connections first, then new ones: a client's answer to its hello
    // is read before newer connections can push it out.
    for (size_t i = 1; i < fds.size(); i++) {
      Conn& c = *conns[i - 1];
      std::string why;
      if (!serve_one(l, c, fds[i].revents, now, &why)) drop(l, c, why);
    }
    bound_sessions(l, conns);
    if (fds[0].revents & POLLIN) accept_new(l, conns, now);
    std::erase_if(conns, [](const std::unique_ptr<Conn>& c) { return c->fd < 0; });
  }
  for (auto& c : conns) ::close(c->fd);
}
}  // namespace

bool first_key_mismatch(const std::string& peer) {
  static std::mutex mu;
  static auto* seen = new std::set<std::string>;  // never freed: listener threads may outlive exit
  std::lock_guard l(mu);
  if (seen->size() >= kMaxKeyMismatchPeers || !seen->insert(peer).second) return false;
  return true;
}

int pending_to_evict(const std::vector<uint32_t>& pending, uint32_t addr, int per_addr, int max) {
  std::map<uint32_t, int> held;
  for (uint32_t a : pending) held[a]++;
  uint32_t from = addr;
  if (held[addr] < per_addr) {
    if (static_cast<int>(pending.size()) < max) return -1;
    // The address that holds the most gives way: a lone client is not
    // pushed out by a crowd from elsewhere.
    int most = 0;
    for (uint32_t a : pending)  // first met of the largest: ties go to the oldest
      if (held[a] > most) most = held[a], from = a;
  }
  for (size_t i = 0; i < pending.size(); i++)
    if (pending[i] == from) return static_cast<int>(i);
  return -1;
}

namespace {
Listener* open_listener(const std::string& addr, int port, const Key& job, RequestHandler h, int* bound) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  socklen_t al = sizeof a;
  if (fd < 0 || inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1 ||
      ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 256) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al) != 0) {
    log::warn("peer channel: cannot listen on {}:{}: {}", addr, port, strerror(errno));
    if (fd >= 0) ::close(fd);
    return nullptr;
  }
  auto* l = new Listener;
  l->fd = fd;
  l->job = job;
  l->handler = std::move(h);
  l->thread = std::thread(serve, std::ref(*l));
  if (bound) *bound = ntohs(a.sin_port);
  return l;
}
Listener* g_process_listener = nullptr;
int g_process_port = 0;
std::mutex g_process_mu;

// A forked child has no listener thread: its own bundles must get a
// listener of their own, not advertise the parent's port.
struct ForkReset {
  ForkReset() {
    on_fork(nullptr, nullptr, [] {
      if (g_process_listener) ::close(g_process_listener->fd);
      g_process_listener = nullptr;  // leaked: its thread is the parent's
      g_process_port = 0;
      new (&g_process_mu) std::mutex;
    });
  }
} g_fork_reset;
}  // namespace

bool start_listener(const std::string& addr, int port, const Key& job, RequestHandler h) {
  if (g_listener) return true;
  g_listener = open_listener(addr, port, job, std::move(h), nullptr);
  if (g_listener) log::info("peer channel: listening on {}:{}", addr, port);
  return g_listener != nullptr;
}

int start_process_listener(const Key& job, RequestHandler h) {
  std::lock_guard lk(g_process_mu);
  if (g_process_listener) return g_process_port;
  g_process_listener = open_listener("0.0.0.0", 0, job, std::move(h), &g_process_port);
  if (!g_process_listener) return 0;
  log::info("peer channel: this process answers its bundles on port {}", g_process_port);
  return g_process_port;
}

void stop_listener() {
  if (!g_listener) return;
  g_listener->stop.store(true);
  ::shutdown(g_listener->fd, SHUT_RDWR);  // wakes the thread's poll
  if (g_listener->thread.joinable()) g_listener->thread.join();
  ::close(g_listener->fd);
  g_listener = nullptr;  // leaked on purpose: counters may still be read
}

ListenerCounters listener_counters() {
  if (!g_listener) return {};
  return {g_listener->accepted.load(), g_listener->authenticated.load(), g_listener->dropped.load(),
          g_listener->requests.load()};
}

std::optional<json> call(const std::string& addr, int port, const Key& job, const json& req, int timeout_ms,
                         std::string* err) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  if (fd < 0 || inet_pton(AF_INET, addr.c_str(), &a.sin_addr) != 1) {
    *err = "bad address " + addr;
    if (fd >= 0) ::close(fd);
    return std::nullopt;
  }
  timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    *err = "cannot reach " + addr + ":" + std::to_string(port) + ": " + strerror(errno);
    ::close(fd);
    return std::nullopt;
  }
  ClientSession s(job, random_nonce());
  bool sent = false;
  std::optional<json> out;
  int64_t deadline = mono_ms() + timeout_ms;
  while (!out && mono_ms() < deadline) {
    uint8_t buf[16384];
    ssize_t r = ::recv(fd, buf, sizeof buf, 0);
    if (r <= 0) {
      *err = r == 0 ? "the peer closed the connection (wrong job key?)" : std::string("receive: ") + strerror(errno);
      break;
    }
    std::vector<uint8_t> reply;
    if (!s.on_bytes(buf, static_cast<size_t>(r), &reply, err)) break;
    if (s.ready() && !sent) {
      auto q = s.request(req);
      reply.insert(reply.end(), q.begin(), q.end());
      sent = true;
    }
    if (!reply.empty() && !write_all(fd, std::string(reply.begin(), reply.end()), timeout_ms)) {
      *err = "cannot send";
      break;
    }
    if (s.has_reply()) out = s.take_reply();
  }
  if (!out && err->empty()) *err = "no reply in time";
  ::close(fd);
  return out;
}

namespace {
struct Race {
  std::mutex mu;
  std::condition_variable cv;
  std::optional<json> answer;
  std::string err;
  size_t left = 0, winner = 0;
};
}  // namespace

std::optional<json> race(const std::vector<std::string>& addrs, int port, const Key& job, const json& req,
                         int timeout_ms, size_t* winner, std::string* err, int hedge_ms, int hedges) {
  auto r = std::make_shared<Race>();
  std::unique_lock l(r->mu);
  for (int h = 0; h < std::max(1, hedges) && !r->answer; h++) {
    if (h) r->cv.wait_for(l, std::chrono::milliseconds(hedge_ms), [&] { return r->answer.has_value(); });
    if (r->answer) break;
    for (size_t k = 0; k < addrs.size(); k++) {
      r->left++;
      auto done = [r, k](std::optional<json> a, const std::string& e) {
        std::lock_guard g(r->mu);
        if (a && !r->answer) r->answer = std::move(a), r->winner = k;
        if (!a) r->err = e;
        r->left--;
        r->cv.notify_all();
      };
      bool started = start_thread(
          "peer request",
          [ip = addrs[k], port, job, req, timeout_ms, done] {
            ReentryGuard guard;
            std::string e;
            auto a = call(ip, port, job, req, timeout_ms, &e);
            done(std::move(a), e);
          },
          [done](const std::string& why) { done(std::nullopt, "its thread stopped: " + why); });
      if (!started) {  // (r->mu is held here)
        r->left--;
        r->err = "no thread for the request";
      }
    }
  }
  r->cv.wait(l, [&] { return r->answer.has_value() || r->left == 0; });
  if (!r->answer) *err = r->err;
  *winner = r->winner;
  return r->answer;
}

}  // namespace shunt::peer
