// The tcp transport: a full mesh of stream sockets, one per pair of ranks,
// driven by poll(). Plain sockets on purpose: under LD_PRELOAD=libshunt.so
// these are the sockets the shim upgrades.
#include <poll.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <deque>
#include <sstream>

#include "tools/shunt-bench/bootstrap.h"
#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/transport.h"

namespace bench {
namespace {

struct Pending {
  char* p;
  size_t left;
};

class TcpTransport final : public Transport {
 public:
  TcpTransport(const Options& o, Bootstrap& bs, size_t region, Progress& prog)
      : rank_(bs.rank()), world_(bs.world()), region_(region), stall_s_(o.stall_timeout_s), prog_(prog) {
    mem_ = static_cast<char*>(mmap(nullptr, region_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
    if (mem_ == MAP_FAILED) throw BenchError("cannot allocate " + std::to_string(region_) + " bytes");
    connect_mesh(o, bs);
  }

  ~TcpTransport() override {
    for (int fd : fds_)
      if (fd >= 0) close(fd);
    munmap(mem_, region_);
  }

  char* base() override { return mem_; }
  size_t region_bytes() const override { return region_; }
  std::string describe() const override { return "tcp " + addr_; }

  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) override {
    std::vector<std::deque<Pending>> tx(world_), rx(world_);
    size_t open = 0;
    for (const auto& s : sends)
      if (s.len) { tx[s.peer].push_back({mem_ + s.local_off, s.len}); open++; }
    for (const auto& r : recvs)
      if (r.len) { rx[r.peer].push_back({mem_ + r.local_off, r.len}); open++; }

    std::vector<pollfd> pfd;
    std::vector<int> who;
    auto last = std::chrono::steady_clock::now();
    while (open) {
      pfd.clear();
      who.clear();
      for (int p = 0; p < world_; p++) {
        short ev = (tx[p].empty() ? 0 : POLLOUT) | (rx[p].empty() ? 0 : POLLIN);
        if (ev) { pfd.push_back({fds_[p], ev, 0}); who.push_back(p); }
      }
      int rc = poll(pfd.data(), pfd.size(), 100);
      if (rc < 0 && errno != EINTR) fail("poll", -1, errno);
      bool moved = false;
      for (size_t i = 0; rc > 0 && i < pfd.size(); i++) {
        int p = who[i];
        if (pfd[i].revents & (POLLIN | POLLERR | POLLHUP)) moved |= pump_rx(p, rx[p], &open);
        if (pfd[i].revents & (POLLOUT | POLLERR)) moved |= pump_tx(p, tx[p], &open);
      }
      auto now = std::chrono::steady_clock::now();
      if (moved) {
        last = now;
      } else if (std::chrono::duration<double>(now - last).count() > stall_s_) {
        prog_.errors.fetch_add(1, std::memory_order_relaxed);
        throw BenchError("tcp: no progress for " + std::to_string(static_cast<int>(stall_s_)) +
                         " s (" + std::to_string(open) + " transfers open)");
      }
    }
  }

 private:
  bool pump_rx(int p, std::deque<Pending>& q, size_t* open) {
    bool moved = false;
    while (!q.empty()) {
      Pending& r = q.front();
      ssize_t n = recv(fds_[p], r.p, r.left, MSG_DONTWAIT);
      if (n == 0) fail("recv", p, 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        fail("recv", p, errno);
      }
      prog_.delivered(static_cast<uint64_t>(n));
      moved = true;
      r.p += n;
      r.left -= static_cast<size_t>(n);
      if (r.left == 0) { q.pop_front(); (*open)--; }
    }
    return moved;
  }

  bool pump_tx(int p, std::deque<Pending>& q, size_t* open) {
    bool moved = false;
    while (!q.empty()) {
      Pending& s = q.front();
      ssize_t n = send(fds_[p], s.p, s.left, MSG_DONTWAIT | MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) break;
        fail("send", p, errno);
      }
      moved = true;
      s.p += n;
      s.left -= static_cast<size_t>(n);
      if (s.left == 0) { q.pop_front(); (*open)--; }
    }
    return moved;
  }

  [[noreturn]] void fail(const char* op, int peer, int err) {
    prog_.errors.fetch_add(1, std::memory_order_relaxed);
    std::string who = peer < 0 ? "" : (std::strcmp(op, "recv") == 0 ? " from rank " : " to rank ") + std::to_string(peer);
    throw BenchError(std::string("tcp ") + op + who + " failed: " +
                     (err ? errno_text(err) : std::string("connection closed by peer")));
  }

  void connect_mesh(const Options& o, Bootstrap& bs) {
    std::string host = o.addr.empty() ? bs.local_addr() : o.addr;
    int lfd = listen_on(host, "0", world_);
    addr_ = (host.find(':') == std::string::npos ? host : "[" + host + "]") + ":" + local_port(lfd);
    auto all = bs.allgather(addr_);
    fds_.assign(world_, -1);
    try {
      // Lower ranks are already listening: connect to them; accept the rest.
      for (int p = 0; p < rank_; p++) {
        std::string h, port;
        split_host_port(all[p], &h, &port);
        int fd = connect_to(h, port, o.connect_timeout_s);
        uint32_t me = static_cast<uint32_t>(rank_);
        write_full(fd, &me, sizeof me, "tcp hello");
        fds_[p] = fd;
      }
      for (int i = rank_ + 1; i < world_; i++) {
        int fd = accept_within(lfd, o.connect_timeout_s);
        uint32_t them = 0;
        read_full(fd, &them, sizeof them, o.connect_timeout_s, "tcp hello");
        if (them <= static_cast<uint32_t>(rank_) || them >= static_cast<uint32_t>(world_) || fds_[them] >= 0) {
          close(fd);
          throw BenchError("tcp: unexpected hello from rank " + std::to_string(them));
        }
        fds_[them] = fd;
      }
    } catch (...) {
      close(lfd);
      throw;
    }
    close(lfd);
    for (int p = 0; p < world_; p++)
      if (fds_[p] >= 0) set_nonblocking(fds_[p]);
    bs.barrier();
  }

  int rank_, world_;
  size_t region_;
  double stall_s_;
  Progress& prog_;
  char* mem_ = nullptr;
  std::vector<int> fds_;
  std::string addr_;
};

}  // namespace

std::unique_ptr<Transport> make_tcp_transport(const Options& o, Bootstrap& bs, size_t region,
                                              Progress& prog) {
  return std::make_unique<TcpTransport>(o, bs, region, prog);
}

}  // namespace bench
