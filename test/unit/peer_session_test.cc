#include <gtest/gtest.h>

#include "peer/session.h"

using namespace shunt::peer;
using nlohmann::json;

namespace {
const RequestHandler kEcho = [](const json& r) { return json{{"echo", r}}; };

struct Pair {
  ServerSession s;
  ClientSession c;
  std::string why;
  Pair(const Key& sk, const Key& ck) : s(sk, random_nonce()), c(ck, random_nonce()) {}
  // Runs the handshake; returns false when either end drops.
  bool handshake() {
    std::vector<uint8_t> to_s, to_c = s.hello();
    for (int i = 0; i < 4 && !c.ready(); i++) {
      to_s.clear();
      if (!c.on_bytes(to_c.data(), to_c.size(), &to_s, &why)) return false;
      to_c.clear();
      if (!to_s.empty() && !s.on_bytes(to_s.data(), to_s.size(), kEcho, &to_c, &why)) return false;
    }
    return c.ready() && s.authenticated();
  }
};
}  // namespace

TEST(PeerSession, HandshakeThenRequestReply) {
  Key k = job_key_from("secret");
  Pair p(k, k);
  ASSERT_TRUE(p.handshake()) << p.why;
  for (int i = 0; i < 3; i++) {
    auto req = p.c.request({{"cmd", "ping"}, {"i", i}});
    std::vector<uint8_t> rep;
    ASSERT_TRUE(p.s.on_bytes(req.data(), req.size(), kEcho, &rep, &p.why)) << p.why;
    // Delivered one byte at a time: framing must cope with any split.
    for (uint8_t b : rep) ASSERT_TRUE(p.c.on_bytes(&b, 1, nullptr, &p.why)) << p.why;
    ASSERT_TRUE(p.c.has_reply());
    EXPECT_EQ(p.c.take_reply()["echo"]["i"], i);
  }
}

TEST(PeerSession, WrongKeyIsRefusedByBothEnds) {
  Pair p(job_key_from("right"), job_key_from("wrong"));
  EXPECT_FALSE(p.handshake());
  EXPECT_NE(p.why.find("wrong job key"), std::string::npos) << p.why;
  EXPECT_FALSE(p.s.authenticated());
}

TEST(PeerSession, RequestBeforeAuthIsRefused) {
  Key k = job_key_from("k");
  ServerSession s(k, random_nonce());
  Frame f;
  f.type = FrameType::request;
  f.seq = 1;
  f.payload = R"({"cmd":"ping"})";
  auto bytes = encode_frame(f, k);
  std::vector<uint8_t> out;
  std::string why;
  EXPECT_FALSE(s.on_bytes(bytes.data(), bytes.size(), kEcho, &out, &why));
  EXPECT_EQ(why, "expected auth");
  EXPECT_TRUE(out.empty());
}

TEST(PeerSession, TamperedReplayedAndOversizedFramesAreRefused) {
  Key k = job_key_from("k");
  {
    Pair p(k, k);
    ASSERT_TRUE(p.handshake());
    auto req = p.c.request({{"cmd", "ping"}});
    req[kHeaderLen + 2] ^= 1;  // flip a payload bit
    std::vector<uint8_t> out;
    EXPECT_FALSE(p.s.on_bytes(req.data(), req.size(), kEcho, &out, &p.why));
    EXPECT_EQ(p.why, "bad MAC");
  }
  {
    Pair p(k, k);
    ASSERT_TRUE(p.handshake());
    auto req = p.c.request({{"cmd", "ping"}});
    std::vector<uint8_t> out;
    ASSERT_TRUE(p.s.on_bytes(req.data(), req.size(), kEcho, &out, &p.why));
    EXPECT_FALSE(p.s.on_bytes(req.data(), req.size(), kEcho, &out, &p.why)) << "a replay must fail";
    EXPECT_NE(p.why.find("sequence"), std::string::npos);
  }
  {
    ServerSession s(k, random_nonce());
    uint8_t h[kHeaderLen] = {'S', 'H', 'N', 'T', kVersion, 4, 0, 0, 0xff, 0xff, 0xff, 0x7f};
    std::vector<uint8_t> out;
    std::string why;
    EXPECT_FALSE(s.on_bytes(h, sizeof h, kEcho, &out, &why));
    EXPECT_NE(why.find("payload of"), std::string::npos);
  }
}

TEST(PeerSession, GarbageIsMalformedAtOnce) {
  ServerSession s(job_key_from("k"), random_nonce());
  std::vector<uint8_t> out;
  std::string why;
  const uint8_t junk[] = "GET / HTTP/1.0\r\n";
  EXPECT_FALSE(s.on_bytes(junk, 3, kEcho, &out, &why)) << "three bytes already show it is no frame";
  EXPECT_EQ(why, "bad magic");
  ServerSession s2(job_key_from("k"), random_nonce());
  uint8_t badver[kHeaderLen] = {'S', 'H', 'N', 'T', 9, 4};
  EXPECT_FALSE(s2.on_bytes(badver, sizeof badver, kEcho, &out, &why));
  EXPECT_EQ(why, "unsupported version 9");
}
