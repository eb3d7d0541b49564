// Frames of the control channel between the shims of two hosts (TCP, the
// agents' SHUNT_PEER_PORT). Every frame is
//   header (20 bytes, little-endian) | payload (JSON text) | MAC (32 bytes)
// header = "SHNT" | version u8 | type u8 | flags u16 | length u32 | seq u64.
// The MAC is HMAC-SHA-256 over header and payload with the session key,
// which both ends derive from the job key (SHUNT_JOB_KEY) and two fresh
// nonces after proving to each other that they hold it. Sequence numbers
// rise by one per frame and direction, so a replayed, dropped or reordered
// frame fails. Anything malformed, unauthenticated or larger than
// kMaxPayload ends the connection.
#pragma once
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shunt::peer {

constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderLen = 20, kMacLen = 32, kNonceLen = 32;
constexpr uint32_t kMaxPayload = 64 * 1024;

enum class FrameType : uint8_t {
  hello = 1,    // server -> client: server nonce (no MAC: there is no key yet)
  auth = 2,     // client -> server: client nonce + proof (MAC with the job key)
  auth_ok = 3,  // server -> client: server proof (MAC with the job key)
  request = 4,  // JSON request, MAC with the session key
  reply = 5,    // JSON reply, MAC with the session key
};

using Key = std::array<uint8_t, 32>;

// The job key from SHUNT_JOB_KEY text (any length; hashed to 32 bytes).
Key job_key_from(std::string_view text);

struct Frame {
  uint8_t version = kVersion;
  FrameType type = FrameType::request;
  uint16_t flags = 0;
  uint64_t seq = 0;
  std::string payload;
  std::array<uint8_t, kMacLen> mac{};
};

enum class Parse { ok, need_more, malformed, too_large };

// Parses one frame from the front of `buf`. On ok sets *consumed; on
// malformed/too_large sets *why (for the one log line).
Parse parse_frame(const uint8_t* buf, size_t len, Frame* out, size_t* consumed, std::string* why);

// Serializes a frame, computing its MAC with `key` (all-zero MAC for hello).
std::vector<uint8_t> encode_frame(const Frame& f, const Key& key);
// Checks the frame's MAC against `key` in constant time.
bool verify_frame(const Frame& f, const Key& key);

// The handshake's derived values (domain-separated HMACs of both nonces).
using Nonce = std::array<uint8_t, kNonceLen>;
Nonce random_nonce();
std::array<uint8_t, 32> client_proof(const Key& job, const Nonce& server, const Nonce& client);
std::array<uint8_t, 32> server_proof(const Key& job, const Nonce& server, const Nonce& client);
Key session_key(const Key& job, const Nonce& server, const Nonce& client);

}  // namespace shunt::peer
