#include "peer/wire.h"

#include <sodium.h>

#include <cstring>

namespace shunt::peer {

namespace {
void put16(uint8_t* p, uint16_t v) { p[0] = v & 0xff, p[1] = v >> 8; }
void put32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (v >> (8 * i)) & 0xff;
}
void put64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (v >> (8 * i)) & 0xff;
}
uint16_t get16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t get32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
uint64_t get64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

void header(const Frame& f, uint8_t* h) {
  memcpy(h, "SHNT", 4);
  h[4] = f.version;
  h[5] = static_cast<uint8_t>(f.type);
  put16(h + 6, f.flags);
  put32(h + 8, static_cast<uint32_t>(f.payload.size()));
  put64(h + 12, f.seq);
}

std::array<uint8_t, kMacLen> mac_of(const Frame& f, const Key& key) {
  uint8_t h[kHeaderLen];
  header(f, h);
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key.data(), key.size());
  crypto_auth_hmacsha256_update(&st, h, sizeof h);
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(f.payload.data()), f.payload.size());
  std::array<uint8_t, kMacLen> m;
  crypto_auth_hmacsha256_final(&st, m.data());
  return m;
}

std::array<uint8_t, 32> derive(const Key& job, const char* label, const Nonce& s, const Nonce& c) {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, job.data(), job.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(label), strlen(label) + 1);
  crypto_auth_hmacsha256_update(&st, s.data(), s.size());
  crypto_auth_hmacsha256_update(&st, c.data(), c.size());
  std::array<uint8_t, 32> out;
  crypto_auth_hmacsha256_final(&st, out.data());
  return out;
}

bool known_type(uint8_t t) { return t >= 1 && t <= 5; }
}  // namespace

Key job_key_from(std::string_view text) {
  if (sodium_init() < 0) {}  // idempotent; crypto_generichash works regardless
  Key k;
  crypto_generichash(k.data(), k.size(), reinterpret_cast<const uint8_t*>(text.data()), text.size(),
                     reinterpret_cast<const uint8_t*>("shunt-job-key"), 13);
  return k;
}

Parse parse_frame(const uint8_t* buf, size_t len, Frame* out, size_t* consumed, std::string* why) {
  if (len >= 4 && memcmp(buf, "SHNT", 4) != 0) return *why = "bad magic", Parse::malformed;
  if (len < kHeaderLen) {
    // A short prefix that already cannot be a header is malformed now.
    for (size_t i = 0; i < len && i < 4; i++)
      if (buf[i] != static_cast<uint8_t>("SHNT"[i])) return *why = "bad magic", Parse::malformed;
    return Parse::need_more;
  }
  if (buf[4] != kVersion) return *why = "unsupported version " + std::to_string(buf[4]), Parse::malformed;
  if (!known_type(buf[5])) return *why = "unknown frame type " + std::to_string(buf[5]), Parse::malformed;
  uint32_t n = get32(buf + 8);
  if (n > kMaxPayload) return *why = "payload of " + std::to_string(n) + " bytes", Parse::too_large;
  if (len < kHeaderLen + n + kMacLen) return Parse::need_more;
  out->version = buf[4];
  out->type = static_cast<FrameType>(buf[5]);
  out->flags = get16(buf + 6);
  out->seq = get64(buf + 12);
  out->payload.assign(reinterpret_cast<const char*>(buf + kHeaderLen), n);
  memcpy(out->mac.data(), buf + kHeaderLen + n, kMacLen);
  *consumed = kHeaderLen + n + kMacLen;
  return Parse::ok;
}

std::vector<uint8_t> encode_frame(const Frame& f, const Key& key) {
  std::vector<uint8_t> out(kHeaderLen + f.payload.size() + kMacLen);
  header(f, out.data());
  memcpy(out.data() + kHeaderLen, f.payload.data(), f.payload.size());
  std::array<uint8_t, kMacLen> m{};
  if (f.type != FrameType::hello) m = mac_of(f, key);
  memcpy(out.data() + kHeaderLen + f.payload.size(), m.data(), kMacLen);
  return out;
}

bool verify_frame(const Frame& f, const Key& key) {
  auto m = mac_of(f, key);
  return sodium_memcmp(m.data(), f.mac.data(), kMacLen) == 0;
}

Nonce random_nonce() {
  Nonce n;
  randombytes_buf(n.data(), n.size());
  return n;
}

std::array<uint8_t, 32> client_proof(const Key& job, const Nonce& s, const Nonce& c) {
  return derive(job, "shunt-peer-v1 client", s, c);
}
std::array<uint8_t, 32> server_proof(const Key& job, const Nonce& s, const Nonce& c) {
  return derive(job, "shunt-peer-v1 server", s, c);
}
Key session_key(const Key& job, const Nonce& s, const Nonce& c) {
  return derive(job, "shunt-peer-v1 session", s, c);
}

}  // namespace shunt::peer
