#include "interpose/socket/fd_table.h"

#include <netinet/in.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string>

#include "core/log.h"
#include "core/runtime.h"

namespace shunt::sock {

namespace {
std::atomic<SocketRecord*> g_fds[kMaxFd];

// Lock order across fork: the prepare handler takes the log mutex first, then
// each part's lock in registration order (runtime.cc); parent and child
// release them in reverse. g_mu is a leaf: nothing is logged and no other
// lock is taken while it is held (memory is allocated, and glibc's fork takes
// malloc's locks after every prepare handler, so that order is the same), so
// a thread holding it always lets go, whatever the forking thread holds.
std::mutex g_mu;
// Everything below is guarded by g_mu.
std::deque<SocketRecord>* g_pool = nullptr;  // stable addresses, never freed
SocketRecord* g_free = nullptr;               // blank records
SocketRecord *g_closed = nullptr, *g_closed_tail = nullptr;  // oldest first
int g_closed_n = 0;
int g_in_use = 0;  // reserved or open
std::map<std::string, FoldedInfo>* g_folded = nullptr;
uint64_t g_refused = 0;

constexpr size_t kMaxFolded = 256;  // beyond: one entry per role, no addresses
std::atomic<size_t> g_pool_size{0}, g_folded_size{0};  // to size a snapshot before locking
std::atomic<int> g_cap{-1};                            // -1: not read yet
std::atomic<bool> g_cap_said{false}, g_fd_limit_said{false};
std::atomic<uint64_t> g_forks{0};

struct ForkSafety {
  ForkSafety() {
    on_fork([] { g_mu.lock(); }, [] { g_mu.unlock(); },
            [] {
              g_mu.unlock();
              reset_after_fork();
            });
  }
} g_fork_safety;

int cap() {
  int c = g_cap.load(std::memory_order_relaxed);
  if (c >= 0) return c;
  int64_t v = config().num(Param::test_socket_records);
  c = v >= 0 && v < kMaxFd ? static_cast<int>(v) : kMaxFd;
  g_cap.store(c, std::memory_order_relaxed);
  return c;
}

void blank(SocketRecord* r) {
  r->fd = -1;
  r->family = 0;
  r->role = Role::unknown;
  memset(&r->local, 0, sizeof r->local);
  memset(&r->peer, 0, sizeof r->peer);
  r->local_len = r->peer_len = 0;
  for (auto* c : {&r->tx_bytes, &r->rx_bytes, &r->connects, &r->accepts}) c->store(0, std::memory_order_relaxed);
  r->downgrades.store(0, std::memory_order_relaxed);
  r->ignored_opts.store(0, std::memory_order_relaxed);
  r->mptcp.store(false, std::memory_order_relaxed);
  r->open.store(true, std::memory_order_relaxed);
  r->next = nullptr;
}

void push_free(SocketRecord* r) {
  r->slot = SocketRecord::Slot::free;
  r->next = g_free;
  g_free = r;
}

void zero_port(sockaddr_storage& a) {
  if (a.ss_family == AF_INET) reinterpret_cast<sockaddr_in&>(a).sin_port = 0;
  if (a.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6&>(a).sin6_port = 0;
}

// Adds a closed record's counters to the totals of its kind. Under g_mu.
void fold(SocketRecord* r) {
  FoldedInfo k;
  k.role = r->role;
  k.local = r->local;
  k.peer = r->peer;
  k.local_len = r->local_len;
  k.peer_len = r->peer_len;
  // Keep the end that names the service; the ephemeral end's port is any.
  if (k.role != Role::accepted && k.role != Role::listener) zero_port(k.local);
  if (k.role != Role::client) zero_port(k.peer);
  if (!g_folded) g_folded = new std::map<std::string, FoldedInfo>;
  if (g_folded->size() >= kMaxFolded) k.local_len = k.peer_len = 0;
  std::string key(1, static_cast<char>(k.role));
  key.append(reinterpret_cast<const char*>(&k.local), k.local_len);
  key.push_back('|');
  key.append(reinterpret_cast<const char*>(&k.peer), k.peer_len);
  auto [it, fresh] = g_folded->try_emplace(key, k);
  FoldedInfo& f = it->second;
  f.sockets++;
  f.upgraded += r->mptcp.load(std::memory_order_relaxed) ? 1 : 0;
  f.tx_bytes += r->tx_bytes.exchange(0, std::memory_order_relaxed);
  f.rx_bytes += r->rx_bytes.exchange(0, std::memory_order_relaxed);
  f.connects += r->connects.exchange(0, std::memory_order_relaxed);
  f.accepts += r->accepts.exchange(0, std::memory_order_relaxed);
  g_folded_size.store(g_folded->size(), std::memory_order_relaxed);
}

// The socket of an open record is gone. Under g_mu.
void retire(SocketRecord* r) {
  if (r->slot != SocketRecord::Slot::open) return;
  r->open.store(false, std::memory_order_relaxed);
  r->slot = SocketRecord::Slot::closed;
  r->next = nullptr;
  g_in_use--;
  (g_closed_tail ? g_closed_tail->next : g_closed) = r;
  g_closed_tail = r;
  if (++g_closed_n <= kKeptClosed) return;
  SocketRecord* old = g_closed;
  g_closed = old->next;
  if (!g_closed) g_closed_tail = nullptr;
  g_closed_n--;
  fold(old);
  push_free(old);
}
}  // namespace

SocketRecord* find(int fd) {
  if (!fits(fd)) return nullptr;
  return g_fds[fd].load(std::memory_order_acquire);
}

SocketRecord* reserve() {
  const int limit = cap();
  SocketRecord* r = nullptr;
  {
    std::lock_guard lk(g_mu);
    if (g_in_use >= limit) {
      g_refused++;
    } else {
      if (g_free) {
        r = g_free;
        g_free = r->next;
      } else {
        if (!g_pool) g_pool = new std::deque<SocketRecord>;
        r = &g_pool->emplace_back();
        g_pool_size.store(g_pool->size(), std::memory_order_relaxed);
      }
      blank(r);
      r->slot = SocketRecord::Slot::reserved;
      g_in_use++;
    }
  }
  if (!r && !g_cap_said.exchange(true))
    log::info("{} sockets open at once: later TCP sockets are neither counted nor opened as MPTCP until some close",
              limit);
  return r;
}

void release(SocketRecord* r) {
  if (!r) return;
  std::lock_guard lk(g_mu);
  if (r->slot != SocketRecord::Slot::reserved) return;
  g_in_use--;
  push_free(r);
}

bool commit(SocketRecord* r, int fd, int family, Role role) {
  if (!r) return false;
  if (!fits(fd)) {
    release(r);
    if (!g_fd_limit_said.exchange(true)) log::info("sockets with fd >= {} are not counted", kMaxFd);
    return false;
  }
  {
    std::lock_guard lk(g_mu);
    r->fd = fd;
    r->family = family;
    r->role = role;
    r->slot = SocketRecord::Slot::open;
    // A record still there was closed behind shunt's back (dup2 onto it).
    if (SocketRecord* stale = g_fds[fd].exchange(r, std::memory_order_acq_rel)) retire(stale);
  }
  return true;
}

SocketRecord* track(int fd, int family, Role role) {
  if (!fits(fd)) {
    if (!g_fd_limit_said.exchange(true)) log::info("sockets with fd >= {} are not counted", kMaxFd);
    return nullptr;
  }
  SocketRecord* r = reserve();
  return commit(r, fd, family, role) ? r : nullptr;
}

void untrack(int fd) {
  if (!fits(fd)) return;
  if (!g_fds[fd].load(std::memory_order_relaxed)) return;
  std::lock_guard lk(g_mu);
  if (SocketRecord* r = g_fds[fd].exchange(nullptr, std::memory_order_acq_rel)) retire(r);
}

void refresh_addresses(SocketRecord* r) {
  if (!r) return;
  socklen_t l = sizeof r->local;
  if (getsockname(r->fd, reinterpret_cast<sockaddr*>(&r->local), &l) == 0) r->local_len = l;
  l = sizeof r->peer;
  if (getpeername(r->fd, reinterpret_cast<sockaddr*>(&r->peer), &l) == 0) r->peer_len = l;
}

Snapshot snapshot() {
  Snapshot s;
  // Sized first, so that the lock is held only for the copy.
  s.sockets.reserve(g_pool_size.load(std::memory_order_relaxed) + 16);
  s.folded.reserve(g_folded_size.load(std::memory_order_relaxed) + 4);
  std::lock_guard lk(g_mu);
  if (g_pool)
    for (const SocketRecord& r : *g_pool) {
      if (r.slot != SocketRecord::Slot::open && r.slot != SocketRecord::Slot::closed) continue;
      SocketInfo& i = s.sockets.emplace_back();
      i.fd = r.fd;
      i.family = r.family;
      i.role = r.role;
      i.local = r.local;
      i.peer = r.peer;
      i.local_len = r.local_len;
      i.peer_len = r.peer_len;
      i.tx_bytes = r.tx_bytes.load(std::memory_order_relaxed);
      i.rx_bytes = r.rx_bytes.load(std::memory_order_relaxed);
      i.connects = r.connects.load(std::memory_order_relaxed);
      i.accepts = r.accepts.load(std::memory_order_relaxed);
      i.open = r.slot == SocketRecord::Slot::open;
      i.mptcp = r.mptcp.load(std::memory_order_relaxed);
    }
  if (g_folded)
    for (auto& [k, f] : *g_folded) s.folded.push_back(f);
  s.cap_refused = g_refused;
  return s;
}

void reset_after_fork() {
  // Single-threaded in the child, the lock released. Records of sockets the
  // child still holds stay (zeroed); closed ones and the folded totals are
  // the parent's history, not the child's. The walk is over the records in
  // use, as many as the sockets open at the fork (plus kKeptClosed).
  g_free = g_closed = g_closed_tail = nullptr;
  g_closed_n = g_in_use = 0;
  if (g_folded) g_folded->clear();
  g_folded_size.store(0, std::memory_order_relaxed);
  g_refused = 0;
  g_forks.store(0, std::memory_order_relaxed);
  if (!g_pool) return;
  for (SocketRecord& r : *g_pool) {
    if (r.slot != SocketRecord::Slot::open) {
      // Closed, or reserved by a thread the child does not have.
      blank(&r);
      push_free(&r);
      continue;
    }
    for (auto* c : {&r.tx_bytes, &r.rx_bytes, &r.connects, &r.accepts}) c->store(0, std::memory_order_relaxed);
    r.downgrades.store(0, std::memory_order_relaxed);
    r.ignored_opts.store(0, std::memory_order_relaxed);
    g_in_use++;
  }
}

uint64_t fork_count() { return g_forks.load(std::memory_order_relaxed); }
void count_fork() { g_forks.fetch_add(1, std::memory_order_relaxed); }

void set_cap_for_test(int c) { g_cap.store(c < 0 ? kMaxFd : c, std::memory_order_relaxed); }

}  // namespace shunt::sock
