#include "tools/shunt-bench/bootstrap.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "tools/shunt-bench/net.h"

namespace bench {
namespace {

constexpr uint32_t kHelloMagic = 0x5348424eu;  // "SHBN"

void send_blob(int fd, const std::string& b, const std::string& what) {
  uint32_t len = static_cast<uint32_t>(b.size());
  write_full(fd, &len, sizeof len, what);
  if (len) write_full(fd, b.data(), len, what);
}

std::string recv_blob(int fd, double timeout_s, const std::string& what) {
  uint32_t len = 0;
  read_full(fd, &len, sizeof len, timeout_s, what);
  std::string b(len, '\0');
  if (len) read_full(fd, b.data(), len, timeout_s, what);
  return b;
}

}  // namespace

Bootstrap::Bootstrap(int rank, int world, const std::string& host_port, double timeout_s)
    : rank_(rank), world_(world), wait_s_(timeout_s) {
  std::string host, port;
  split_host_port(host_port, &host, &port);
  if (rank_ == 0) {
    fds_.assign(world_, -1);
    int lfd = listen_on(host, port, world_);
    try {
      for (int i = 1; i < world_; i++) {
        int fd = accept_within(lfd, timeout_s);
        uint32_t hello[3];
        read_full(fd, hello, sizeof hello, timeout_s, "bootstrap hello");
        if (hello[0] != kHelloMagic || hello[2] != static_cast<uint32_t>(world_) ||
            hello[1] == 0 || hello[1] >= static_cast<uint32_t>(world_) || fds_[hello[1]] != -1) {
          close(fd);
          throw BenchError("bootstrap: bad hello (rank " + std::to_string(hello[1]) + ", world " +
                           std::to_string(hello[2]) + ")");
        }
        fds_[hello[1]] = fd;
      }
    } catch (...) {
      close(lfd);
      throw;
    }
    close(lfd);
    local_addr_ = host.empty() ? "127.0.0.1" : host;
    if (world_ > 1) local_addr_ = local_host(fds_[1]);
  } else {
    int fd = connect_to(host, port, timeout_s);
    fds_.push_back(fd);
    uint32_t hello[3] = {kHelloMagic, static_cast<uint32_t>(rank_), static_cast<uint32_t>(world_)};
    write_full(fd, hello, sizeof hello, "bootstrap hello");
    local_addr_ = local_host(fd);
  }
}

Bootstrap::~Bootstrap() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

std::vector<std::string> Bootstrap::allgather(const std::string& mine) {
  std::vector<std::string> all(world_);
  if (rank_ == 0) {
    all[0] = mine;
    for (int i = 1; i < world_; i++)
      all[i] = recv_blob(fds_[i], wait_s_, "bootstrap: rank " + std::to_string(i));
    std::string packed;
    for (const auto& b : all) {
      uint32_t len = static_cast<uint32_t>(b.size());
      packed.append(reinterpret_cast<const char*>(&len), sizeof len);
      packed += b;
    }
    for (int i = 1; i < world_; i++) send_blob(fds_[i], packed, "bootstrap: rank " + std::to_string(i));
  } else {
    send_blob(fds_[0], mine, "bootstrap: rank 0");
    std::string packed = recv_blob(fds_[0], wait_s_, "bootstrap: rank 0");
    size_t off = 0;
    for (int i = 0; i < world_; i++) {
      uint32_t len;
      if (off + sizeof len > packed.size()) throw BenchError("bootstrap: short allgather reply");
      std::memcpy(&len, packed.data() + off, sizeof len);
      off += sizeof len;
      if (off + len > packed.size()) throw BenchError("bootstrap: short allgather reply");
      all[i] = packed.substr(off, len);
      off += len;
    }
  }
  return all;
}

}  // namespace bench
