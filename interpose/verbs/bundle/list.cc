// The process's bundles: their list (never freed: `dead` marks the
// destroyed), one found by its QP, and whether one is still alive.
#include "interpose/verbs/bundle/parts.h"

namespace shunt::verbs::bundle {

std::mutex g_mu;  // the list of bundles
std::vector<Bundle*>* g_bundles = nullptr;

bool alive(Bundle* b) {
  std::lock_guard g(b->mu);
  return !b->dead;
}

Bundle* find_bundle(const std::string& gid, uint32_t qpn) {
  std::lock_guard g(g_mu);
  if (!g_bundles) return nullptr;
  for (auto it = g_bundles->rbegin(); it != g_bundles->rend(); ++it) {
    Bundle* b = *it;
    if (b->pqp->qp_num == qpn && gid_hex(b->lgid) == gid) {
      std::lock_guard m(b->mu);
      if (!b->dead) return b;
    }
  }
  return nullptr;
}

// Every bundle this process made (they are never freed: `dead` marks the
// destroyed), for the watch to walk without holding the list's lock.
std::vector<Bundle*> all_bundles() {
  std::lock_guard g(g_mu);
  return g_bundles ? *g_bundles : std::vector<Bundle*>{};
}

}  // namespace shunt::verbs::bundle
