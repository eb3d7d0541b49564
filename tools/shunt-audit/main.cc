// shunt-audit: is this fleet ready for a long job? Started on every host
// the way the job is (mpirun, srun, shunt-run, ssh, shunt-fabric exec);
// every instance answers requests on the audit port over the peer channel
// (authenticated by SHUNT_JOB_KEY), and the first host of --hosts drives:
// it gathers every host's facts, sets up an RC connection per rail and
// path between every ordered pair, measures it, and judges the fleet
// against itself (verdict.h). It prints the tree and writes the JSON and
// HTML reports; every instance exits with the verdict (0 pass, 1 warnings,
// 2 failures; 3 when the audit could not run).
#include <ifaddrs.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <chrono>
#include <condition_variable>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <sstream>
#include <cstring>

#include "interpose/peer/channel.h"
#include "interpose/verbs/path_discovery.h"
#include "tools/common/cli_exit.h"
#include "tools/shunt-audit/facts.h"
#include "tools/shunt-audit/rc.h"
#include "tools/shunt-audit/report.h"
#include "tools/shunt-audit/verdict.h"

using nlohmann::json;

namespace {

constexpr int kExitCannotRun = 3;

struct Options {
  std::vector<std::string> hosts, devices;
  int rank = -1, port = 7479;
  int bw_ms = 400, lat_rounds = 50, candidates = 6, discovery_ms = 200, join_s = 60, timeout_s = 900, retests = 16;
  bool no_backend = false, verbose = false, quiet = false;
  std::string json_out, html_out;
  audit::Thresholds t;
};

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
int find_rank(const Options& o) {
  if (o.rank >= 0) return o.rank;
  for (auto* v : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"})
    if (const char* s = getenv(v); s && *s) return std::atoi(s);
  auto mine = local_addrs();
  for (size_t i = 0; i < o.hosts.size(); i++)
    for (auto& a : mine)
      if (a == o.hosts[i]) return static_cast<int>(i);
  return -1;
}

// Does addr's instance answer on the audit port, authenticated, within 3 s?
bool reachable(const std::string& addr, int port, const shunt::peer::Key& key) {
  std::string err;
  auto r = shunt::peer::call(addr, port, key, {{"cmd", "audit_ping"}}, 3000, &err);
  return r && r->value("ok", false);
}

// ------------------------------------------------------------- every host
// What every instance answers on the audit port (the driver's own too).
class Server {
 public:
  Server(const Options& o, const shunt::peer::Key& key, int rank) : o_(o), key_(key), rank_(rank) {}
  json handle(const json& req) {
    try {
      return dispatch(req);
    } catch (const std::exception& e) {
      return {{"error", e.what()}};
    }
  }
  // Until the driver says done (its verdict) or the timeout.
  int wait_done() {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::seconds(o_.timeout_s), [&] { return done_; })) return -1;
    return status_;
  }

 private:
  json dispatch(const json& req) {
    std::string cmd = req.value("cmd", "");
    if (cmd == "audit_facts") {
      json f = audit::host_facts(o_.devices);
      rails_ = audit::rails(f);
      json reach = json::array();
      // (not itself: its listener is the thread asking)
      for (size_t h = 0; h < o_.hosts.size(); h++)
        reach.push_back(static_cast<int>(h) == rank_ || reachable(o_.hosts[h], o_.port, key_));
      f["reach"] = reach;
      return f;
    }
    if (cmd == "audit_ping") return {{"ok", true}};
    if (cmd == "audit_counters") return audit::port_counters(o_.devices);
    if (cmd == "audit_hops") {
      auto& r = rail(req.at("rail").get<int>());
      std::string peer = req.at("peer").get<std::string>();
      int n = std::clamp(req.value("n", 6), 1, 32), wait = std::clamp(req.value("wait_ms", 200), 10, 5000);
      auto ports = shunt::verbs::candidate_ports(r.ipv4, peer, n, std::random_device{}());
      auto hops = shunt::verbs::hops_of_ports(r.ipv4, peer, ports, 2, wait, 5 * wait);
      return {{"ports", ports}, {"hops", hops}};
    }
    if (cmd == "audit_open") {
      auto& r = rail(req.at("rail").get<int>());
      auto ep = std::make_unique<audit::RcEndpoint>(r.dev, r.port, r.gid_index);
      json a = ep->address();
      eps_[req.at("id").get<int>()] = std::move(ep);
      return a;
    }
    if (cmd == "audit_connect") {
      endpoint(req).connect(req.at("remote"), req.value("flow_label", 0u));
      return {{"ok", true}};
    }
    if (cmd == "audit_measure") {
      auto r = endpoint(req).measure(std::clamp(req.value("ms", 400), 10, 10000), std::clamp(req.value("rounds", 50), 1, 10000));
      if (!r.error.empty()) return {{"rc_error", r.error}};
      return {{"mbps", r.mbps}, {"lat_us", r.lat_us}};
    }
    if (cmd == "audit_close") {
      eps_.erase(req.at("id").get<int>());
      return {{"ok", true}};
    }
    if (cmd == "audit_done") {
      std::lock_guard lk(mu_);
      done_ = true;
      status_ = std::clamp(req.value("status", 2), 0, 3);
      verdict_ = req.value("verdict", "");
      cv_.notify_all();
      return {{"ok", true}};
    }
    return {{"error", "unknown request " + cmd}};
  }
  const audit::PortRef& rail(int r) {
    if (rails_.empty()) rails_ = audit::rails(audit::host_facts(o_.devices));
    if (r < 0 || r >= static_cast<int>(rails_.size())) throw std::runtime_error("no rail " + std::to_string(r));
    return rails_[r];
  }
  audit::RcEndpoint& endpoint(const json& req) {
    auto it = eps_.find(req.at("id").get<int>());
    if (it == eps_.end()) throw std::runtime_error("no endpoint " + req.at("id").dump());
    return *it->second;
  }

  const Options& o_;
  shunt::peer::Key key_;
  int rank_;
  std::vector<audit::PortRef> rails_;
  std::map<int, std::unique_ptr<audit::RcEndpoint>> eps_;  // only the listener thread touches these
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int status_ = 0;

 public:
  std::string verdict_;
};

// ------------------------------------------------------------- the driver
class Driver {
 public:
  Driver(const Options& o, const shunt::peer::Key& key) : o_(o), key_(key), n_(o.hosts.size()) {}

  int run() {
    auto t0 = std::chrono::steady_clock::now();
    if (!join()) return kExitCannotRun;
    std::vector<audit::Measurement> ms;
    if (!o_.no_backend) ms = backend();
    progress("counters");
    std::vector<json> after;
    for (size_t i = 0; i < n_; i++) after.push_back(ask_or_null(i, {{"cmd", "audit_counters"}}, 20000));
    audit::Node tree = audit::evaluate(facts_, names_, after, ms, o_.t);
    audit::Judged j = audit::judge_backend(ms, o_.t, names_);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress_end();
    json rep = audit::report_json(tree, names_, o_.hosts, facts_, ms, j, secs);
    bool ok = true;
    if (!o_.json_out.empty()) ok &= write(o_.json_out, rep.dump(2) + "\n");
    if (!o_.html_out.empty()) ok &= write(o_.html_out, audit::report_html(rep));
    audit::print_tree(std::cout, tree, o_.verbose, isatty(1));
    std::cout << audit::verdict_line(tree) << fmt::format(" in {:.0f} s", secs) << "\n";
    int rc = audit::exit_code(tree.status);
    for (size_t i = 0; i < n_; i++)
      if (i != 0) ask_or_null(i, {{"cmd", "audit_done"}, {"status", rc}, {"verdict", audit::verdict_line(tree)}}, 5000);
    return ok ? rc : kExitCannotRun;
  }

 private:
  json ask(size_t h, const json& req, int timeout_ms) {
    std::string err;
    auto r = shunt::peer::call(o_.hosts[h], o_.port, key_, req, timeout_ms, &err);
    if (!r) throw std::runtime_error(o_.hosts[h] + ": " + err);
    if (r->contains("error")) throw std::runtime_error(o_.hosts[h] + ": " + r->value("error", "?"));
    return *r;
  }
  json ask_or_null(size_t h, const json& req, int timeout_ms) {
    try {
      return ask(h, req, timeout_ms);
    } catch (const std::exception& e) {
      std::cerr << "shunt-audit: " << e.what() << "\n";
      return nullptr;
    }
  }

  // Every host's facts; a host that never answers within --join-time ends the audit.
  bool join() {
    facts_.assign(n_, json());
    auto until = std::chrono::steady_clock::now() + std::chrono::seconds(o_.join_s);
    for (size_t i = 0; i < n_; i++) {
      progress(fmt::format("joining: {}/{} hosts answered", i, n_));
      std::string last;
      while (facts_[i].is_null()) {
        try {
          facts_[i] = ask(i, {{"cmd", "audit_facts"}}, 30000);
        } catch (const std::exception& e) {
          last = e.what();
          if (std::chrono::steady_clock::now() > until) {
            progress_end();
            std::cerr << "shunt-audit: host " << o_.hosts[i] << " did not answer within " << o_.join_s << " s: " << last
                      << "\n";
            return false;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
      }
    }
    // Names: the hosts' own names where they are distinct, else addresses.
    std::map<std::string, int> seen;
    for (auto& f : facts_) seen[f.value("hostname", "")]++;
    for (size_t i = 0; i < n_; i++) {
      std::string h = facts_[i].value("hostname", "");
      names_.push_back(!h.empty() && seen[h] == 1 ? h : o_.hosts[i]);
      rails_.push_back(audit::rails(facts_[i]));
    }
    return true;
  }

  // Source ports for a -> b on rail r, one per router path discovery found
  // (router "" and port 0: none found, one measurement on the device's port).
  std::vector<std::pair<std::string, int>> paths(size_t a, size_t b, int r) {
    std::map<std::string, int> by_router;
    for (int attempt = 0; attempt < 2 && by_router.size() < 2; attempt++) {
      json h = ask_or_null(a, {{"cmd", "audit_hops"}, {"rail", r}, {"peer", rails_[b][r].ipv4}, {"n", o_.candidates},
                               {"wait_ms", o_.discovery_ms}}, 15000);
      if (h.is_null()) break;
      for (size_t k = 0; k < h["hops"].size() && k < h["ports"].size(); k++) {
        std::string rt = h["hops"][k];
        if (!rt.empty() && !by_router.count(rt)) by_router[rt] = h["ports"][k];
      }
      if (by_router.empty()) break;  // no router two hops out: hosts under one leaf
    }
    std::vector<std::pair<std::string, int>> out(by_router.begin(), by_router.end());
    if (out.empty()) out.emplace_back("", 0);
    return out;
  }

  audit::Measurement measure(size_t a, size_t b, int r, const std::string& router, int sport) {
    audit::Measurement m{static_cast<int>(a), static_cast<int>(b), r, router, sport};
    int id = ++next_id_;
    bool opened_a = false, opened_b = false;
    try {
      json eb = ask(b, {{"cmd", "audit_open"}, {"id", id}, {"rail", r}}, 15000);
      opened_b = true;
      json ea = ask(a, {{"cmd", "audit_open"}, {"id", id}, {"rail", r}}, 15000);
      opened_a = true;
      ask(b, {{"cmd", "audit_connect"}, {"id", id}, {"remote", ea}}, 15000);
      ask(a, {{"cmd", "audit_connect"}, {"id", id}, {"remote", eb}, {"flow_label", sport ? sport & 0x3fff : 0}}, 15000);
      json x = ask(a, {{"cmd", "audit_measure"}, {"id", id}, {"ms", o_.bw_ms}, {"rounds", o_.lat_rounds}}, o_.bw_ms + 30000);
      if (x.contains("rc_error")) m.error = x["rc_error"];
      else m.mbps = x.value("mbps", 0.0), m.lat_us = x.value("lat_us", 0.0);
    } catch (const std::exception& e) {
      m.error = e.what();
    }
    if (opened_a) ask_or_null(a, {{"cmd", "audit_close"}, {"id", id}}, 10000);
    if (opened_b) ask_or_null(b, {{"cmd", "audit_close"}, {"id", id}}, 10000);
    return m;
  }

  std::vector<audit::Measurement> backend() {
    size_t nrails = 0;
    for (auto& r : rails_) nrails = std::max(nrails, r.size());
    std::vector<audit::Measurement> ms;
    size_t total = nrails * n_ * (n_ - 1), done = 0;
    // Ordered so that one host's discoveries come far apart: routers answer
    // a host a burst of about 6 ICMP messages, then one a second.
    for (size_t r = 0; r < nrails; r++)
      for (size_t d = 1; d < n_; d++)
        for (size_t a = 0; a < n_; a++) {
          size_t b = (a + d) % n_;
          int ri = static_cast<int>(r);
          progress(fmt::format("back-end: {}/{} pairs, rail {} {} -> {}", done++, total, r, names_[a], names_[b]));
          std::string why;
          for (size_t h : {a, b}) {
            if (r >= rails_[h].size()) why = names_[h] + " has no rail " + std::to_string(r);
            else if (!rails_[h][r].active) why = names_[h] + "'s " + rails_[h][r].dev + " port is not ACTIVE";
            else if (rails_[h][r].ipv4.empty()) why = names_[h] + "'s " + rails_[h][r].dev + " has no IPv4 RoCEv2 GID";
            if (!why.empty()) break;
          }
          if (!why.empty()) {
            audit::Measurement m{static_cast<int>(a), static_cast<int>(b), ri};
            m.skipped = why;
            ms.push_back(m);
            continue;
          }
          for (auto& [router, sport] : paths(a, b, ri)) ms.push_back(measure(a, b, ri, router, sport));
        }
    // Outliers and errors once more (a busy host, a lost packet): the
    // better of the two counts, so what is reported is what repeats.
    audit::Judged j = audit::judge_backend(ms, o_.t);
    int left = o_.retests;
    for (size_t i = 0; i < ms.size() && left > 0; i++) {
      auto& m = ms[i];
      if (!m.skipped.empty() || (j.bw[i] == audit::Status::pass && j.lat[i] == audit::Status::pass && m.error.empty()))
        continue;
      left--;
      progress(fmt::format("back-end: again, rail {} {} -> {}", m.rail, names_[m.src], names_[m.dst]));
      auto again = measure(m.src, m.dst, m.rail, m.router, m.sport);
      if (!again.error.empty()) continue;
      if (!m.error.empty()) m = again;
      else m.mbps = std::max(m.mbps, again.mbps), m.lat_us = std::min(m.lat_us, again.lat_us);
    }
    return ms;
  }

  void progress(const std::string& s) {
    if (o_.quiet) return;
    auto secs = std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_).count();
    if (isatty(2)) std::cerr << "\r\033[K[shunt-audit " << secs << "s] " << s << std::flush;
    else std::cerr << "[shunt-audit " << secs << "s] " << s << "\n";
  }
  void progress_end() {
    if (!o_.quiet && isatty(2)) std::cerr << "\r\033[K" << std::flush;
  }
  static bool write(const std::string& path, const std::string& text) {
    std::ofstream f(path);
    f << text;
    if (!f) std::cerr << "shunt-audit: cannot write " << path << "\n";
    return static_cast<bool>(f);
  }

  const Options& o_;
  shunt::peer::Key key_;
  size_t n_;
  std::vector<json> facts_;
  std::vector<std::string> names_;
  std::vector<std::vector<audit::PortRef>> rails_;
  int next_id_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

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
      if (item.find("libshunt.so") != std::string::npos) lib = item;
      else if (!item.empty()) kept += (kept.empty() ? "" : ":") + item;
  if (kept.empty()) unsetenv("LD_PRELOAD");
  else setenv("LD_PRELOAD", kept.c_str(), 1);
  std::vector<char*> args(argv, argv + argc);
  std::string flag = "--shunt-preloaded=" + lib;
  args.push_back(flag.data());
  args.push_back(nullptr);
  execv("/proc/self/exe", args.data());
  std::cerr << "shunt-audit: cannot run itself again without libshunt.so: " << strerror(errno) << "\n";
}

int main(int argc, char** argv) {
  drop_preload(argc, argv);
  CLI::App app{"shunt-audit: check a fleet's hosts and back-end network before a long job"};
  app.set_version_flag("--version", std::string("shunt-audit ") + SHUNT_VERSION);
  Options o;
  auto& t = o.t;
  app.add_option("--hosts", o.hosts, "Every host's address (IPv4), the driver first; comma-separated")
      ->required()->delimiter(',');
  app.add_option("--rank", o.rank, "This host's position in --hosts (default: the launcher's rank, else this host's address)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--port", o.port, "TCP port every instance answers on")->check(CLI::Range(1, 65535));
  app.add_option("--devices", o.devices, "RDMA devices, one per rail in rail order (default: all, by name)")->delimiter(',');
  app.add_option("--json", o.json_out, "Write the JSON report here (driver)");
  app.add_option("--html", o.html_out, "Write the HTML report here (driver)");
  app.add_option("--bw-ms", o.bw_ms, "Milliseconds of writes per measured path")->check(CLI::Range(10, 10000));
  app.add_option("--lat-rounds", o.lat_rounds, "Reads per latency measurement")->check(CLI::Range(1, 10000));
  app.add_option("--candidates", o.candidates, "Source ports path discovery tries per pair and rail (0: no discovery)")
      ->check(CLI::Range(0, 32));
  app.add_option("--discovery-ms", o.discovery_ms, "How long path discovery waits for routers")->check(CLI::Range(10, 5000));
  app.add_option("--retests", o.retests, "Outlying or failed measurements measured once more, at most")->check(CLI::Range(0, 100000));
  app.add_option("--join-time", o.join_s, "Seconds the driver waits for every host to answer")->check(CLI::Range(1, 3600));
  app.add_option("--timeout", o.timeout_s, "Seconds an instance waits for the driver's verdict")->check(CLI::Range(1, 86400));
  app.add_flag("--no-backend", o.no_backend, "Host checks only: no RC connections");
  app.add_option("--bw-warn", t.bw_warn_frac, "Bandwidth below this fraction of the rail's median warns")->check(CLI::Range(0.0, 1.0));
  app.add_option("--bw-fail", t.bw_fail_frac, "... fails")->check(CLI::Range(0.0, 1.0));
  app.add_option("--bw-floor-warn", t.bw_warn_floor, "Bandwidth below this many MB/s warns, whatever the fleet")->check(CLI::NonNegativeNumber);
  app.add_option("--bw-floor-fail", t.bw_fail_floor, "... fails")->check(CLI::NonNegativeNumber);
  app.add_option("--lat-warn", t.lat_warn_mult, "Latency above this multiple of the rail's median warns")->check(CLI::Range(1.0, 1e6));
  app.add_option("--lat-fail", t.lat_fail_mult, "... fails")->check(CLI::Range(1.0, 1e6));
  app.add_option("--lat-slack-us", t.lat_slack_us, "Latency within this many us of the median always passes")->check(CLI::NonNegativeNumber);
  app.add_option("--retrans-warn", t.retrans_warn, "A retransmit counter rising by more than this (and 5x the fleet's median rise) warns")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--memlock-floor", t.memlock_floor, "Memory lock limit (bytes) below which a host warns")->check(CLI::NonNegativeNumber);
  app.add_flag("--expect-nccl", t.expect_nccl, "A host without NCCL fails");
  app.add_option("--shunt-preloaded", audit::g_preloaded, "")->group("");  // set by drop_preload()
  app.add_flag("-v,--verbose", o.verbose, "Print every check, not only those that did not pass");
  app.add_flag("-q,--quiet", o.quiet, "No progress line");
  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;
  const char* key = getenv("SHUNT_JOB_KEY");
  if (!key || !*key) {
    std::cerr << "shunt-audit: SHUNT_JOB_KEY is not set; the hosts prove to each other they hold the job's key\n";
    return kExitCannotRun;
  }
  int rank = find_rank(o);
  if (rank < 0 || rank >= static_cast<int>(o.hosts.size())) {
    std::cerr << "shunt-audit: cannot tell which of --hosts this host is (give --rank)\n";
    return kExitCannotRun;
  }
  auto k = shunt::peer::job_key_from(key);
  Server server(o, k, rank);
  // On its own address of --hosts: the one the others reach it by (and
  // several instances can share one machine on loopback addresses).
  if (!shunt::peer::start_listener(o.hosts[rank], o.port, k, [&](const json& r) { return server.handle(r); })) {
    std::cerr << "shunt-audit: cannot listen on port " << o.port << "\n";
    return kExitCannotRun;
  }
  int rc;
  if (rank == 0) {
    rc = Driver(o, k).run();
  } else {
    rc = server.wait_done();
    if (rc < 0) {
      std::cerr << "shunt-audit: no verdict from " << o.hosts[0] << " within " << o.timeout_s << " s\n";
      rc = kExitCannotRun;
    } else {
      std::cout << "shunt-audit: " << server.verdict_ << " (report on " << o.hosts[0] << ")\n";
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the driver's reply goes out
    }
  }
  shunt::peer::stop_listener();
  return rc;
}
