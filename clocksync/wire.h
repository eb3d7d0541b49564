// Probe datagram: fixed little-endian layout, authenticated with keyed
// BLAKE2b (libsodium crypto_generichash, 16-byte tag) over every byte before
// the tag. decode() accepts a datagram only if every field is in range, the
// length is exact and the tag verifies; anything else is dropped by the caller
// before it can touch an estimate.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace shunt::clocksync {

inline constexpr uint16_t kProbeMagic = 0x5348;  // "SH"
inline constexpr uint8_t kProbeVersion = 1;
inline constexpr uint8_t kTypeProbe = 1;
inline constexpr int kMaxFeedback = 2;
inline constexpr int kMaxGossip = 4;
inline constexpr size_t kFixedSize = 128;
inline constexpr size_t kGossipSize = 32;
inline constexpr size_t kTagSize = 16;
inline constexpr size_t kMaxProbeSize = kFixedSize + kMaxGossip * kGossipSize + kTagSize;
inline constexpr uint64_t kNoSeq = ~0ull;

// Receive stamps the sender took for one of the receiver's earlier pairs.
struct Feedback {
  uint64_t seq = kNoSeq;
  int64_t rx0 = 0, rx1 = 0;  // 0: that probe of the pair was not received
  uint32_t rx_count = 0;     // probes received so far from the receiver on this path
};

// The sender's current estimate of another host's clock (network effect).
struct Gossip {
  uint64_t peer_id = 0;
  int64_t offset_ns = 0;     // that peer's clock minus the sender's, at the send time
  int64_t drift_ps_s = 0;    // d(offset)/dt in ps per s (1000 = 1 ppb)
  uint32_t bound_ns = 0;
  uint32_t age_ms = 0;
};

struct Probe {
  uint8_t path = 0;          // rail index on both ends
  uint8_t idx = 0;           // 0 or 1 within a coded pair
  uint8_t n_feedback = 0;
  uint8_t n_gossip = 0;
  uint64_t sender_id = 0, receiver_id = 0;
  uint64_t seq = 0;          // pair sequence per (sender, receiver, path)
  int64_t tx_app_ns = 0;     // sender's clock just before sending (user space)
  uint64_t fu_seq = kNoSeq;  // follow-up: kernel send stamps of the sender's previous pair
  int64_t fu_tx0 = 0, fu_tx1 = 0;
  std::array<Feedback, kMaxFeedback> feedback{};
  std::array<Gossip, kMaxGossip> gossip{};
};

using Key = std::array<uint8_t, 32>;

// Derives the probe key from the job secret (domain-separated, so the same
// secret used elsewhere yields a different key).
Key derive_probe_key(std::string_view job_secret);

// Writes the datagram into `out` (at least kMaxProbeSize bytes); returns its
// length.
size_t encode(const Probe& p, const Key& key, std::span<uint8_t> out);

// Writes the tag over the rest of a datagram (its last kTagSize bytes).
void sign(std::span<uint8_t> datagram, const Key& key);

enum class DecodeStatus { ok, short_or_long, bad_magic, bad_version, bad_field, bad_tag };
DecodeStatus decode(std::span<const uint8_t> in, const Key& key, Probe* out);
const char* to_string(DecodeStatus s);

inline size_t encoded_size(int n_gossip) { return kFixedSize + n_gossip * kGossipSize + kTagSize; }

}  // namespace shunt::clocksync
