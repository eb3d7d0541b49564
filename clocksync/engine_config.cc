// EngineConfig from the SHUNT_* variables (params.def, clocksync section).
#include <unistd.h>

#include "clocksync/engine.h"
#include "core/config.h"
#include "core/roce_rails.h"

namespace shunt::clocksync {

bool engine_config_from(const Config& c, EngineConfig* out, std::vector<PeerSpec>* peers,
                        std::string* err) {
  EngineConfig e;
  int pid = int(getpid());
  e.name = expand_pattern(c.str(Param::probe_name), pid);
  e.local_addrs = probe_rails(c).addrs;
  e.port = uint16_t(c.num(Param::probe_port));
  e.interval_ns = c.num(Param::probe_interval_ms) * 1'000'000;
  e.dead_ns = c.num(Param::path_dead_ms) * 1'000'000;
  e.rail_every = int(c.num(Param::rail_probe_every));
  e.source_every = int(c.num(Param::source_probe_every));
  e.spare_every = int(c.num(Param::spare_probe_every));
  e.pair_tol_ns = c.num(Param::probe_pair_tol_ns);
  // No job key, no key: start() refuses to probe (a key everyone can derive
  // lets anyone forge probes).
  if (!c.str(Param::job_key).empty()) e.key = derive_probe_key(c.str(Param::job_key));
  auto tc = parse_test_clock(c.str(Param::test_clock), err);
  if (!tc) {
    if (err) *err = "SHUNT_TEST_CLOCK: " + *err;
    return false;
  }
  e.test_clock = *tc;
  e.shm_name = expand_pattern(c.str(Param::clock_shm), pid);
  if (peers && !parse_peers(c.str(Param::peers), peers, err)) {
    if (err) *err = "SHUNT_PEERS: " + *err;
    return false;
  }
  *out = std::move(e);
  return true;
}

}  // namespace shunt::clocksync
