#include "clocksync/wire.h"

#include <sodium.h>

#include <cstring>
#include <mutex>

namespace shunt::clocksync {

namespace {

void init_sodium() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (sodium_init() < 0) __builtin_trap();  // only fails without entropy; nothing safe to do
  });
}

struct Writer {
  uint8_t* p;
  void u8(uint8_t v) { *p++ = v; }
  void u16(uint16_t v) { for (int i = 0; i < 2; i++) *p++ = static_cast<uint8_t>(v >> (8 * i)); }
  void u32(uint32_t v) { for (int i = 0; i < 4; i++) *p++ = static_cast<uint8_t>(v >> (8 * i)); }
  void u64(uint64_t v) { for (int i = 0; i < 8; i++) *p++ = static_cast<uint8_t>(v >> (8 * i)); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
};

struct Reader {
  const uint8_t* p;
  uint8_t u8() { return *p++; }
  uint16_t u16() { uint16_t v = 0; for (int i = 0; i < 2; i++) v |= uint16_t(*p++) << (8 * i); return v; }
  uint32_t u32() { uint32_t v = 0; for (int i = 0; i < 4; i++) v |= uint32_t(*p++) << (8 * i); return v; }
  uint64_t u64() { uint64_t v = 0; for (int i = 0; i < 8; i++) v |= uint64_t(*p++) << (8 * i); return v; }
  int64_t i64() { return static_cast<int64_t>(u64()); }
};

void mac(const uint8_t* msg, size_t len, const Key& key, uint8_t* tag) {
  crypto_generichash(tag, kTagSize, msg, len, key.data(), key.size());
}

}  // namespace

Key derive_probe_key(std::string_view job_secret) {
  init_sodium();
  static constexpr char kDomain[] = "shunt probe key v1";
  Key k{};
  crypto_generichash_state st;
  crypto_generichash_init(&st, reinterpret_cast<const uint8_t*>(kDomain), sizeof(kDomain) - 1,
                          k.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(job_secret.data()),
                            job_secret.size());
  crypto_generichash_final(&st, k.data(), k.size());
  return k;
}

size_t encode(const Probe& p, const Key& key, std::span<uint8_t> out) {
  init_sodium();
  size_t n = encoded_size(p.n_gossip);
  if (out.size() < n || p.n_gossip > kMaxGossip || p.n_feedback > kMaxFeedback) return 0;
  Writer w{out.data()};
  w.u16(kProbeMagic);
  w.u8(kProbeVersion);
  w.u8(kTypeProbe);
  w.u8(p.path);
  w.u8(p.idx);
  w.u8(p.n_feedback);
  w.u8(p.n_gossip);
  w.u64(p.sender_id);
  w.u64(p.receiver_id);
  w.u64(p.seq);
  w.i64(p.tx_app_ns);
  w.u64(p.fu_seq);
  w.i64(p.fu_tx0);
  w.i64(p.fu_tx1);
  for (int i = 0; i < kMaxFeedback; i++) {
    const Feedback& f = i < p.n_feedback ? p.feedback[i] : Feedback{};
    w.u64(f.seq);
    w.i64(f.rx0);
    w.i64(f.rx1);
    w.u32(f.rx_count);
    w.u32(0);
  }
  for (int i = 0; i < p.n_gossip; i++) {
    const Gossip& g = p.gossip[i];
    w.u64(g.peer_id);
    w.i64(g.offset_ns);
    w.i64(g.drift_ps_s);
    w.u32(g.bound_ns);
    w.u32(g.age_ms);
  }
  mac(out.data(), n - kTagSize, key, w.p);
  return n;
}

void sign(std::span<uint8_t> d, const Key& key) {
  init_sodium();
  if (d.size() >= kTagSize) mac(d.data(), d.size() - kTagSize, key, d.data() + d.size() - kTagSize);
}

DecodeStatus decode(std::span<const uint8_t> in, const Key& key, Probe* out) {
  init_sodium();
  if (in.size() < kFixedSize + kTagSize || in.size() > kMaxProbeSize) return DecodeStatus::short_or_long;
  Reader r{in.data()};
  if (r.u16() != kProbeMagic) return DecodeStatus::bad_magic;
  if (r.u8() != kProbeVersion) return DecodeStatus::bad_version;
  if (r.u8() != kTypeProbe) return DecodeStatus::bad_field;
  Probe p;
  p.path = r.u8();
  p.idx = r.u8();
  p.n_feedback = r.u8();
  p.n_gossip = r.u8();
  if (p.idx > 1 || p.n_feedback > kMaxFeedback || p.n_gossip > kMaxGossip)
    return DecodeStatus::bad_field;
  if (in.size() != encoded_size(p.n_gossip)) return DecodeStatus::short_or_long;
  // Authenticate before trusting any further field.
  uint8_t tag[kTagSize];
  mac(in.data(), in.size() - kTagSize, key, tag);
  if (crypto_verify_16(tag, in.data() + in.size() - kTagSize) != 0) return DecodeStatus::bad_tag;
  p.sender_id = r.u64();
  p.receiver_id = r.u64();
  p.seq = r.u64();
  p.tx_app_ns = r.i64();
  p.fu_seq = r.u64();
  p.fu_tx0 = r.i64();
  p.fu_tx1 = r.i64();
  for (int i = 0; i < kMaxFeedback; i++) {
    Feedback& f = p.feedback[i];
    f.seq = r.u64();
    f.rx0 = r.i64();
    f.rx1 = r.i64();
    f.rx_count = r.u32();
    if (r.u32() != 0) return DecodeStatus::bad_field;
    // Unused slots must be empty, so every accepted datagram has one encoding.
    if (i >= p.n_feedback && (f.seq != kNoSeq || f.rx0 || f.rx1 || f.rx_count))
      return DecodeStatus::bad_field;
  }
  for (int i = 0; i < p.n_gossip; i++) {
    Gossip& g = p.gossip[i];
    g.peer_id = r.u64();
    g.offset_ns = r.i64();
    g.drift_ps_s = r.i64();
    g.bound_ns = r.u32();
    g.age_ms = r.u32();
  }
  // Stamps are ns since the epoch: negative ones are never produced.
  auto bad_stamp = [](int64_t v) { return v < 0; };
  if (p.sender_id == 0 || p.seq == kNoSeq || bad_stamp(p.tx_app_ns) || bad_stamp(p.fu_tx0) ||
      bad_stamp(p.fu_tx1))
    return DecodeStatus::bad_field;
  for (int i = 0; i < kMaxFeedback; i++)
    if (bad_stamp(p.feedback[i].rx0) || bad_stamp(p.feedback[i].rx1)) return DecodeStatus::bad_field;
  for (int i = 0; i < p.n_gossip; i++) {
    const Gossip& g = p.gossip[i];
    // |drift| above 1000 ppm is no crystal: a corrupt or hostile estimate.
    if (g.peer_id == 0 || g.drift_ps_s > 1'000'000'000 || g.drift_ps_s < -1'000'000'000)
      return DecodeStatus::bad_field;
  }
  *out = p;
  return DecodeStatus::ok;
}

const char* to_string(DecodeStatus s) {
  switch (s) {
    case DecodeStatus::ok: return "ok";
    case DecodeStatus::short_or_long: return "bad length";
    case DecodeStatus::bad_magic: return "bad magic";
    case DecodeStatus::bad_version: return "unknown version";
    case DecodeStatus::bad_field: return "field out of range";
    case DecodeStatus::bad_tag: return "authentication failed";
  }
  return "?";
}

}  // namespace shunt::clocksync
