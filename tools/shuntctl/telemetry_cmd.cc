#include "tools/shuntctl/telemetry_cmd.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "core/json_text.h"
#include "peer/control.h"
#include "telemetry/metrics.h"

namespace shunt::ctl {

namespace {
using nlohmann::json;
using telemetry::HostView;

std::optional<json> ask(bool quiet = false) {
  const char* rd = getenv("SHUNT_RUN_DIR");
  std::string refused;
  std::string dir = peer::agent_dir(rd ? rd : "", &refused);
  std::string err;
  auto ans = peer::request(dir + "/agent.sock", {{"cmd", "telemetry"}}, 3000, &err);
  if (!ans && quiet) return std::nullopt;
  if (!ans) {
    std::cerr << "shuntctl: " << err << " (is a shunt job running on this host? SHUNT_RUN_DIR=" << dir << ")\n";
    if (!refused.empty()) std::cerr << "shuntctl: " << refused << "\n";
    return std::nullopt;
  }
  if (ans->contains("error")) {
    std::cerr << "shuntctl: " << (*ans)["error"].get<std::string>() << "\n";
    return std::nullopt;
  }
  return ans;
}

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}


std::string delay(double ns) {
  if (ns < 0) return "-";
  std::ostringstream s;
  if (ns >= 1e6) s << std::fixed << std::setprecision(2) << ns / 1e6 << " ms";
  else s << std::fixed << std::setprecision(1) << ns / 1e3 << " us";
  return s.str();
}

std::string key_of(const json& p) { return p["peer"].get<std::string>() + "/" + std::to_string(p["rail"].get<int>()); }

// Adds FIELD_per_s to every item of b: how fast FIELD grew since the item
// of a with the same key (0 for a new one).
void add_rates(const json& a, json* b, const std::function<std::string(const json&)>& key,
               std::initializer_list<const char*> fields, double dt) {
  std::map<std::string, const json*> before;
  for (auto& p : a) before[key(p)] = &p;
  for (auto& p : *b) {
    auto it = before.find(key(p));
    for (const char* f : fields) {
      double r = it != before.end() && dt > 0 ? (p[f].get<double>() - (*it->second)[f].get<double>()) / dt : 0;
      p[std::string(f) + "_per_s"] = std::max(0.0, r);
    }
  }
}

// Paths of the second sample with byte rates against the first.
json paths_with_rates(const json& a, const json& b, double dt) {
  json pa = telemetry::paths_view(telemetry::host_view_from(a)), pb = telemetry::paths_view(telemetry::host_view_from(b));
  add_rates(pa, &pb, key_of, {"tx_bytes", "rx_bytes"}, dt);
  return pb;
}

void print_paths(std::ostream& out, const json& paths) {
  if (paths.empty()) {
    out << "no paths (the agent probes none: set SHUNT_PROBE_ADDRS and SHUNT_PEERS)\n";
    return;
  }
  out << std::left << std::setw(14) << "peer" << std::setw(5) << "rail" << std::setw(34) << "path" << std::setw(6)
      << "state" << std::setw(12) << "tx rate" << std::setw(12) << "rx rate" << std::setw(11) << "delay tx" << std::setw(11)
      << "delay rx" << std::setw(11) << "rtt" << "loss tx/rx\n";
  for (auto& p : paths) {
    std::ostringstream loss;
    loss << std::fixed << std::setprecision(3) << p.value("fwd_loss", 0.0) << "/" << p.value("rev_loss", 0.0);
    out << std::setw(14) << p["peer"].get<std::string>() << std::setw(5) << p["rail"].get<int>() << std::setw(34)
        << p["path"].get<std::string>() << std::setw(6) << (p.value("alive", false) ? "up" : "DOWN") << std::setw(12)
        << rate(p.value("tx_bytes_per_s", 0.0)) << std::setw(12) << rate(p.value("rx_bytes_per_s", 0.0)) << std::setw(11)
        << delay(p.value("fwd_p50_ns", -1.0)) << std::setw(11) << delay(p.value("rev_p50_ns", -1.0)) << std::setw(11)
        << delay(p.value("rtt_ns", -1.0)) << loss.str() << "\n";
  }
}

std::string bundle_key(const json& p) {
  return p["pid"].get<std::string>() + "/" + p["device"].get<std::string>() + "/" +
         std::to_string(p["qpn"].get<uint64_t>()) + "/" + p["path"].get<std::string>();
}

// Bundle paths of the second sample, with their send rate against the first.
json bundle_paths_with_rates(const json& a, const json& b, double dt) {
  json pa = telemetry::bundle_paths_view(telemetry::host_view_from(a));
  json pb = telemetry::bundle_paths_view(telemetry::host_view_from(b));
  add_rates(pa, &pb, bundle_key, {"tx_bytes"}, dt);
  return pb;
}

// One line per path of every bundle: which are in service, which carries
// the two-sided work (*), what each sends now, how often it failed, its
// share of split WRITEs and its forward queue (C: congested).
void print_bundle_paths(std::ostream& out, const json& paths) {
  if (paths.empty()) return;
  out << "\n" << std::left << std::setw(8) << "pid" << std::setw(6) << "rank" << std::setw(10) << "device"
      << std::setw(8) << "qpn" << std::setw(9) << "path" << std::setw(10) << "udp sport" << std::setw(6) << "state"
      << std::setw(8) << "carrier" << std::setw(12) << "tx rate" << std::setw(9) << "failures" << std::setw(7)
      << "share" << "queue\n";
  auto share = [](const json& p) {
    if (!p.contains("share") || !p["share"].is_number()) return std::string("-");
    char b[16];
    snprintf(b, sizeof b, "%.2f", p["share"].get<double>());
    return std::string(b);
  };
  auto queue = [](const json& p) {
    if (!p.contains("queue") || !p["queue"].is_object()) return std::string("-");
    char b[32];
    snprintf(b, sizeof b, "%.1fms%s", p["queue"].value("excess_ns", 0.0) / 1e6,
             p["queue"].value("congested", false) ? " C" : "");
    return std::string(b);
  };
  for (auto& p : paths)
    out << std::setw(8) << p["pid"].get<std::string>() << std::setw(6) << p["rank"].get<std::string>() << std::setw(10)
        << p["device"].get<std::string>() << std::setw(8) << p["qpn"].get<uint64_t>() << std::setw(9)
        << p["path"].get<std::string>() << std::setw(10)
        << (p["udp_sport"].get<uint64_t>() ? std::to_string(p["udp_sport"].get<uint64_t>()) : "-") << std::setw(6)
        << (p["up"].get<bool>() ? "up" : "DOWN") << std::setw(8) << (p["carrier"].get<bool>() ? "*" : "")
        << std::setw(12) << rate(p["tx_bytes_per_s"].get<double>()) << std::setw(9) << p["fails"].get<uint64_t>()
        << std::setw(7) << share(p) << queue(p) << "\n";
}

struct ProcTotals {
  uint64_t tx = 0, rx = 0, sockets = 0, qps = 0;
};

std::map<std::string, ProcTotals> proc_totals(const json& a) {
  std::map<std::string, ProcTotals> out;
  for (auto& [pid, m] : a["members"].items()) {
    ProcTotals t;
    for (auto& s : m.value("sockets", json::array())) {
      t.tx += s.value("tx_bytes", uint64_t{0});
      t.rx += s.value("rx_bytes", uint64_t{0});
      if (s.value("open", false)) t.sockets++;
    }
    if (m.contains("verbs"))
      for (auto& q : m["verbs"].value("qps", json::array())) {
        t.tx += q.value("send_bytes", uint64_t{0});
        t.rx += q.value("recv_bytes", uint64_t{0});
        if (!q.value("destroyed", false)) t.qps++;
      }
    out[pid] = t;
  }
  return out;
}

json top_frame(const json& a, const json& b, double dt) {
  auto ta = proc_totals(a), tb = proc_totals(b);
  json procs = json::array();
  for (auto& [pid, t] : tb) {
    const json& m = b["members"][pid];
    auto it = ta.find(pid);
    double txr = it != ta.end() && dt > 0 ? double(t.tx - std::min(t.tx, it->second.tx)) / dt : 0;
    double rxr = it != ta.end() && dt > 0 ? double(t.rx - std::min(t.rx, it->second.rx)) / dt : 0;
    procs.push_back({{"pid", std::stol(pid)},
                     {"rank", m.value("rank", "")},
                     {"job", m.value("job", "")},
                     {"mode", m.value("mode", "")},
                     {"exited", m.value("final", false)},
                     {"sockets", t.sockets},
                     {"qps", t.qps},
                     {"tx_bytes", t.tx},
                     {"rx_bytes", t.rx},
                     {"tx_bytes_per_s", txr},
                     {"rx_bytes_per_s", rxr}});
  }
  return {{"agent_pid", b.value("agent_pid", 0L)},
          {"uptime_s", b.value("uptime_s", 0.0)},
          {"processes", procs},
          {"paths", paths_with_rates(a, b, dt)}};
}

void print_top(std::ostream& out, const json& f) {
  out << "shunt top: agent pid " << f["agent_pid"] << ", up " << std::fixed << std::setprecision(0)
      << f["uptime_s"].get<double>() << " s, " << f["processes"].size() << " processes\n\n";
  out << std::left << std::setw(9) << "pid" << std::setw(6) << "rank" << std::setw(9) << "mode" << std::setw(9)
      << "state" << std::setw(8) << "sockets" << std::setw(6) << "qps" << std::setw(12) << "tx rate" << std::setw(12)
      << "rx rate" << std::setw(14) << "tx total" << "rx total\n";
  for (auto& p : f["processes"])
    out << std::setw(9) << p["pid"].get<long>() << std::setw(6) << (p["rank"].get<std::string>().empty() ? "-" : p["rank"].get<std::string>())
        << std::setw(9) << p["mode"].get<std::string>() << std::setw(9) << (p["exited"].get<bool>() ? "exited" : "running")
        << std::setw(8) << p["sockets"].get<uint64_t>() << std::setw(6) << p["qps"].get<uint64_t>() << std::setw(12)
        << rate(p["tx_bytes_per_s"].get<double>()) << std::setw(12) << rate(p["rx_bytes_per_s"].get<double>())
        << std::setw(14) << p["tx_bytes"].get<uint64_t>() << p["rx_bytes"].get<uint64_t>() << "\n";
  out << "\n";
  print_paths(out, f["paths"]);
}

// Event log files of the host: the agent's and every member's.
std::vector<std::string> log_files(const json& a) {
  std::vector<std::string> files;
  auto addf = [&](const std::string& f) {
    if (!f.empty() && std::find(files.begin(), files.end(), f) == files.end()) files.push_back(f);
  };
  addf(a.value("event_log", ""));
  for (auto& [pid, m] : a["members"].items()) addf(m.value("event_log", ""));
  return files;
}

struct Reader {
  std::string path;
  std::streamoff pos = 0;
  std::string partial;
};

// New whole lines of every file, sorted by wall time.
std::vector<json> read_new(std::vector<Reader>& rs) {
  std::vector<json> evs;
  for (auto& r : rs) {
    std::ifstream in(r.path, std::ios::binary);
    if (!in) continue;
    in.seekg(r.pos);
    std::string chunk((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    r.pos += static_cast<std::streamoff>(chunk.size());
    r.partial += chunk;
    size_t nl;
    while ((nl = r.partial.find('\n')) != std::string::npos) {
      json e = json::parse(r.partial.substr(0, nl), nullptr, false);
      r.partial.erase(0, nl + 1);
      if (!e.is_discarded() && e.is_object()) evs.push_back(std::move(e));
    }
  }
  std::stable_sort(evs.begin(), evs.end(), [](const json& x, const json& y) {
    return x.value("wall_ns", int64_t{0}) < y.value("wall_ns", int64_t{0});
  });
  return evs;
}

void print_event(std::ostream& out, const json& e) {
  out << e.value("time", "") << "  " << std::left << std::setw(16) << e.value("event", "") << " pid " << e.value("pid", 0);
  if (auto r = e.value("rank", ""); !r.empty()) out << " rank " << r;
  static const char* skip[] = {"time", "wall_ns", "mono_ns", "event", "pid", "rank", "host", "job"};
  for (auto& [k, v] : e.items()) {
    if (std::find(std::begin(skip), std::end(skip), k) != std::end(skip)) continue;
    out << " " << k << "=" << (v.is_string() ? v.get<std::string>() : shunt::to_text(v));
  }
  out << "\n";
}
}  // namespace

std::string rate(double bytes_per_s) {
  const char* u[] = {"B/s", "kB/s", "MB/s", "GB/s", "TB/s"};
  int i = 0;
  while (bytes_per_s >= 1000 && i < 4) {
    bytes_per_s /= 1000;
    i++;
  }
  std::ostringstream s;
  s << std::fixed << std::setprecision(i ? 1 : 0) << bytes_per_s << " " << u[i];
  return s.str();
}

int paths_command(std::ostream& out, const LiveOptions& o) {
  auto a = ask();
  if (!a) return 2;
  double t0 = now_s();
  std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
  auto b = ask();
  if (!b) return 2;
  double dt = now_s() - t0;
  json paths = paths_with_rates(*a, *b, dt), bundles = bundle_paths_with_rates(*a, *b, dt);
  if (o.json) {
    out << shunt::to_text(json{{"paths", paths}, {"bundle_paths", bundles}}, 2) << "\n";
  } else {
    print_paths(out, paths);
    print_bundle_paths(out, bundles);
  }
  return 0;
}

int top_command(std::ostream& out, const LiveOptions& o) {
  auto a = ask();
  if (!a) return 2;
  double t = now_s();
  bool tty = !o.json && isatty(STDOUT_FILENO);
  for (int i = 0; o.iterations <= 0 || i < o.iterations; i++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(o.interval_ms));
    auto b = ask();
    if (!b) return 2;
    double now = now_s();
    json f = top_frame(*a, *b, now - t);
    if (o.json) {
      out << shunt::to_text(f) << std::endl;  // one JSON object per line
    } else {
      if (tty) out << "\033[H\033[2J";
      print_top(out, f);
      out << std::flush;
    }
    a = b;
    t = now;
  }
  return 0;
}

int events_command(std::ostream& out, const LiveOptions& o) {
  std::vector<Reader> rs;
  auto refresh = [&](bool quiet) -> bool {
    if (!o.file.empty()) {
      if (rs.empty()) rs.push_back({o.file});
      return true;
    }
    auto a = ask(quiet);
    if (!a) return false;
    for (auto& f : log_files(*a))
      if (std::none_of(rs.begin(), rs.end(), [&](const Reader& r) { return r.path == f; })) rs.push_back({f});
    return true;
  };
  if (!refresh(false)) return 2;
  if (rs.empty() && !o.follow) {
    std::cerr << "shuntctl: no event log (set SHUNT_EVENT_LOG for the job)\n";
    return 1;
  }
  auto evs = read_new(rs);
  if (o.json && !o.follow) {
    out << shunt::to_text(json(evs), 2) << "\n";
    return 0;
  }
  for (;;) {
    for (auto& e : evs) {
      if (o.json) out << shunt::to_text(e) << "\n";
      else print_event(out, e);
    }
    out << std::flush;
    if (!o.follow) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if (o.file.empty()) refresh(true);  // new members may bring new logs; a gone agent is no reason to stop
    evs = read_new(rs);
  }
}

}  // namespace shunt::ctl
