#include "tools/shuntctl/diagnose_cmd.h"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json_text.h"
#include "peer/channel.h"
#include "tools/shuntctl/agent_cmd.h"
#include "tools/shuntctl/telemetry_cmd.h"

extern char** environ;

namespace shunt::ctl {

namespace {
using nlohmann::json;

std::string fmt_rate(const json& v) { return v.is_number() ? rate(v.get<double>()) : "-"; }

// Every host's view: this host's first, then its probe peers' (those that answer).
json gather(const json& own, const DiagnoseArgs& a, std::vector<std::string>* unanswered) {
  json hosts = json::array({own});
  if (a.local) return hosts;
  // The job's key as libshunt reads it (SHUNT_JOB_KEY, else the first line of SHUNT_JOB_KEY_FILE)
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  const std::string key = load_config([](const char* n) { return getenv(n); }, &errors, &warnings, environ)
                              .str(Param::job_key);
  const json& peers = own.value("peers", json::array());
  if (peers.empty()) return hosts;
  if (key.empty()) {
    unanswered->push_back("the other hosts (no SHUNT_JOB_KEY here: set the job's key to ask them)");
    return hosts;
  }
  const int port = own.value("peer_port", 0);
  for (const auto& p : peers) {
    std::vector<std::string> addrs;
    for (const auto& x : p.value("addrs", json::array()))
      if (x.is_string() && !x.get<std::string>().empty()) addrs.push_back(x.get<std::string>());
    std::string err;
    size_t winner = 0;
    auto ans = addrs.empty() ? std::nullopt
                             : peer::race(addrs, port, peer::job_key_from(key), {{"cmd", "diagnose"}}, a.timeout_ms,
                                          &winner, &err);
    if (ans && ans->is_object() && !ans->contains("error")) hosts.push_back(*ans);
    else unanswered->push_back(p.value("name", "?") + (err.empty() ? "" : " (" + err + ")"));
  }
  return hosts;
}

// The job's verdict: the places the hosts blame, the one most hosts name
// first (then the most slow pairs). A place is a host's addresses: a link
// is at its host's leaf; the hosts' names of one place differ (each sees a
// spine at the address of its own leaf's link; one sees a link where
// another, with no probe evidence, sees the host), so they are grouped by
// address, shown as a link when any host has the evidence for one, under
// the name the host at that place gives it when it is among them.
json verdict(const json& hosts) {
  std::map<std::string, std::string> place_of;  // address -> place id
  std::map<std::string, json> by;
  for (const auto& h : hosts) {
    const json& s = h.value("slowdown", json());
    if (!s.is_object()) continue;
    std::string id;
    for (const auto& a : s.value("at", json::array()))
      if (a.is_string() && place_of.count(a.get<std::string>())) id = place_of[a.get<std::string>()];
    if (id.empty()) id = s.value("cause", "") + " " + s.value("name", "");
    for (const auto& a : s.value("at", json::array()))
      if (a.is_string()) place_of[a.get<std::string>()] = id;
    json& v = by[id];
    if (v.is_null()) v = {{"cause", s["cause"]}, {"name", s["name"]}, {"hosts", json::array()}, {"pairs", json::array()},
                          {"worst_factor", 1.0}, {"confidence", s.value("confidence", "")}, {"evidence", json::array()}};
    // The host at that place names it best; a link beats a host.
    bool own = false;
    for (const auto& p : h.value("pairs", json::array()))
      for (const auto& a : s.value("at", json::array())) own |= p.value("local", "") == a;
    const bool link = s.value("cause", "") == "link";
    if ((link && v["cause"] != "link") || (own && (link || v["cause"] != "link"))) {
      v["cause"] = s["cause"];
      v["name"] = s["name"];
      v["confidence"] = s.value("confidence", "");
    }
    v["hosts"].push_back(h.value("host", "?"));
    for (const auto& p : s.value("pairs", json::array())) v["pairs"].push_back(p);
    v["worst_factor"] = std::min(v["worst_factor"].get<double>(), s.value("worst_factor", 1.0));
    v["evidence"].push_back(h.value("host", "?") + ": " + s.value("cause", "") + " " + s.value("name", "") + ", " +
                            s.value("evidence", ""));
  }
  json out = json::array();
  for (auto& [id, v] : by) {
    // One host's low-confidence word (one slow pair, no evidence) is a
    // place to watch, not the job's verdict.
    v["watch"] = v["hosts"].size() < 2 && v.value("confidence", "") == "low";
    out.push_back(v);
  }
  std::sort(out.begin(), out.end(), [](const json& x, const json& y) {
    if (x["watch"] != y["watch"]) return y["watch"].get<bool>();
    if (x["hosts"].size() != y["hosts"].size()) return x["hosts"].size() > y["hosts"].size();
    if (x["pairs"].size() != y["pairs"].size()) return x["pairs"].size() > y["pairs"].size();
    return x["worst_factor"].get<double>() < y["worst_factor"].get<double>();
  });
  return out;
}
// What --watch keeps of each look.
struct WatchLook {
  double t = 0;
  std::string cause;                                            // the job's first cause, "" when healthy
  std::map<std::string, double> steps;                          // "HOST/RANK" -> step ms
  std::map<std::string, std::map<std::string, double>> queue;  // host -> spine -> its routes' longest queue, ms
};

WatchLook watch_look(double t, const json& hosts, const json& causes) {
  WatchLook w;
  w.t = t;
  if (!causes.empty()) w.cause = causes[0].value("cause", "") + " " + causes[0].value("name", "");
  for (const auto& h : hosts) {
    const std::string host = h.value("host", "?");
    for (const auto& s : h.value("steps", json::array()))
      if (s.is_object() && s.value("period_ms", json()).is_number()) {
        const json& r = s.value("rank", json());
        w.steps[host + "/" + (r.is_string() && !r.get<std::string>().empty() ? r.get<std::string>() : s.value("pid", "?"))] =
            s["period_ms"].get<double>();
      }
    for (const auto& q : h.value("queues", json::array())) {
      if (!q.is_object() || !q.value("excess_ms", json()).is_number()) continue;
      double& v = w.queue[host][q.value("router", "")];
      v = std::max(v, q["excess_ms"].get<double>());
    }
  }
  return w;
}

std::string gp_quoted(std::string s) {
  for (char& c : s)
    if (c == '"' || c == '\\' || c == '\n') c = '\'';
  return "\"" + s + "\"";
}

// The watch drawn with gnuplot: each rank's step time above, the queue of
// the routes through the spine of the link blamed most often below (the
// longest route queue of each host when no link was blamed), a dashed line
// at each change of the verdict.
bool plot_watch(const std::vector<WatchLook>& looks, const std::string& file, std::string* err) {
  std::map<std::string, int> blamed;  // spine -> looks a link to it was the verdict
  for (const auto& w : looks)
    if (w.cause.rfind("link ", 0) == 0 && w.cause.find(" ~ ") != std::string::npos)
      blamed[w.cause.substr(w.cause.find(" ~ ") + 3)]++;
  std::string spine;
  for (const auto& [s, n] : blamed)
    if (spine.empty() || n > blamed[spine]) spine = s;
  std::ostringstream gp;
  gp << (file.size() >= 4 && file.compare(file.size() - 4, 4, ".svg") == 0
             ? "set terminal svg size 1000,650 dynamic background rgb 'white'\n"
             : "set terminal pngcairo size 1000,650\n");
  gp << "set output " << gp_quoted(file) << "\n";
  std::set<std::string> ranks, hosts;
  for (const auto& w : looks) {
    for (const auto& [k, v] : w.steps) ranks.insert(k);
    for (const auto& [h, q] : w.queue) hosts.insert(h);
  }
  int i = 0;
  for (const auto& k : ranks) {
    gp << "$s" << i++ << " << EOD\n";
    for (const auto& w : looks)
      if (w.steps.count(k)) gp << w.t << " " << w.steps.at(k) << "\n";
    gp << "EOD\n";
  }
  i = 0;
  for (const auto& h : hosts) {
    gp << "$q" << i++ << " << EOD\n";
    for (const auto& w : looks) {
      auto it = w.queue.find(h);
      if (it == w.queue.end()) continue;
      double v = -1;
      for (const auto& [s, x] : it->second)
        if (spine.empty() || s == spine) v = std::max(v, x);
      if (v >= 0) gp << w.t << " " << v << "\n";
    }
    gp << "EOD\n";
  }
  const double end = looks.empty() ? 1 : std::max(1.0, looks.back().t);
  gp << "set multiplot layout 2,1 title " << gp_quoted("shuntctl diagnose --watch") << "\n"
     << "set grid\nset key top right\nset xrange [0:" << end << "]\nset yrange [0:*]\n";
  int n = 0;
  for (size_t j = 1; j < looks.size(); j++)
    if (looks[j].cause != looks[j - 1].cause) {
      const double t = looks[j].t;
      gp << "set arrow from " << t << ", graph 0 to " << t << ", graph 1 nohead dt 2 lw 1.5 lc rgb 'red'\n"
         << "set label " << ++n << " " << gp_quoted(looks[j].cause.empty() ? "healthy" : looks[j].cause) << " at " << t
         << ", graph 0.97 rotate by 90 right offset -0.8,0 tc rgb 'red' font ',8'\n";
    }
  auto plot = [&](const char* block, const std::set<std::string>& names, const std::string& none) {
    if (names.empty()) {
      gp << "set yrange [0:1]\nset label " << ++n << " " << gp_quoted(none) << " at graph 0.5, graph 0.5 center\n"
         << "plot -1 notitle\nset yrange [0:*]\n";
      return;
    }
    gp << "plot ";
    int k = 0;
    for (const auto& name : names) {
      gp << (k ? ", " : "") << "$" << block << k << " using 1:2 with lines lw 2 title " << gp_quoted(name);
      k++;
    }
    gp << "\n";
  };
  gp << "set ylabel 'step time (ms)'\n";
  plot("s", ranks, "no step rhythm seen");
  gp << "set xlabel 'time (s)'\nset ylabel " << gp_quoted(spine.empty() ? "longest route queue (ms)" : "queue via " + spine + " (ms)")
     << "\n";
  plot("q", hosts, "no route queues (probing off?)");
  gp << "unset multiplot\n";
  FILE* g = popen("gnuplot 2>&1", "w");
  if (!g) {
    *err = "cannot run gnuplot";
    return false;
  }
  const std::string text = gp.str();
  fwrite(text.data(), 1, text.size(), g);
  const int status = pclose(g);
  if (status != 0) {
    *err = "gnuplot could not draw " + file + (WIFEXITED(status) && WEXITSTATUS(status) == 127 ? " (is gnuplot installed?)" : "");
    return false;
  }
  return true;
}

int watch(std::ostream& out, const DiagnoseArgs& a) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  std::vector<WatchLook> looks;
  for (int i = 0; i < a.watch_s; i++) {
    int rc = 0;
    auto own = ask_agent({{"cmd", "diagnose"}}, &rc);
    const double t = std::chrono::duration<double>(clock::now() - start).count();
    if (own) {
      std::vector<std::string> unanswered;
      json hosts = gather(*own, a, &unanswered), causes = json::array();
      for (auto& c : verdict(hosts))
        if (!c.value("watch", false)) causes.push_back(c);
      looks.push_back(watch_look(t, hosts, causes));
      const WatchLook& w = looks.back();
      std::string steps;
      for (const auto& [k, v] : w.steps) steps += " " + k + ":" + std::to_string(static_cast<long>(v + 0.5));
      char head[64];
      std::snprintf(head, sizeof head, "%7.1f s  ", t);
      out << head << (w.cause.empty() ? "healthy" : "SLOW: " + w.cause) << (steps.empty() ? "" : "  steps (ms):" + steps)
          << std::endl;
    } else if (looks.empty() && i == 0) {
      return rc;
    }
    const auto next = start + std::chrono::seconds(i + 1);
    if (i + 1 < a.watch_s && clock::now() < next) usleep(static_cast<useconds_t>(
        std::chrono::duration_cast<std::chrono::microseconds>(next - clock::now()).count()));
  }
  if (a.plot.empty()) return 0;
  std::string err;
  if (!plot_watch(looks, a.plot, &err)) {
    std::cerr << "shuntctl diagnose: " << err << "\n";
    return 1;
  }
  out << "plot: " << a.plot << "\n";
  return 0;
}
}  // namespace

int diagnose_command(std::ostream& out, const DiagnoseArgs& a) {
  if (a.watch_s > 0) return watch(out, a);
  int rc = 0;
  auto own = ask_agent({{"cmd", "diagnose"}}, &rc);
  if (!own) return rc;
  std::vector<std::string> unanswered;
  json hosts = gather(*own, a, &unanswered);
  json all = verdict(hosts), causes = json::array(), watch = json::array();
  for (auto& c : all) (c.value("watch", false) ? watch : causes).push_back(c);
  if (a.json) {
    json u = json::array();
    for (auto& s : unanswered) u.push_back(s);
    out << to_text(json{{"state", causes.empty() ? "healthy" : "slow"}, {"causes", causes}, {"watch", watch},
                        {"hosts", hosts}, {"unanswered", u}},
                   2)
        << "\n";
    return 0;
  }
  if (causes.empty()) {
    bool warming = false;
    for (const auto& h : hosts) warming |= h.value("state", "") == "warming up" || h.value("state", "") == "no data";
    out << "job: " << (warming ? "no slowdown seen (some pairs have no baseline yet)" : "healthy") << "\n";
  }
  for (const auto& c : causes) {
    std::string hs;
    for (const auto& h : c["hosts"]) hs += (hs.empty() ? "" : ", ") + h.get<std::string>();
    char f[16];
    std::snprintf(f, sizeof f, "%.2f", c["worst_factor"].get<double>());
    out << "SLOW: " << c["cause"].get<std::string>() << " " << c["name"].get<std::string>() << " (confidence "
        << c.value("confidence", "") << ", slowest pair at " << f << "x its baseline), named by " << hs << "\n";
    for (const auto& e : c["evidence"]) out << "  " << e.get<std::string>() << "\n";
  }
  for (const auto& c : watch) {
    out << "watch: " << c["cause"].get<std::string>() << " " << c["name"].get<std::string>()
        << " (one slow pair, no probe evidence), seen by " << c["hosts"][0].get<std::string>() << "\n";
  }
  // Each host's step rhythm, per rank (telemetry/rhythm.h).
  for (const auto& h : hosts) {
    std::string line;
    for (const auto& s : h.value("steps", json::array())) {
      if (!s.is_object() || !s.value("period_ms", json()).is_number()) continue;
      char one[160];
      const std::string rank = s.value("rank", json()).is_string() ? s["rank"].get<std::string>() : "";
      std::snprintf(one, sizeof one, "%s %.0f ms (%.0f%% communicating, sure %.2f)",
                    rank.empty() ? ("pid " + s.value("pid", std::string("?"))).c_str() : ("rank " + rank).c_str(),
                    s["period_ms"].get<double>(), 100 * s.value("comm_share", 0.0), s.value("confidence", 0.0));
      line += (line.empty() ? "" : "; ") + std::string(one);
    }
    if (!line.empty()) out << "step: " << h.value("host", "?") << ": " << line << "\n";
  }
  // Every pair, worst first.
  std::vector<std::pair<double, std::string>> rows;
  for (const auto& h : hosts)
    for (const auto& p : h.value("pairs", json::array())) {
      const json& f = p.value("factor", json());
      std::string routes;
      for (const auto& r : p.value("routes", json::array())) routes += (routes.empty() ? "" : ",") + r.get<std::string>();
      // The share of recent steps this pair ended last: the steps' critical path.
      const json& ls = p.value("last_share", json());
      const std::string last = ls.is_number() ? std::to_string(static_cast<int>(std::clamp(ls.get<double>(), 0.0, 1.0) * 100 + 0.5)) + "%" : "-";
      char line[256];
      std::snprintf(line, sizeof line, "%-12s %-16s %-16s %11s %11s %7s %-5s %5s %s", h.value("host", "?").c_str(),
                    p.value("local", "").c_str(), p.value("peer", "").c_str(), fmt_rate(p.value("rate_Bps", json())).c_str(),
                    fmt_rate(p.value("baseline_Bps", json())).c_str(),
                    f.is_number() ? (std::to_string(f.get<double>()).substr(0, 4) + "x").c_str() : "-",
                    p.value("slow", false) ? "SLOW" : "ok", last.c_str(), routes.empty() ? "-" : routes.c_str());
      rows.push_back({f.is_number() ? f.get<double>() : 9.0, line});
    }
  std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
  if (!rows.empty()) {
    char head[256];
    std::snprintf(head, sizeof head, "%-12s %-16s %-16s %11s %11s %7s %-5s %5s %s", "host", "local", "peer", "busy rate",
                  "baseline", "ratio", "state", "last", "spines");
    out << head << "\n";
    for (auto& [f, l] : rows) out << l << "\n";
  }
  for (const auto& u : unanswered) out << "not asked or no answer: " << u << "\n";
  return 0;
}

}  // namespace shunt::ctl
