// shunt-audit: is this fleet ready for a long job? Started on every host
// the way the job is (mpirun, srun, shunt-run, ssh, shunt-fabric exec);
// every instance answers requests on the audit port over the peer channel
// (authenticated by SHUNT_JOB_KEY), and the first host of --hosts drives:
// it gathers every host's facts, sets up an RC connection per rail and
// path between every ordered pair, measures it, and judges the fleet
// against itself (verdict.h). It prints the tree and writes the JSON and
// HTML reports; every instance exits with the verdict (0 pass, 1 warnings,
// 2 failures; 3 when the audit could not run).
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstring>
#include <iostream>
#include <sstream>
#include <thread>

#include "peer/channel.h"
#include "tools/common/cli_exit.h"
#include "tools/shunt-audit/drive.h"
#include "tools/shunt-audit/facts.h"
#include "tools/shunt-audit/options.h"
#include "tools/shunt-audit/serve.h"

using nlohmann::json;

namespace {

std::vector<std::string> local_addrs() {
  std::vector<std::string> out;
  ifaddrs* ifa = nullptr;
  if (getifaddrs(&ifa) != 0) return out;
  for (auto* i = ifa; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET) {
      char b[INET_ADDRSTRLEN];
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, b, sizeof b);
      out.emplace_back(b);
    }
  freeifaddrs(ifa);
  return out;
}

// This instance's rank: --rank, else the launcher's (Open MPI, MPICH/PMI,
// Slurm), else the position of one of this host's addresses in --hosts.
int find_rank(const audit::Options& o) {
  if (o.rank >= 0) return o.rank;
  for (auto* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = getenv(v); s && *s) return std::atoi(s);
  auto mine = local_addrs();
  for (size_t i = 0; i < o.hosts.size(); i++)
    for (auto& a : mine)
      if (a == o.hosts[i]) return static_cast<int>(i);
  return -1;
}

}  // namespace

// Started with libshunt.so preloaded (as the job's processes are): the
// audit measures the fabric as it is, not through shunt's bundles, so it
// runs itself again without it and remembers that it was there.
void drop_preload(int argc, char** argv) {
  const char* pre = getenv("LD_PRELOAD");
  if (!pre || !strstr(pre, "libshunt.so")) return;
  std::string kept, lib;
  std::stringstream ss(pre);
  for (std::string item; ss >> item;)  // separated by spaces or colons
    for (std::stringstream parts(item); std::getline(parts, item, ':');)
      if (item.find("libshunt.so") != std::string::npos)
        lib = item;
      else if (!item.empty())
        kept += (kept.empty() ? "" : ":") + item;
  if (kept.empty())
    unsetenv("LD_PRELOAD");
  else
    setenv("LD_PRELOAD", kept.c_str(), 1);
  std::vector<char*> args(argv, argv + argc);
  std::string flag = "--shunt-preloaded=" + lib;
  args.push_back(flag.data());
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  std::cerr << "shunt-audit: cannot run itself again without libshunt.so: " << strerror(errno)
            << "\n";
}

int main(int argc, char** argv) {
  drop_preload(argc, argv);
  CLI::App app{"shunt-audit: check a fleet's hosts and back-end network before a long job"};
  app.set_version_flag("--version", std::string("shunt-audit ") + SHUNT_VERSION);
  audit::Options o;
  auto& t = o.t;
  app.add_option("--hosts", o.hosts,
                 "Every host's address (IPv4), the driver first; comma-separated")
      ->required()
      ->delimiter(',');
  app.add_option(
         "--rank", o.rank,
         "This host's position in --hosts (default: the launcher's rank, else this host's address)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--port", o.port, "TCP port every instance answers on")
      ->check(CLI::Range(1, 65535));
  app.add_option("--devices", o.devices,
                 "RDMA devices, one per rail in rail order (default: all, by name)")
      ->delimiter(',');
  app.add_option("--json", o.json_out, "Write the JSON report here (driver)");
  app.add_option("--html", o.html_out, "Write the HTML report here (driver)");
  app.add_option("--bw-ms", o.bw_ms, "Milliseconds of writes per measured path")
      ->check(CLI::Range(10, 10000));
  app.add_option("--lat-rounds", o.lat_rounds, "Reads per latency measurement")
      ->check(CLI::Range(1, 10000));
  app.add_option("--candidates", o.candidates,
                 "Source ports path discovery tries per pair and rail (0: no discovery)")
      ->check(CLI::Range(0, 32));
  app.add_option("--discovery-ms", o.discovery_ms, "How long path discovery waits for routers")
      ->check(CLI::Range(10, 5000));
  app.add_option("--retests", o.retests,
                 "Outlying or failed measurements measured once more, at most")
      ->check(CLI::Range(0, 100000));
  app.add_option("--join-time", o.join_s, "Seconds the driver waits for every host to answer")
      ->check(CLI::Range(1, 3600));
  app.add_option("--timeout", o.timeout_s, "Seconds an instance waits for the driver's verdict")
      ->check(CLI::Range(1, 86400));
  app.add_flag("--no-backend", o.no_backend, "Host checks only: no RC connections");
  app.add_option("--probe-s", o.probe_s, "Seconds the probe mesh measures loss and delay (0: none)")
      ->check(CLI::Range(0, 3600));
  app.add_option("--probe-port", o.probe_port, "UDP port of the probe mesh")
      ->check(CLI::Range(1, 65535));
  app.add_option("--probe-ms", o.probe_ms, "Milliseconds between a path's probe pairs")
      ->check(CLI::Range(5, 1000));
  // A threshold that warns and its twin that fails, checked alike.
  auto pair = [&](const char* warn, const char* fail, double* w, double* f, const char* help,
                  const CLI::Validator& v) {
    app.add_option(warn, *w, help)->check(v);
    app.add_option(fail, *f, "... fails")->check(v);
  };
  pair("--bw-warn", "--bw-fail", &t.bw_warn_frac, &t.bw_fail_frac,
       "Bandwidth below this fraction of the rail's median warns", CLI::Range(0.0, 1.0));
  pair("--bw-floor-warn", "--bw-floor-fail", &t.bw_warn_floor, &t.bw_fail_floor,
       "Bandwidth below this many MB/s warns, whatever the fleet", CLI::NonNegativeNumber);
  pair("--lat-warn", "--lat-fail", &t.lat_warn_mult, &t.lat_fail_mult,
       "Latency above this multiple of the rail's median warns", CLI::Range(1.0, 1e6));
  app.add_option("--lat-slack-us", t.lat_slack_us,
                 "Latency within this many us of the median always passes")
      ->check(CLI::NonNegativeNumber);
  app.add_option(
         "--retrans-warn", t.retrans_warn,
         "A retransmit counter rising by more than this (and 5x the fleet's median rise) warns")
      ->check(CLI::NonNegativeNumber);
  pair("--loss-warn", "--loss-fail", &t.loss_warn, &t.loss_fail,
       "A path losing this share of its probes warns", CLI::Range(0.0, 1.0));
  pair("--clock-warn-ms", "--clock-fail-ms", &t.clock_warn_ms, &t.clock_fail_ms,
       "A host's clock this many ms from the fleet's median warns", CLI::NonNegativeNumber);
  app.add_option("--clock-bound-us", t.clock_bound_warn_us,
                 "The probes' bound on a host's clock offset above this many us warns")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--memlock-floor", t.memlock_floor,
                 "Memory lock limit (bytes) below which a host warns")
      ->check(CLI::NonNegativeNumber);
  app.add_flag("--expect-nccl", t.expect_nccl, "A host without NCCL fails");
  app.add_option("--shunt-preloaded", audit::g_preloaded, "")->group("");  // set by drop_preload()
  app.add_flag("-v,--verbose", o.verbose, "Print every check, not only those that did not pass");
  app.add_flag("-q,--quiet", o.quiet, "No progress line");
  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;
  const char* key = getenv("SHUNT_JOB_KEY");
  if (!key || !*key) {
    std::cerr << "shunt-audit: SHUNT_JOB_KEY is not set; the hosts prove to each other they hold "
                 "the job's key\n";
    return audit::kExitCannotRun;
  }
  int rank = find_rank(o);
  if (rank < 0 || rank >= static_cast<int>(o.hosts.size())) {
    std::cerr << "shunt-audit: cannot tell which of --hosts this host is (give --rank)\n";
    return audit::kExitCannotRun;
  }
  auto k = shunt::peer::job_key_from(key);
  audit::Server server(o, k, shunt::clocksync::derive_probe_key(key), rank);
  // On its own address of --hosts: the one the others reach it by (and
  // several instances can share one machine on loopback addresses).
  if (!shunt::peer::start_listener(o.hosts[rank], o.port, k,
                                   [&](const json& r) { return server.handle(r); })) {
    std::cerr << "shunt-audit: cannot listen on port " << o.port << "\n";
    return audit::kExitCannotRun;
  }
  int rc;
  if (rank == 0) {
    rc = audit::drive(o, k);
  } else {
    rc = server.wait_done();
    if (rc < 0) {
      std::cerr << "shunt-audit: no verdict from " << o.hosts[0] << " within " << o.timeout_s
                << " s\n";
      rc = audit::kExitCannotRun;
    } else {
      std::cout << "shunt-audit: " << server.verdict() << " (report on " << o.hosts[0] << ")\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the driver's reply goes out
    }
  }
  shunt::peer::stop_listener();
  return rc;
}
