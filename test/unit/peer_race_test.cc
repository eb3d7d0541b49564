// peer::race against a peer some of whose connections are lost on the way
// (a dead spine drops their packets): a fake peer on loopback accepts every
// connection but stays silent on the first ones, as if the SYN or the
// replies were dropped, and serves the later ones like the real listener.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "peer/channel.h"
#include "peer/session.h"

using namespace shunt::peer;
using nlohmann::json;

namespace {
struct FakePeer {
  int fd = -1, port = 0, silent = 0;
  Key key;
  std::atomic<int> accepted{0}, served{0};
  std::atomic<bool> stop{false};
  std::vector<int> held;
  std::thread t;

  FakePeer(const Key& k, int silent_first) : silent(silent_first), key(k) {
    fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t al = sizeof a;
    if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(fd, 64) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &al) != 0)
      return;
    port = ntohs(a.sin_port);
    t = std::thread([this] { run(); });
  }
  ~FakePeer() {
    stop = true;
    if (t.joinable()) t.join();
    for (int h : held) ::close(h);
    ::close(fd);
  }
  void run() {
    while (!stop) {
      pollfd p{fd, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      int c = ::accept4(fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      if (accepted++ < silent) {
        held.push_back(c);  // lost on the way: never a byte back
        continue;
      }
      serve(c);
      ::close(c);
    }
  }
  void serve(int c) {
    ServerSession s(key, random_nonce());
    auto hello = s.hello();
    if (::send(c, hello.data(), hello.size(), MSG_NOSIGNAL) < 0) return;
    auto h = [this](const json& r) {
      served++;
      return json{{"echo", r}};
    };
    for (int i = 0; i < 50 && !stop; i++) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 20) <= 0) continue;
      uint8_t buf[4096];
      ssize_t n = ::recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      std::vector<uint8_t> out;
      std::string why;
      if (!s.on_bytes(buf, static_cast<size_t>(n), h, &out, &why)) return;
      if (!out.empty() && ::send(c, out.data(), out.size(), MSG_NOSIGNAL) < 0) return;
    }
  }
};

// One round against a fake peer silent on its first `silent` connections.
struct Round {
  std::optional<json> reply;
  std::string err;
  size_t winner = 9;
  int64_t ms = 0;
  int accepted = 0, served = 0;
};
Round race_round(int silent, const json& req, int timeout_ms, int hedge_ms, int hedges, int settle_ms = 0) {
  Key k = job_key_from("race");
  FakePeer peer(k, silent);
  Round o;
  if (peer.port <= 0) return o;
  auto t0 = std::chrono::steady_clock::now();
  o.reply = race({"127.0.0.1"}, peer.port, k, req, timeout_ms, &o.winner, &o.err, hedge_ms, hedges);
  o.ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  std::this_thread::sleep_for(std::chrono::milliseconds(settle_ms));  // late connections, if any, arrive
  o.accepted = peer.accepted.load();
  o.served = peer.served.load();
  return o;
}
}  // namespace

// Without a second connection the round would wait out its timeout on the
// first and come back empty.
TEST(PeerRace, ANewConnectionGetsThroughWhereTheFirstIsLost) {
  Round o = race_round(2, {{"cmd", "ping"}, {"rid", 7}}, 1000, 100, 6);
  ASSERT_TRUE(o.reply.has_value()) << o.err;
  EXPECT_EQ((*o.reply)["echo"]["rid"], 7);
  EXPECT_EQ(o.winner, 0u);
  EXPECT_GE(o.accepted, 3);  // two lost, the third served
  EXPECT_LT(o.ms, 1000) << "the round waited for the lost connections";
}

// A healthy peer answers the first connection: no more are opened.
TEST(PeerRace, AHealthyPeerGetsOneConnection) {
  Round o = race_round(0, {{"cmd", "ping"}}, 1000, 300, 6, 400);
  ASSERT_TRUE(o.reply.has_value()) << o.err;
  EXPECT_EQ(o.accepted, 1);
  EXPECT_EQ(o.served, 1);
}

// Every connection lost: the round ends empty, after the last hedge's
// timeout, with the reason.
TEST(PeerRace, EveryConnectionLostEndsTheRoundEmpty) {
  Round o = race_round(100, {{"cmd", "ping"}}, 300, 50, 3);
  EXPECT_FALSE(o.reply.has_value());
  EXPECT_FALSE(o.err.empty());
  EXPECT_EQ(o.accepted, 3);
}
