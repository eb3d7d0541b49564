// Probe wire format: round trip, and every kind of damage is rejected.
#include <gtest/gtest.h>

#include <array>

#include "clocksync/wire.h"

namespace shunt::clocksync {
namespace {

Probe sample() {
  Probe p;
  p.path = 1;
  p.idx = 1;
  p.sender_id = 42;
  p.receiver_id = 7;
  p.seq = 1000;
  p.tx_app_ns = 1'700'000'000'000'000'000;
  p.fu_seq = 999;
  p.fu_tx0 = 1'699'999'999'900'000'000;
  p.fu_tx1 = 1'699'999'999'900'003'000;
  p.n_feedback = 1;
  p.feedback[0] = {555, 1'700'000'000'000'100'000, 1'700'000'000'000'103'000, 77};
  p.n_gossip = 2;
  p.gossip[0] = {9, -1234567, 80'000'000, 900, 12};
  p.gossip[1] = {10, 7654321, -95'000'000, 400, 3};
  return p;
}

TEST(ClocksyncWire, RoundTrips) {
  Key k = derive_probe_key("secret");
  std::array<uint8_t, kMaxProbeSize> buf;
  size_t n = encode(sample(), k, buf);
  ASSERT_EQ(n, encoded_size(2));
  Probe q;
  ASSERT_EQ(decode({buf.data(), n}, k, &q), DecodeStatus::ok);
  EXPECT_EQ(q.seq, 1000u);
  EXPECT_EQ(q.fu_tx1, sample().fu_tx1);
  EXPECT_EQ(q.feedback[0].rx_count, 77u);
  EXPECT_EQ(q.gossip[1].drift_ps_s, -95'000'000);
  EXPECT_EQ(q.n_gossip, 2);
}

TEST(ClocksyncWire, WrongKeyIsRejected) {
  std::array<uint8_t, kMaxProbeSize> buf;
  size_t n = encode(sample(), derive_probe_key("secret"), buf);
  Probe q;
  EXPECT_EQ(decode({buf.data(), n}, derive_probe_key("other"), &q), DecodeStatus::bad_tag);
}

TEST(ClocksyncWire, EveryFlippedBitIsRejected) {
  Key k = derive_probe_key("secret");
  std::array<uint8_t, kMaxProbeSize> buf;
  size_t n = encode(sample(), k, buf);
  for (size_t i = 0; i < n * 8; i++) {
    auto copy = buf;
    copy[i / 8] ^= uint8_t(1u << (i % 8));
    Probe q;
    EXPECT_NE(decode({copy.data(), n}, k, &q), DecodeStatus::ok) << "bit " << i;
  }
}

TEST(ClocksyncWire, TruncatedAndPaddedAreRejected) {
  Key k = derive_probe_key("secret");
  std::array<uint8_t, kMaxProbeSize + 8> buf{};
  size_t n = encode(sample(), k, buf);
  Probe q;
  for (size_t len = 0; len < n; len++) EXPECT_NE(decode({buf.data(), len}, k, &q), DecodeStatus::ok);
  EXPECT_NE(decode({buf.data(), n + 1}, k, &q), DecodeStatus::ok);
}

TEST(ClocksyncWire, SignedButOutOfRangeFieldsAreRejected) {
  Key k = derive_probe_key("secret");
  std::array<uint8_t, kMaxProbeSize> buf;
  size_t n = encode(sample(), k, buf);
  auto resigned = [&](size_t off, uint8_t v) {
    auto c = buf;
    c[off] = v;
    sign({c.data(), n}, k);
    Probe q;
    return decode({c.data(), n}, k, &q);
  };
  EXPECT_EQ(resigned(5, 2), DecodeStatus::bad_field);   // pair index 2
  EXPECT_EQ(resigned(6, 3), DecodeStatus::bad_field);   // 3 feedback entries
  EXPECT_EQ(resigned(2, 2), DecodeStatus::bad_version);
  EXPECT_EQ(resigned(39, 0x80), DecodeStatus::bad_field);  // negative send stamp
}

}  // namespace
}  // namespace shunt::clocksync
