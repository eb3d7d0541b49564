// Flow labels, UDP source ports and PSNs of a bundle's paths, GIDs and a bundle's phase as text.
#include "interpose/verbs/bundle/parts.h"

#include <sys/random.h>

#include <cstring>
#include <cstdio>

#include "core/mono.h"

namespace shunt::verbs::bundle {

std::string gid_hex(const ibv_gid& g) {
  char s[33];
  for (int i = 0; i < 16; i++) snprintf(s + 2 * i, 3, "%02x", g.raw[i]);
  return std::string(s, 32);
}

// No thread_local generator: libshunt's TLS must stay small enough for the
// static TLS block when a program dlopens it.
uint32_t random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(mono_ms() * 2654435761u);
  return v & 0xffffff;
}

// Flow labels below 0x4000 give UDP source port 0xC000 | label (the
// kernel's rdma_flow_label_to_udp_sport), so path i gets a port of its own.
// The seed mixes in the local address, so the two ends' shadows (often of
// equal QPNs on fresh hosts) use different ports.
uint32_t flow_label_for(uint32_t seed, int i) { return ((seed * 2654435761u >> 18) + 977u * (i + 1)) % 0x3fff + 1; }
uint32_t label_seed(uint32_t qpn, const ibv_gid& lgid) {
  uint32_t a;
  memcpy(&a, lgid.raw + 12, 4);
  return qpn ^ (a * 2246822519u);
}
uint32_t label_seed(const Bundle* b) { return label_seed(b->pqp->qp_num, b->lgid); }

// The UDP source port a RoCE v2 QP with flow label fl uses (the kernel's
// rdma_flow_label_to_udp_sport; 0xC000 | fl below 0x4000).
uint32_t sport_of(uint32_t fl) { return 0xC000 | ((fl & 0x3fff) ^ ((fl & 0xFC000) >> 14)); }
// A path's source port, 0 where the device chose it (no flow label).
uint32_t path_sport(const Path& p) { return p.flow_label ? sport_of(p.flow_label) : 0; }

bool parse_gid(const std::string& hex, ibv_gid* g) {
  if (hex.size() != 32) return false;
  for (int i = 0; i < 16; i++) {
    unsigned v;
    if (sscanf(hex.c_str() + 2 * i, "%2x", &v) != 1) return false;
    g->raw[i] = static_cast<uint8_t>(v);
  }
  return true;
}

std::string phase_text(Phase p, const std::string& why, bool destroyed) {
  std::string t;
  switch (p) {
    case Phase::waiting_rts: t = "waiting for RTS"; break;
    case Phase::setting_up: t = "setting up"; break;
    case Phase::waiting_peer: t = "waiting for the peer's shim"; break;
    case Phase::finding_paths: t = "finding paths"; break;
    case Phase::asking_peer: t = "asking the peer"; break;
    case Phase::joined: t = "joined, waiting for activation"; break;
    case Phase::active: t = "active"; break;
    case Phase::primary_only: t = "primary-only: " + why; break;
    case Phase::failed: t = "failed: " + why; break;
  }
  return destroyed ? t + " (destroyed)" : t;
}

void set_phase(Bundle* b, Phase p, std::string why) {
  b->phase = p;
  b->why = std::move(why);
}

// The side with the lower (GID, QPN) sets the bundle up; the other answers.
bool initiates(const Bundle* b) {
  int c = memcmp(b->lgid.raw, b->rgid.raw, 16);
  return c < 0 || (c == 0 && b->pqp->qp_num < b->rqpn);
}

}  // namespace shunt::verbs::bundle
