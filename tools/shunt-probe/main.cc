// shunt-probe: runs the clocksync probe engine standalone on one host until
// the per-host agent embeds it. Prints per-peer offset/bound and per-path
// delay/loss; --json writes the same plus a time series of the estimates (for
// the end-to-end test and the bench, which know the injected test clocks).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "clocksync/engine.h"
#include "core/config.h"
#include "core/log.h"
#include "tools/common/cli_exit.h"

using namespace shunt::clocksync;
using json = nlohmann::json;

namespace {
std::atomic<bool> g_stop{false};
void on_signal(int) { g_stop = true; }

double cpu_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string s((std::istreambuf_iterator<char>(f)), {});
  auto rp = s.rfind(')');
  if (rp == std::string::npos) return 0;
  std::istringstream in(s.substr(rp + 2));
  std::string tok;
  unsigned long ut = 0, st = 0;
  for (int field = 3; in >> tok; field++) {
    if (field == 14) ut = std::stoul(tok);
    if (field == 15) {
      st = std::stoul(tok);
      break;
    }
  }
  return double(ut + st) / double(sysconf(_SC_CLK_TCK));
}

json spec_json(const TestClockSpec& s) {
  return {{"offset_ns", s.offset_ns}, {"drift_ppb", s.drift_ppb}, {"wander_ns", s.wander_ns},
          {"wander_period_s", s.wander_period_s}, {"step_ns", s.step_ns},
          {"step_every_s", s.step_every_s}, {"epoch_ns", s.epoch_ns}};
}
}  // namespace

int main(int argc, char** argv) {
  std::vector<shunt::ConfigError> errs;
  std::vector<std::string> warns;
  shunt::Config cfg = shunt::load_config([](const char* n) { return getenv(n); }, &errs, &warns, environ);
  for (auto& e : errs) fprintf(stderr, "shunt-probe: %s\n", e.message.c_str());
  if (!errs.empty()) return 2;
  EngineConfig ec;
  std::vector<PeerSpec> peers;
  std::string err;
  if (!engine_config_from(cfg, &ec, &peers, &err)) {
    fprintf(stderr, "shunt-probe: %s\n", err.c_str());
    return 2;
  }

  CLI::App app{"Run the shunt clock sync / path probe engine on this host."};
  app.set_version_flag("--version", std::string("shunt-probe ") + SHUNT_VERSION);
  std::string listen, test_clock, json_file, name = ec.name, shm = ec.shm_name;
  std::vector<std::string> peer_args;
  double duration = 10, holdover_at = -1, sample_ms = 100;
  int interval_ms = int(ec.interval_ns / 1'000'000), dead_ms = int(ec.dead_ns / 1'000'000);
  int port = ec.port;
  int64_t tol = ec.pair_tol_ns;
  bool quiet = false, no_hw = false, verbose = false;
  app.add_option("--name", name, "this host's name in the mesh (SHUNT_PROBE_NAME)");
  app.add_option("--listen", listen, "local rail addresses ADDR[,ADDR] (SHUNT_PROBE_ADDRS)");
  app.add_option("--peer", peer_args, "peer NAME=ADDR[,ADDR]; repeat (SHUNT_PEERS)");
  app.add_option("--port", port, "UDP port (SHUNT_PROBE_PORT)");
  app.add_option("--interval-ms", interval_ms, "probe pair interval (SHUNT_PROBE_INTERVAL_MS)");
  app.add_option("--dead-ms", dead_ms, "path dead after this silence (SHUNT_PATH_DEAD_MS)");
  app.add_option("--pair-tol-ns", tol, "coded pair spacing tolerance (SHUNT_PROBE_PAIR_TOL_NS)");
  app.add_option("--test-clock", test_clock, "TEST ONLY virtual clock (SHUNT_TEST_CLOCK syntax)");
  app.add_option("--shm", shm, "publish clock models under this shm name; '' for none (SHUNT_CLOCK_SHM)");
  app.add_option("--duration", duration, "seconds to run (0: until SIGINT/SIGTERM)");
  app.add_option("--holdover-at", holdover_at, "stop probing after this many seconds (holdover)");
  app.add_option("--sample-ms", sample_ms, "period of the estimate time series in --json");
  app.add_option("--json", json_file, "write results as JSON here");
  app.add_flag("--no-hw", no_hw, "software timestamps even where the NIC stamps in hardware");
  app.add_flag("--quiet", quiet, "no summary on stdout");
  app.add_flag("-v,--verbose", verbose, "log at info level");
  int source_paths = 0;
  app.add_option("--source-paths", source_paths,
                 "also probe N source paths per peer and rail, from free ports (as a host agent does "
                 "for the paths of its bundles; to measure what they cost)")
      ->check(CLI::Range(0, 64));
  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;

  shunt::log::configure(verbose ? shunt::LogLevel::info : shunt::LogLevel::warn, "");
  ec.name = name;
  ec.shm_name = shm;
  ec.port = uint16_t(port);
  ec.interval_ns = int64_t(interval_ms) * 1'000'000;
  ec.dead_ns = int64_t(dead_ms) * 1'000'000;
  ec.pair_tol_ns = tol;
  ec.want_hw = !no_hw;
  if (!listen.empty()) {
    ec.local_addrs.clear();
    std::vector<PeerSpec> tmp;
    if (!parse_peers("self=" + listen, &tmp, &err)) {
      fprintf(stderr, "shunt-probe: --listen: %s\n", err.c_str());
      return shunt::cli::kExitUsage;
    }
    ec.local_addrs = tmp[0].addrs;
  }
  if (!test_clock.empty()) {
    auto tc = parse_test_clock(test_clock, &err);
    if (!tc) {
      fprintf(stderr, "shunt-probe: --test-clock: %s\n", err.c_str());
      return shunt::cli::kExitUsage;
    }
    ec.test_clock = *tc;
  }
  for (auto& p : peer_args)
    if (!parse_peers(p, &peers, &err)) {
      fprintf(stderr, "shunt-probe: --peer: %s\n", err.c_str());
      return shunt::cli::kExitUsage;
    }

  ProbeEngine eng(ec);
  for (auto& p : peers) eng.add_peer(p);
  std::mutex ev_mu;
  json events = json::array();
  eng.on_path_change([&](const PathEvent& e) {
    std::lock_guard lk(ev_mu);
    events.push_back({{"peer", e.peer}, {"path", e.path}, {"alive", e.alive},
                      {"kernel_ns", TimeSource::kernel_now()}});
  });
  for (auto& p : peers)
    for (size_t r = 0; r < p.addrs.size() && r < ec.local_addrs.size(); r++)
      for (int k = 0; k < source_paths; k++)
        if (!eng.add_source_path(p.name, int(r), 0, &err)) {
          fprintf(stderr, "shunt-probe: --source-paths: %s\n", err.c_str());
          return 1;
        }
  if (!eng.start(&err)) {
    fprintf(stderr, "shunt-probe: %s\n", err.c_str());
    return 1;
  }
  signal(SIGINT, on_signal);
  signal(SIGTERM, on_signal);

  json series = json::object();
  int64_t start = TimeSource::kernel_now();
  double cpu0 = cpu_seconds();
  bool held = false;
  int64_t holdover_start = 0;
  while (!g_stop) {
    std::this_thread::sleep_for(std::chrono::microseconds(int64_t(sample_ms * 1000)));
    int64_t k = TimeSource::kernel_now();
    double el = double(k - start) * 1e-9;
    if (holdover_at >= 0 && !held && el >= holdover_at) {
      eng.set_probing(false);
      held = true;
      holdover_start = k;
    }
    if (!json_file.empty())
      for (auto& r : eng.report())
        series[r.name].push_back({k, r.clock.valid, r.clock.offset_ns, r.clock.bound_ns,
                                  r.clock.naive_valid, r.clock.naive_offset_ns,
                                  r.clock.direct_offset_ns, r.clock.direct_bound_ns});
    if (duration > 0 && el >= duration) break;
  }
  int64_t end = TimeSource::kernel_now();
  auto reports = eng.report();
  double cpu = cpu_seconds() - cpu0, secs = double(end - start) * 1e-9;
  StampMode mode = eng.stamp_mode();
  eng.stop();
  // After the stop: read before it, the counters missed a round the engine
  // thread could still send, which the peer then counted (test 41 saw 200
  // accepted of 198 "sent").
  EngineCounters ctr = eng.counters();

  json out;
  out["name"] = ec.name;
  out["stamp_mode"] = to_string(mode);
  out["test_clock"] = spec_json(eng.time().spec());
  out["interval_ms"] = interval_ms;
  out["dead_ms"] = dead_ms;
  out["start_kernel_ns"] = start;
  out["end_kernel_ns"] = end;
  out["holdover_start_kernel_ns"] = holdover_start;
  out["duration_s"] = secs;
  out["cpu_s"] = cpu;
  out["counters"] = {{"sent", ctr.sent}, {"received", ctr.received},
                     {"bytes_sent", ctr.bytes_sent}, {"tx_stamps", ctr.tx_stamps},
                     {"dropped_malformed", ctr.dropped_malformed}, {"dropped_auth", ctr.dropped_auth},
                     {"dropped_unknown", ctr.dropped_unknown}, {"dropped_replay", ctr.dropped_replay},
                     {"send_errors", ctr.send_errors}, {"wakeups", ctr.wakeups}};
  out["peers"] = json::array();
  if (!quiet)
    printf("%s (%s timestamps): %llu probes sent, %llu received, %llu wakeups\n", ec.name.c_str(),
           to_string(mode), (unsigned long long)ctr.sent, (unsigned long long)ctr.received,
           (unsigned long long)ctr.wakeups);
  for (auto& r : reports) {
    json pj = {{"name", r.name}, {"valid", r.clock.valid}, {"offset_ns", r.clock.offset_ns},
               {"bound_ns", r.clock.bound_ns}, {"direct_offset_ns", r.clock.direct_offset_ns},
               {"direct_bound_ns", r.clock.direct_bound_ns}, {"drift_ppb", r.clock.drift_ppb},
               {"half_rtt_ns", r.clock.half_rtt_ns}, {"age_ns", r.clock.age_ns},
               {"naive_offset_ns", r.clock.naive_offset_ns}, {"pairs_kept", r.pairs_kept},
               {"pairs_dropped", r.pairs_dropped}, {"pair_tol_ns", r.pair_tol_ns}, {"steps", r.steps},
               {"at_kernel_ns", end}};
    if (!quiet)
      printf("  %-10s offset %+14.1f ns  bound %8.1f ns  drift %+9.1f ppb  pairs %llu kept %llu dropped (tolerance %lld ns)\n",
             r.name.c_str(), r.clock.offset_ns, r.clock.bound_ns, r.clock.drift_ppb,
             (unsigned long long)r.pairs_kept, (unsigned long long)r.pairs_dropped, (long long)r.pair_tol_ns);
    pj["paths"] = json::array();
    for (size_t i = 0; i < r.paths.size(); i++) {
      const PathStats& s = r.paths[i];
      pj["paths"].push_back({{"rail", i}, {"alive", s.alive}, {"fwd_p50_ns", s.fwd_p50_ns},
                             {"fwd_p99_ns", s.fwd_p99_ns}, {"rev_p50_ns", s.rev_p50_ns},
                             {"rev_p99_ns", s.rev_p99_ns}, {"fwd_loss", s.fwd_loss},
                             {"rev_loss", s.rev_loss}, {"sent", s.sent}, {"received", s.received}});
      if (!quiet)
        printf("    rail %zu %-5s owd p50/p99 %8.1f/%8.1f ns -> %8.1f/%8.1f ns <-  loss %.3f/%.3f\n", i,
               s.alive ? "alive" : "DEAD", s.fwd_p50_ns, s.fwd_p99_ns, s.rev_p50_ns, s.rev_p99_ns,
               s.fwd_loss, s.rev_loss);
    }
    out["peers"].push_back(pj);
  }
  if (!quiet)
    printf("  probe cost: %.0f B/s sent, cpu %.2f%% of one core\n", double(ctr.bytes_sent) / secs,
           100 * cpu / secs);
  {
    std::lock_guard lk(ev_mu);
    out["events"] = events;
  }
  out["series_fields"] = {"kernel_ns", "valid", "offset_ns", "bound_ns", "naive_valid",
                          "naive_offset_ns", "direct_offset_ns", "direct_bound_ns"};
  out["series"] = series;
  if (!json_file.empty()) {
    std::ofstream f(json_file);
    f << out.dump(1) << "\n";
    if (!f) {
      fprintf(stderr, "shunt-probe: cannot write %s\n", json_file.c_str());
      return 1;
    }
  }
  return 0;
}
