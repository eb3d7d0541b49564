// Sockets shunt tracks (TCP over IPv4/IPv6), indexed by fd. The table is a
// flat array of atomic pointers so the read/write wrappers, which run for
// every fd of the process, cost one bounds check and one load.
//
// Records are reused: a closed socket's record stays in the stats while it is
// one of the last kKeptClosed closed, then its counters are folded into
// per-process totals (by role and the connection's stable end) and the record
// serves a later socket. So memory, the stats and every walk of the table are
// bounded by the sockets open at once, not by every socket ever made.
#pragma once
#include <sys/socket.h>

#include <atomic>
#include <cstdint>
#include <vector>

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
  // Owned by the table (under its lock).
  enum class Slot : uint8_t { free, reserved, open, closed } slot = Slot::free;
  SocketRecord* next = nullptr;  // free list or closed list
};

constexpr int kMaxFd = 1 << 16;
constexpr int kKeptClosed = 64;

// A record for a TCP socket about to be opened, or nullptr when the table is
// full (SHUNT_TEST_SOCKET_RECORDS, else kMaxFd open sockets): such a socket
// must stay exactly what the application asked for (no MPTCP).
SocketRecord* reserve();
// The reserved socket was opened as `fd`: the record starts counting it.
// False (record given back) when fd is beyond the table (fd >= kMaxFd).
bool commit(SocketRecord* r, int fd, int family, Role role);
// The reserved socket was not opened.
void release(SocketRecord* r);
inline bool fits(int fd) { return static_cast<unsigned>(fd) < static_cast<unsigned>(kMaxFd); }
// reserve + commit, for sockets that exist already (accepted ones).
SocketRecord* track(int fd, int family, Role role);
// Stops tracking `fd` (it is being closed): the record stays for the stats
// until kKeptClosed later sockets have closed.
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

// A copy of one record, taken under the table's lock.
struct SocketInfo {
  int fd = -1, family = 0;
  Role role = Role::unknown;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = 0, peer_len = 0;
  uint64_t tx_bytes = 0, rx_bytes = 0, connects = 0, accepts = 0;
  bool open = false, mptcp = false;
};
// Closed sockets folded together: same role, family and stable end (a
// client's peer, an accepted socket's or listener's local address); the
// other end's port is 0 (any).
struct FoldedInfo {
  Role role = Role::unknown;
  sockaddr_storage local{}, peer{};
  socklen_t local_len = 0, peer_len = 0;
  uint64_t sockets = 0, upgraded = 0, tx_bytes = 0, rx_bytes = 0, connects = 0, accepts = 0;
};
struct Snapshot {
  std::vector<SocketInfo> sockets;  // open ones and the last closed, in table order
  std::vector<FoldedInfo> folded;
  uint64_t cap_refused = 0;         // sockets left untracked because the table was full
};
Snapshot snapshot();

// A forked child reports only its own traffic from here on.
void reset_after_fork();
uint64_t fork_count();
void count_fork();

// Test hook: the open-socket cap (SHUNT_TEST_SOCKET_RECORDS otherwise).
void set_cap_for_test(int cap);

}  // namespace shunt::sock
