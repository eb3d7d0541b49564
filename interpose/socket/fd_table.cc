#include "interpose/socket/fd_table.h"

#include <cstring>
#include <deque>
#include <mutex>

#include "interpose/core/log.h"
#include "interpose/core/runtime.h"

namespace shunt::sock {

namespace {
std::atomic<SocketRecord*> g_fds[kMaxFd];
std::mutex g_mu;
std::deque<SocketRecord>* g_records = nullptr;  // stable addresses, kept for the stats
constexpr size_t kMaxRecords = 1 << 16;
std::atomic<uint64_t> g_forks{0};

// No other thread may hold g_mu across fork, or the child would deadlock on
// its first socket.
struct ForkSafety {
  ForkSafety() {
    on_fork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
            [] {
              g_mu.unlock();
              reset_after_fork();
            });
  }
} g_fork_safety;
}  // namespace

SocketRecord* find(int fd) {
  if (static_cast<unsigned>(fd) >= static_cast<unsigned>(kMaxFd)) return nullptr;
  return g_fds[fd].load(std::memory_order_acquire);
}

SocketRecord* track(int fd, int family, Role role) {
  if (static_cast<unsigned>(fd) >= static_cast<unsigned>(kMaxFd)) {
    log::once(LogLevel::info, "fd-limit", "sockets with fd >= 65536 are not counted");
    return nullptr;
  }
  SocketRecord* r;
  {
    std::lock_guard lk(g_mu);
    if (!g_records) g_records = new std::deque<SocketRecord>;
    if (g_records->size() >= kMaxRecords) {
      log::once(LogLevel::info, "sock-records", "more than 65536 sockets: later ones are not counted");
      return nullptr;
    }
    r = &g_records->emplace_back();
  }
  r->fd = fd;
  r->family = family;
  r->role = role;
  g_fds[fd].store(r, std::memory_order_release);
  return r;
}

void untrack(int fd) {
  if (static_cast<unsigned>(fd) >= static_cast<unsigned>(kMaxFd)) return;
  SocketRecord* r = g_fds[fd].exchange(nullptr, std::memory_order_acq_rel);
  if (r) r->open.store(false, std::memory_order_relaxed);
}

void refresh_addresses(SocketRecord* r) {
  if (!r) return;
  socklen_t l = sizeof r->local;
  if (getsockname(r->fd, reinterpret_cast<sockaddr*>(&r->local), &l) == 0) r->local_len = l;
  l = sizeof r->peer;
  if (getpeername(r->fd, reinterpret_cast<sockaddr*>(&r->peer), &l) == 0) r->peer_len = l;
}

void for_each(const std::function<void(const SocketRecord&)>& fn) {
  std::lock_guard lk(g_mu);
  if (g_records)
    for (auto& r : *g_records) fn(r);
}

void reset_after_fork() {
  // Single-threaded in the child. Records of sockets the child still holds
  // stay (zeroed); closed ones are the parent's history, not the child's.
  if (!g_records) return;
  auto* fresh = new std::deque<SocketRecord>;
  for (int fd = 0; fd < kMaxFd; fd++) {
    SocketRecord* old = g_fds[fd].load(std::memory_order_relaxed);
    if (!old) continue;
    SocketRecord& r = fresh->emplace_back();
    r.fd = old->fd;
    r.family = old->family;
    r.role = old->role;
    r.local = old->local;
    r.local_len = old->local_len;
    r.peer = old->peer;
    r.peer_len = old->peer_len;
    r.mptcp.store(old->mptcp.load(std::memory_order_relaxed), std::memory_order_relaxed);
    g_fds[fd].store(&r, std::memory_order_relaxed);
  }
  g_records = fresh;  // the parent's copy is simply left behind in the child
  g_forks.store(0, std::memory_order_relaxed);
}

uint64_t fork_count() { return g_forks.load(std::memory_order_relaxed); }
void count_fork() { g_forks.fetch_add(1, std::memory_order_relaxed); }

}  // namespace shunt::sock
