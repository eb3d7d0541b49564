// TEST ONLY: a probe engine with source paths, for test/e2e/44-clocksync-
// srcport.sh, which builds it (it is not part of the library or `all`).
// Runs one engine with the given rails and peers, adds a source path per
// --source, and every --status-ms rewrites --status (atomically) with the
// engine's report as JSON, plus every source path liveness change with the
// kernel time it happened.
//
//   source_paths_probe --name N --listen ADDR[,ADDR] --peer NAME=ADDR[,ADDR]...
//       [--source PEER:RAIL:PORT]... [--interval-ms 100] [--dead-ms 250]
//       [--duration S] --status FILE [--status-ms 100]
// Key: SHUNT_JOB_KEY. Exits 2 on bad arguments, 1 when the engine or a
// source path cannot start (the reason on stderr).
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "clocksync/engine.h"

using namespace shunt::clocksync;
using json = nlohmann::json;

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_signal(int) { g_stop = 1; }

json stats_json(const PathStats& s) {
  return {{"alive", s.alive},           {"sent", s.sent},           {"received", s.received},
          {"fwd_p50_ns", s.fwd_p50_ns}, {"fwd_p99_ns", s.fwd_p99_ns}, {"rev_p50_ns", s.rev_p50_ns},
          {"rev_p99_ns", s.rev_p99_ns}, {"fwd_loss", s.fwd_loss},     {"rev_loss", s.rev_loss},
          {"delay_samples", s.delay_samples}};
}

int usage(const char* why) {
  fprintf(stderr, "source_paths_probe: %s\n", why);
  return 2;
}
}  // namespace

int main(int argc, char** argv) {
  EngineConfig ec;
  ec.want_hw = false;
  ec.shm_name = "";
  std::vector<PeerSpec> peers;
  struct Src {
    std::string peer;
    int rail;
    int port;
  };
  std::vector<Src> srcs;
  std::string status;
  double duration = 30, status_ms = 100;
  std::string err;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (i + 1 >= argc) return usage(("missing value for " + a).c_str());
    std::string v = argv[++i];
    if (a == "--name") {
      ec.name = v;
    } else if (a == "--listen") {
      std::vector<PeerSpec> tmp;
      if (!parse_peers("self=" + v, &tmp, &err)) return usage(err.c_str());
      ec.local_addrs = tmp[0].addrs;
    } else if (a == "--peer") {
      if (!parse_peers(v, &peers, &err)) return usage(err.c_str());
    } else if (a == "--source") {
      auto c1 = v.find(':'), c2 = v.rfind(':');
      if (c1 == std::string::npos || c1 == c2) return usage("--source is PEER:RAIL:PORT");
      srcs.push_back({v.substr(0, c1), atoi(v.substr(c1 + 1, c2 - c1 - 1).c_str()), atoi(v.substr(c2 + 1).c_str())});
    } else if (a == "--interval-ms") {
      ec.interval_ns = int64_t(atoi(v.c_str())) * 1'000'000;
    } else if (a == "--dead-ms") {
      ec.dead_ns = int64_t(atoi(v.c_str())) * 1'000'000;
    } else if (a == "--duration") {
      duration = atof(v.c_str());
    } else if (a == "--status") {
      status = v;
    } else if (a == "--status-ms") {
      status_ms = atof(v.c_str());
    } else {
      return usage(("unknown option " + a).c_str());
    }
  }
  if (ec.name.empty() || ec.local_addrs.empty() || status.empty())
    return usage("--name, --listen and --status are required");
  const char* key = getenv("SHUNT_JOB_KEY");
  if (key && *key) ec.key = derive_probe_key(key);  // else start() refuses

  ProbeEngine eng(ec);
  for (auto& p : peers) eng.add_peer(p);
  std::mutex mu;
  json events = json::array();
  eng.on_source_path_change([&](const PathEvent& e) {
    std::lock_guard lk(mu);
    events.push_back({{"peer", e.peer}, {"rail", e.path}, {"id", e.source_id}, {"port", e.port},
                      {"alive", e.alive}, {"kernel_ns", TimeSource::kernel_now()}});
  });
  if (!eng.start(&err)) {
    fprintf(stderr, "source_paths_probe: %s\n", err.c_str());
    return 1;
  }
  for (auto& s : srcs) {
    int id = eng.add_source_path(s.peer, s.rail, uint16_t(s.port), &err);
    if (id == 0) {
      fprintf(stderr, "source_paths_probe: source path %s:%d:%d: %s\n", s.peer.c_str(), s.rail, s.port,
              err.c_str());
      return 1;
    }
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);
  int64_t start = TimeSource::kernel_now();
  while (!g_stop && double(TimeSource::kernel_now() - start) * 1e-9 < duration) {
    json out;
    out["name"] = ec.name;
    out["kernel_ns"] = TimeSource::kernel_now();
    out["peers"] = json::array();
    for (auto& r : eng.report()) {
      json pj = {{"name", r.name}, {"clock_valid", r.clock.valid}, {"paths", json::array()},
                 {"source_paths", json::array()}};
      for (auto& s : r.paths) pj["paths"].push_back(stats_json(s));
      for (auto& sp : r.source_paths) {
        json sj = stats_json(sp.stats);
        sj["id"] = sp.id;
        sj["rail"] = sp.rail;
        sj["port"] = sp.port;
        sj["reflected"] = sp.reflected;
        pj["source_paths"].push_back(sj);
      }
      out["peers"].push_back(pj);
    }
    {
      std::lock_guard lk(mu);
      out["events"] = events;
    }
    std::string tmp = status + ".tmp";
    {
      std::ofstream f(tmp);
      f << out.dump(1) << "\n";
    }
    if (rename(tmp.c_str(), status.c_str()) != 0) {
      fprintf(stderr, "source_paths_probe: cannot write %s: %s\n", status.c_str(), strerror(errno));
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(status_ms * 1000)));
  }
  eng.stop();
  return 0;
}
