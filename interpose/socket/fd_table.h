// Sockets shunt tracks (TCP over IPv4/IPv6), indexed by fd. The table is a
// flat array of atomic pointers so the read/write wrappers, which run for
// every fd of the process, cost one bounds check and one load.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <functional>

namespace shunt::sock {

enum class Role { unknown, client, listener, accepted };

struct SocketRecord {
  int fd = -1;
  int family = 0;
  Role role = Role::unknown;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = 0, peer_len = 0;
  std::atomic<uint64_t> tx_bytes{0}, rx_bytes{0};
  std::atomic<uint64_t> connects{0}, accepts{0};
  std::atomic<bool> open{true};
  std::atomic<bool> mptcp{false};    // opened as IPPROTO_MPTCP by shunt
  std::atomic<uint32_t> downgrades{0};  // put back to TCP for an option MPTCP refuses
  std::atomic<uint32_t> ignored_opts{0};  // options kept aside on a connected MPTCP socket
};

constexpr int kMaxFd = 1 << 16;

// Starts tracking `fd` (a new TCP socket); returns nullptr past the limits.
SocketRecord* track(int fd, int family, Role role);
// Stops tracking `fd` (it is being closed): the record stays for the stats.
void untrack(int fd);

SocketRecord* find(int fd);

inline void count_tx(SocketRecord* r, long n) {
  if (r && n > 0) r->tx_bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
}
inline void count_rx(SocketRecord* r, long n) {
  if (r && n > 0) r->rx_bytes.fetch_add(static_cast<uint64_t>(n), std::memory_order_relaxed);
}

// Fills the record's local (and, if known, peer) address from the kernel.
void refresh_addresses(SocketRecord* r);
void for_each(const std::function<void(const SocketRecord&)>& fn);
// A forked child reports only its own traffic from here on.
void reset_after_fork();
uint64_t fork_count();
void count_fork();

}  // namespace shunt::sock
