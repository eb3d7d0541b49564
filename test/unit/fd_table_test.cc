// The socket table: records of closed sockets are reused and their counters
// folded into totals, so its size and a snapshot's follow the open sockets;
// a full table refuses a reservation. The fds are plain numbers here: no
// socket is opened.
#include <gtest/gtest.h>
#include <netinet/in.h>

#include <cstring>

#include "interpose/socket/fd_table.h"

using namespace shunt::sock;

namespace {
constexpr int kBase = 30000;  // fds of these tests, far from the process's own

sockaddr_storage v4(uint32_t host, uint16_t port) {
  sockaddr_storage s{};
  auto* a = reinterpret_cast<sockaddr_in*>(&s);
  a->sin_family = AF_INET;
  a->sin_addr.s_addr = htonl(host);
  a->sin_port = htons(port);
  return s;
}

struct Totals {
  uint64_t sockets = 0, tx = 0, rx = 0;
};
Totals totals(const Snapshot& s) {
  Totals t;
  for (auto& i : s.sockets) {
    t.sockets++;
    t.tx += i.tx_bytes;
    t.rx += i.rx_bytes;
  }
  for (auto& f : s.folded) {
    t.sockets += f.sockets;
    t.tx += f.tx_bytes;
    t.rx += f.rx_bytes;
  }
  return t;
}

// A client socket to 10.0.0.2:5000 from an ephemeral port, `n` bytes each way.
void client(int fd, uint16_t port, uint64_t n) {
  SocketRecord* r = track(fd, AF_INET, Role::client);
  ASSERT_NE(r, nullptr);
  r->local = v4(0x0a000001, port);
  r->local_len = sizeof(sockaddr_in);
  r->peer = v4(0x0a000002, 5000);
  r->peer_len = sizeof(sockaddr_in);
  count_tx(find(fd), static_cast<long>(n));
  count_rx(find(fd), static_cast<long>(n));
}
}  // namespace

TEST(FdTable, ClosedSocketsAreFoldedAndTheirRecordsReused) {
  set_cap_for_test(-1);
  Totals before = totals(snapshot());
  size_t listed_before = snapshot().sockets.size();
  for (int i = 0; i < 20000; i++) {
    client(kBase + i % 8, static_cast<uint16_t>(40000 + i % 20000), 10);
    untrack(kBase + i % 8);
  }
  Snapshot s = snapshot();
  // Listed one by one: only the last closed; the rest summed per peer service.
  EXPECT_LE(s.sockets.size(), listed_before + kKeptClosed);
  Totals after = totals(s);
  EXPECT_EQ(after.sockets - before.sockets, 20000u);
  EXPECT_EQ(after.tx - before.tx, 200000u);
  EXPECT_EQ(after.rx - before.rx, 200000u);
  int to_service = 0;
  for (auto& f : s.folded)
    if (f.role == Role::client && ntohs(reinterpret_cast<sockaddr_in&>(f.peer).sin_port) == 5000) {
      to_service++;
      EXPECT_EQ(reinterpret_cast<sockaddr_in&>(f.local).sin_port, 0) << "the ephemeral end is any port";
      EXPECT_EQ(f.sockets, 20000u - kKeptClosed);
    }
  EXPECT_EQ(to_service, 1);
}

TEST(FdTable, FullTableRefusesAndFreesAgainOnClose) {
  set_cap_for_test(-1);
  int open_now = 0;
  for (auto& i : snapshot().sockets) open_now += i.open;
  set_cap_for_test(open_now + 2);
  uint64_t refused = snapshot().cap_refused;
  ASSERT_NE(track(kBase + 100, AF_INET, Role::unknown), nullptr);
  SocketRecord* r = reserve();
  ASSERT_NE(r, nullptr);
  EXPECT_EQ(reserve(), nullptr) << "a third socket while two are tracked";
  EXPECT_EQ(track(kBase + 102, AF_INET, Role::unknown), nullptr);
  EXPECT_EQ(find(kBase + 102), nullptr);
  EXPECT_EQ(snapshot().cap_refused - refused, 2u);
  release(r);  // the socket could not be opened
  SocketRecord* again = reserve();
  ASSERT_NE(again, nullptr);
  EXPECT_FALSE(commit(again, kMaxFd + 5, AF_INET, Role::unknown)) << "beyond the fd table";
  untrack(kBase + 100);
  EXPECT_NE(track(kBase + 103, AF_INET, Role::unknown), nullptr);
  EXPECT_NE(track(kBase + 104, AF_INET, Role::unknown), nullptr);
  untrack(kBase + 103);
  untrack(kBase + 104);
  set_cap_for_test(-1);
}

TEST(FdTable, RecordClosedBehindOurBackIsRetiredWhenItsFdComesBack) {
  set_cap_for_test(-1);
  ASSERT_NE(track(kBase + 200, AF_INET, Role::unknown), nullptr);
  count_tx(find(kBase + 200), 7);
  SocketRecord* second = track(kBase + 200, AF_INET, Role::unknown);  // no untrack between
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(find(kBase + 200), second);
  int open_at_fd = 0;
  for (auto& i : snapshot().sockets) open_at_fd += i.open && i.fd == kBase + 200;
  EXPECT_EQ(open_at_fd, 1);
  untrack(kBase + 200);
}

TEST(FdTable, ForkedChildKeepsOnlyItsOpenSocketsZeroed) {
  set_cap_for_test(-1);
  client(kBase + 300, 41000, 50);
  client(kBase + 301, 41001, 50);
  untrack(kBase + 301);
  reset_after_fork();  // as in the child, single-threaded
  Snapshot s = snapshot();
  EXPECT_TRUE(s.folded.empty());
  bool kept = false;
  for (auto& i : s.sockets) {
    EXPECT_TRUE(i.open);
    if (i.fd != kBase + 300) continue;
    kept = true;
    EXPECT_EQ(i.tx_bytes, 0u);
  }
  EXPECT_TRUE(kept);
  untrack(kBase + 300);
}
