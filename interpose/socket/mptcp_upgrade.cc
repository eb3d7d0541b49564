#include "interpose/socket/mptcp_upgrade.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "core/log.h"
#include "core/runtime.h"

namespace shunt::sock {

namespace {
std::atomic<bool> g_no_kernel{false};
std::atomic<uint64_t> g_upgraded{0};

struct Option {
  int level, name;
  std::vector<unsigned char> val;
};
// Options per fd of upgraded sockets: replayed on a downgrade, echoed back by
// getsockopt when the kernel refused them. Small and off the data path.
std::mutex g_mu;
std::map<int, std::vector<Option>>* g_opts = nullptr;

struct ForkSafety {
  ForkSafety() {
    on_fork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });
  }
} g_fork_safety;

void keep(int fd, int level, int name, const void* val, socklen_t len) {
  if (!val || len > 256) return;
  std::lock_guard lk(g_mu);
  if (!g_opts) g_opts = new std::map<int, std::vector<Option>>;
  auto& v = (*g_opts)[fd];
  for (auto& o : v)
    if (o.level == level && o.name == name) {
      o.val.assign(static_cast<const unsigned char*>(val), static_cast<const unsigned char*>(val) + len);
      return;
    }
  if (v.size() < 32)
    v.push_back({level, name, {static_cast<const unsigned char*>(val), static_cast<const unsigned char*>(val) + len}});
}

std::vector<Option> kept(int fd) {
  std::lock_guard lk(g_mu);
  if (!g_opts) return {};
  auto it = g_opts->find(fd);
  return it == g_opts->end() ? std::vector<Option>{} : it->second;
}

bool refused(int err) { return err == EOPNOTSUPP || err == ENOPROTOOPT; }

// Not connected, not listening, not bound: nobody can tell the socket was
// swapped, so the option can go to a plain TCP socket in its place.
bool still_fresh(int fd, int family) {
  sockaddr_storage a{};
  socklen_t l = sizeof a;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&a), &l) == 0 || errno != ENOTCONN) return false;
  int listening = 0;
  l = sizeof listening;
  if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &l) != 0 || listening) return false;
  l = sizeof a;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&a), &l) != 0) return false;
  if (family == AF_INET) return reinterpret_cast<sockaddr_in*>(&a)->sin_port == 0;
  if (family == AF_INET6) return reinterpret_cast<sockaddr_in6*>(&a)->sin6_port == 0;
  return false;
}

std::string option_name(int level, int name) {
  const char* lv = level == SOL_SOCKET ? "SOL_SOCKET" : level == IPPROTO_TCP ? "IPPROTO_TCP"
                   : level == IPPROTO_IP ? "IPPROTO_IP" : level == IPPROTO_IPV6 ? "IPPROTO_IPV6" : "level";
  return std::string(lv) + "/" + std::to_string(name);
}
}  // namespace

SocketsMode sockets_mode() { return static_cast<SocketsMode>(config().num(Param::sockets)); }

bool upgrade_wanted() {
  return current_mode() == Mode::active && sockets_mode() == SocketsMode::mptcp &&
         !g_no_kernel.load(std::memory_order_relaxed);
}

void upgrade_failed(int err) {
  if (err == EMFILE || err == ENFILE || err == ENOMEM || err == ENOBUFS) return;  // not about MPTCP
  g_no_kernel.store(true);
  log::once(LogLevel::warn, "no-mptcp",
            fmt::format("this kernel opens no MPTCP socket ({}; see net.mptcp.enabled): TCP sockets stay TCP",
                        strerror(err)));
}

uint64_t upgraded_count() { return g_upgraded.load(std::memory_order_relaxed); }
void count_upgrade() { g_upgraded.fetch_add(1, std::memory_order_relaxed); }

void remember_option(SocketRecord* r, int level, int name, const void* val, socklen_t len) {
  if (r && r->mptcp.load(std::memory_order_relaxed)) keep(r->fd, level, name, val, len);
}

int mptcp_setsockopt_fallback(SocketRecord* r, int fd, int level, int name, const void* val, socklen_t len,
                              int err) {
  if (!refused(err)) {
    errno = err;
    return -1;
  }
  if (still_fresh(fd, r->family)) {
    int fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
    int type = SOCK_STREAM | ((fl >= 0 && (fl & O_NONBLOCK)) ? SOCK_NONBLOCK : 0);
    int t = socket(r->family, type, IPPROTO_TCP);
    if (t >= 0) {
      for (auto& o : kept(fd)) setsockopt(t, o.level, o.name, o.val.data(), o.val.size());
      int ret = setsockopt(t, level, name, val, len);
      int e = errno;
      if (ret == 0 || !refused(e)) {
        if (dup3(t, fd, (fdfl >= 0 && (fdfl & FD_CLOEXEC)) ? O_CLOEXEC : 0) == fd) {
          ::close(t);
          r->mptcp.store(false);
          r->downgrades.fetch_add(1, std::memory_order_relaxed);
          log::once(LogLevel::info, "mptcp-downgrade-" + option_name(level, name),
                    fmt::format("setsockopt {} is refused on MPTCP sockets: such a socket is opened as TCP",
                                option_name(level, name)));
          errno = e;
          return ret;
        }
      }
      ::close(t);
    }
  }
  // Connected, listening or bound: keep the value for getsockopt and go on
  // without it (these are tuning options; MPTCP manages its subflows itself).
  keep(fd, level, name, val, len);
  r->ignored_opts.fetch_add(1, std::memory_order_relaxed);
  log::once(LogLevel::info, "mptcp-ignored-" + option_name(level, name),
            fmt::format("setsockopt {} is refused on MPTCP sockets: ignored on a connected one",
                        option_name(level, name)));
  return 0;
}

int mptcp_getsockopt_fallback(SocketRecord* r, int fd, int level, int name, void* val, socklen_t* len,
                              int err) {
  if (!refused(err) || !len) {
    errno = err;
    return -1;
  }
  for (auto& o : kept(fd))
    if (o.level == level && o.name == name) {
      socklen_t n = std::min<socklen_t>(*len, o.val.size());
      memcpy(val, o.val.data(), n);
      *len = n;
      return 0;
    }
  int t = socket(r->family, SOCK_STREAM, IPPROTO_TCP);
  if (t < 0) {
    errno = err;
    return -1;
  }
  int ret = getsockopt(t, level, name, val, len);
  int e = errno;
  ::close(t);
  errno = e;
  return ret;
}

void forget_options(int fd) {
  std::lock_guard lk(g_mu);
  if (g_opts) g_opts->erase(fd);
}

}  // namespace shunt::sock
