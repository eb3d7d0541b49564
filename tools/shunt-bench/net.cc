#include "tools/shunt-bench/net.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

namespace bench {
namespace {

double now_s() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

struct AddrList {
  addrinfo* ai = nullptr;
  AddrList(const std::string& host, const std::string& port, bool passive) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &ai);
    if (rc != 0)
      throw BenchError("cannot resolve " + host + ":" + port + ": " + gai_strerror(rc));
  }
  ~AddrList() { freeaddrinfo(ai); }
};

// Waits for `events` on fd; false on timeout.
bool wait_fd(int fd, short events, double timeout_s) {
  pollfd p{fd, events, 0};
  int ms = timeout_s < 0 ? -1 : static_cast<int>(timeout_s * 1000);
  for (;;) {
    int rc = poll(&p, 1, ms);
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) throw BenchError("poll: " + errno_text(errno));
  }
}

}  // namespace

std::string errno_text(int err) { return std::string(strerror(err)) + " (errno " + std::to_string(err) + ")"; }

void split_host_port(const std::string& hp, std::string* host, std::string* port) {
  size_t colon = hp.rfind(':');
  if (colon == std::string::npos || colon + 1 == hp.size())
    throw BenchError("expected HOST:PORT, got '" + hp + "'");
  std::string h = hp.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  *host = h;
  *port = hp.substr(colon + 1);
}

int listen_on(const std::string& host, const std::string& port, int backlog) {
  AddrList al(host, port, true);
  int last = 0;
  for (addrinfo* a = al.ai; a; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) { last = errno; continue; }
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && listen(fd, backlog) == 0) return fd;
    last = errno;
    close(fd);
  }
  throw BenchError("cannot listen on " + host + ":" + port + ": " + errno_text(last));
}

int connect_to(const std::string& host, const std::string& port, double timeout_s) {
  double deadline = now_s() + timeout_s;
  int last = 0;
  for (;;) {
    AddrList al(host, port, false);
    for (addrinfo* a = al.ai; a; a = a->ai_next) {
      int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) { last = errno; continue; }
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        set_nodelay(fd);
        return fd;
      }
      last = errno;
      close(fd);
    }
    if (now_s() > deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw BenchError("cannot connect to " + host + ":" + port + ": " + errno_text(last));
}

int accept_within(int lfd, double timeout_s) {
  if (!wait_fd(lfd, POLLIN, timeout_s))
    throw BenchError("no connection within " + std::to_string(static_cast<int>(timeout_s)) + " s");
  int fd = accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) throw BenchError("accept: " + errno_text(errno));
  set_nodelay(fd);
  return fd;
}

void read_full(int fd, void* buf, size_t n, double timeout_s, const std::string& what) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    if (!wait_fd(fd, POLLIN, timeout_s))
      throw BenchError(what + ": nothing received for " + std::to_string(static_cast<int>(timeout_s)) + " s");
    ssize_t r = read(fd, p, n);
    if (r == 0) throw BenchError(what + ": connection closed by peer");
    if (r < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
      throw BenchError(what + ": read: " + errno_text(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

void write_full(int fd, const void* buf, size_t n, const std::string& what) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN) { wait_fd(fd, POLLOUT, -1); continue; }
      throw BenchError(what + ": write: " + errno_text(errno));
    }
    p += r;
    n -= static_cast<size_t>(r);
  }
}

static std::string sock_name(int fd, int flags) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw BenchError("getsockname: " + errno_text(errno));
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  int rc = getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, serv, sizeof serv,
                       NI_NUMERICHOST | NI_NUMERICSERV);
  if (rc != 0) throw BenchError(std::string("getnameinfo: ") + gai_strerror(rc));
  return flags ? serv : host;
}

std::string local_host(int fd) { return sock_name(fd, 0); }
std::string local_port(int fd) { return sock_name(fd, 1); }

void set_nodelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void set_nonblocking(int fd) {
  int fl = fcntl(fd, F_GETFL);
  if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
    throw BenchError("fcntl O_NONBLOCK: " + errno_text(errno));
}

}  // namespace bench
