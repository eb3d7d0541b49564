// Exported socket entry points. TCP sockets (IPv4/IPv6) get a record in the
// fd table; every send/recv-family call on a tracked fd adds to its byte
// counters. Each wrapper returns exactly what the real call returned and
// leaves errno as the real call left it.
#include <errno.h>
#include <netinet/in.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>

#include "agent/agent.h"
#include "core/runtime.h"
#include "interpose/socket/fd_table.h"
#include "interpose/socket/mptcp_upgrade.h"
#include "interpose/socket/rail_steering.h"

// Declared by glibc only under _FORTIFY_SOURCE; shunt wraps them always.
extern "C" {
ssize_t __recv_chk(int, void*, size_t, size_t, int);
ssize_t __recvfrom_chk(int, void*, size_t, size_t, int, sockaddr*, socklen_t*);
ssize_t __read_chk(int, void*, size_t, size_t);
}

using namespace shunt;
using sock::Role;

namespace {
constexpr const char* kLib = "libc.so.6";

#define SHUNT_REAL(fn) SHUNT_REAL_IN(kLib, fn, nullptr)

// True when this call should be observed (initializing on first use, which
// may be before the constructor when another library's constructor runs).
inline bool acting() {
  ensure_init();
  return current_mode() != Mode::off && !in_shunt();
}

// The hot read/write path: no init check (nothing is tracked before init).
inline sock::SocketRecord* tracked(int fd) {
  if (current_mode() == Mode::off) return nullptr;
  return sock::find(fd);
}

bool is_tcp(int domain, int type, int protocol) {
  return (domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
         (protocol == 0 || protocol == IPPROTO_TCP);
}

void track_accepted(int listener, int fd) {
  sock::SocketRecord* l = sock::find(listener);
  if (!l) return;
  ReentryGuard g;
  l->role = Role::listener;
  if (l->local_len == 0) sock::refresh_addresses(l);
  l->accepts.fetch_add(1, std::memory_order_relaxed);
  sock::SocketRecord* r = sock::track(fd, l->family, Role::accepted);
  if (r) r->mptcp.store(l->mptcp.load(std::memory_order_relaxed), std::memory_order_relaxed);
  sock::refresh_addresses(r);
}

struct ErrnoKeeper {
  int e = errno;
  ~ErrnoKeeper() { errno = e; }
};
}  // namespace

#define EXPORT extern "C" __attribute__((visibility("default")))

EXPORT int socket(int domain, int type, int protocol) {
  bool act = acting() && is_tcp(domain, type, protocol) && sock::sockets_mode() != sock::SocketsMode::off;
  if (!act) return SHUNT_REAL(socket)(domain, type, protocol);
  sock::SocketRecord* r;
  {
    ErrnoKeeper k;
    ReentryGuard g;
    r = sock::reserve();
  }
  int fd = -1;
  bool upgraded = false;
  // Only a socket shunt tracks may be MPTCP: only then are the options MPTCP
  // refuses and SO_PROTOCOL made to look like TCP.
  if (r && sock::upgrade_wanted()) {
    {
      ErrnoKeeper k;
      ReentryGuard g;
      sock::prepare_limits();
    }
    fd = SHUNT_REAL(socket)(domain, type, sock::kProtoMptcp);
    if (fd >= 0 && !sock::fits(fd)) {
      SHUNT_REAL(close)(fd);
      fd = -1;
    } else if (fd >= 0) {
      upgraded = true;
    } else {
      ReentryGuard g;
      sock::upgrade_failed(errno);
    }
  }
  if (fd < 0) fd = SHUNT_REAL(socket)(domain, type, protocol);
  ErrnoKeeper k;
  ReentryGuard g;
  if (fd < 0) {
    sock::release(r);
    return fd;
  }
  if (sock::commit(r, fd, domain, Role::unknown) && upgraded) {
    r->mptcp.store(true, std::memory_order_relaxed);
    sock::count_upgrade();
  }
  agent::ensure_started();
  return fd;
}

// An MPTCP socket refuses some options a TCP socket takes (TCP_USER_TIMEOUT,
// TCP_QUICKACK, IP_TTL, ... on this kernel): the application never sees that.
EXPORT int setsockopt(int fd, int level, int name, const void* val, socklen_t len) {
  int ret = SHUNT_REAL(setsockopt)(fd, level, name, val, len);
  sock::SocketRecord* r = tracked(fd);
  if (!r || !r->mptcp.load(std::memory_order_relaxed) || in_shunt()) return ret;
  int err = errno;
  ReentryGuard g;
  if (ret == 0) {
    sock::remember_option(r, level, name, val, len);
    errno = err;
    return 0;
  }
  return sock::mptcp_setsockopt_fallback(r, fd, level, name, val, len, err);
}

EXPORT int getsockopt(int fd, int level, int name, void* val, socklen_t* len) {
  int ret = SHUNT_REAL(getsockopt)(fd, level, name, val, len);
  sock::SocketRecord* r = tracked(fd);
  if (!r || !r->mptcp.load(std::memory_order_relaxed) || in_shunt()) return ret;
  if (ret == 0) {
    // The application asked for TCP and sees TCP.
    if (level == SOL_SOCKET && name == SO_PROTOCOL && val && len && *len >= sizeof(int))
      *static_cast<int*>(val) = IPPROTO_TCP;
    return 0;
  }
  int err = errno;
  ReentryGuard g;
  return sock::mptcp_getsockopt_fallback(r, fd, level, name, val, len, err);
}

EXPORT int connect(int fd, const sockaddr* addr, socklen_t len) {
  int ret = SHUNT_REAL(connect)(fd, addr, len);
  if (sock::SocketRecord* r = tracked(fd)) {
    ErrnoKeeper k;
    ReentryGuard g;
    r->role = Role::client;
    r->connects.fetch_add(1, std::memory_order_relaxed);
    if (addr && len <= sizeof r->peer) {
      memcpy(&r->peer, addr, len);
      r->peer_len = len;
    }
    socklen_t l = sizeof r->local;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&r->local), &l) == 0) r->local_len = l;
  }
  return ret;
}

EXPORT int accept(int fd, sockaddr* addr, socklen_t* len) {
  int c = SHUNT_REAL(accept)(fd, addr, len);
  if (c >= 0 && tracked(fd)) {
    ErrnoKeeper k;
    track_accepted(fd, c);
  }
  return c;
}

EXPORT int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  int c = SHUNT_REAL(accept4)(fd, addr, len, flags);
  if (c >= 0 && tracked(fd)) {
    ErrnoKeeper k;
    track_accepted(fd, c);
  }
  return c;
}

EXPORT int close(int fd) {
  // Untrack first: once the real close returns, the fd number may be reused
  // by another thread's socket() before we could clear the slot.
  if (sock::SocketRecord* r = sock::find(fd)) {
    if (r->mptcp.load(std::memory_order_relaxed)) {
      ErrnoKeeper k;
      ReentryGuard g;
      sock::forget_options(fd);
    }
    sock::untrack(fd);
  }
  return SHUNT_REAL(close)(fd);
}

EXPORT pid_t fork(void) {
  // Parts quiesce and restart through pthread_atfork; this wrapper counts.
  if (acting()) sock::count_fork();
  return SHUNT_REAL(fork)();
}

EXPORT ssize_t send(int fd, const void* buf, size_t n, int flags) {
  ssize_t r = SHUNT_REAL(send)(fd, buf, n, flags);
  sock::count_tx(tracked(fd), r);
  return r;
}

EXPORT ssize_t sendto(int fd, const void* buf, size_t n, int flags, const sockaddr* a, socklen_t l) {
  ssize_t r = SHUNT_REAL(sendto)(fd, buf, n, flags, a, l);
  sock::count_tx(tracked(fd), r);
  return r;
}

EXPORT ssize_t sendmsg(int fd, const msghdr* m, int flags) {
  ssize_t r = SHUNT_REAL(sendmsg)(fd, m, flags);
  sock::count_tx(tracked(fd), r);
  return r;
}

EXPORT int sendmmsg(int fd, mmsghdr* v, unsigned int n, int flags) {
  int r = SHUNT_REAL(sendmmsg)(fd, v, n, flags);
  if (sock::SocketRecord* s = tracked(fd))
    for (int i = 0; i < r; i++) sock::count_tx(s, v[i].msg_len);
  return r;
}

EXPORT ssize_t recv(int fd, void* buf, size_t n, int flags) {
  ssize_t r = SHUNT_REAL(recv)(fd, buf, n, flags);
  if (!(flags & MSG_PEEK)) sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t recvfrom(int fd, void* buf, size_t n, int flags, sockaddr* a, socklen_t* l) {
  ssize_t r = SHUNT_REAL(recvfrom)(fd, buf, n, flags, a, l);
  if (!(flags & MSG_PEEK)) sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t recvmsg(int fd, msghdr* m, int flags) {
  ssize_t r = SHUNT_REAL(recvmsg)(fd, m, flags);
  if (!(flags & MSG_PEEK)) sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT int recvmmsg(int fd, mmsghdr* v, unsigned int n, int flags, struct timespec* t) {
  int r = SHUNT_REAL(recvmmsg)(fd, v, n, flags, t);
  if (sock::SocketRecord* s = tracked(fd); s && !(flags & MSG_PEEK))
    for (int i = 0; i < r; i++) sock::count_rx(s, v[i].msg_len);
  return r;
}

EXPORT ssize_t read(int fd, void* buf, size_t n) {
  ssize_t r = SHUNT_REAL(read)(fd, buf, n);
  sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t write(int fd, const void* buf, size_t n) {
  ssize_t r = SHUNT_REAL(write)(fd, buf, n);
  sock::count_tx(tracked(fd), r);
  return r;
}

EXPORT ssize_t readv(int fd, const iovec* iov, int n) {
  ssize_t r = SHUNT_REAL(readv)(fd, iov, n);
  sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t writev(int fd, const iovec* iov, int n) {
  ssize_t r = SHUNT_REAL(writev)(fd, iov, n);
  sock::count_tx(tracked(fd), r);
  return r;
}

EXPORT ssize_t sendfile(int out, int in, off_t* off, size_t n) {
  ssize_t r = SHUNT_REAL(sendfile)(out, in, off, n);
  sock::count_tx(tracked(out), r);
  return r;
}

EXPORT ssize_t sendfile64(int out, int in, off64_t* off, size_t n) {
  ssize_t r = SHUNT_REAL(sendfile64)(out, in, off, n);
  sock::count_tx(tracked(out), r);
  return r;
}

// Fortified variants (_FORTIFY_SOURCE): same counting, real checks.
EXPORT ssize_t __recv_chk(int fd, void* buf, size_t n, size_t buflen, int flags) {
  ssize_t r = SHUNT_REAL(__recv_chk)(fd, buf, n, buflen, flags);
  if (!(flags & MSG_PEEK)) sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t __recvfrom_chk(int fd, void* buf, size_t n, size_t buflen, int flags, sockaddr* a,
                              socklen_t* l) {
  ssize_t r = SHUNT_REAL(__recvfrom_chk)(fd, buf, n, buflen, flags, a, l);
  if (!(flags & MSG_PEEK)) sock::count_rx(tracked(fd), r);
  return r;
}

EXPORT ssize_t __read_chk(int fd, void* buf, size_t n, size_t buflen) {
  ssize_t r = SHUNT_REAL(__read_chk)(fd, buf, n, buflen);
  sock::count_rx(tracked(fd), r);
  return r;
}
