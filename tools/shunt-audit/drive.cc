#include "tools/shunt-audit/drive.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <thread>
#include <tuple>

#include "peer/channel.h"
#include "tools/shunt-audit/facts.h"
#include "tools/shunt-audit/mesh.h"
#include "tools/shunt-audit/report.h"
#include "tools/shunt-audit/verdict.h"

namespace audit {
namespace {

using nlohmann::json;

class Driver {
 public:
  Driver(const Options& o, const shunt::peer::Key& key) : o_(o), key_(key), n_(o.hosts.size()) {}

  int run() {
    auto t0 = std::chrono::steady_clock::now();
    if (!join()) return kExitCannotRun;
    std::vector<audit::Measurement> ms;
    if (!o_.no_backend) ms = backend();
    audit::Mesh mesh = probe_mesh();
    progress("counters");
    std::vector<json> after;
    for (size_t i = 0; i < n_; i++)
      after.push_back(ask_or_null(i, {{"cmd", "audit_counters"}}, 20000));
    audit::Node tree = audit::evaluate(facts_, names_, after, ms, o_.t, &mesh);
    audit::Judged j = audit::judge_backend(ms, o_.t, names_);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    progress_end();
    json rep = audit::report_json(tree, names_, o_.hosts, facts_, ms, j, secs, &mesh, o_.t);
    bool ok = true;
    if (!o_.json_out.empty()) ok &= write(o_.json_out, rep.dump(2) + "\n");
    if (!o_.html_out.empty()) ok &= write(o_.html_out, audit::report_html(rep));
    audit::print_tree(std::cout, tree, o_.verbose, isatty(1));
    std::cout << audit::verdict_line(tree) << fmt::format(" in {:.0f} s", secs) << "\n";
    int rc = audit::exit_code(tree.status);
    for (size_t i = 0; i < n_; i++)
      if (i != 0)
        ask_or_null(i,
                    {{"cmd", "audit_done"}, {"status", rc}, {"verdict", audit::verdict_line(tree)}},
                    5000);
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
            std::cerr << "shunt-audit: host " << o_.hosts[i] << " did not answer within "
                      << o_.join_s << " s: " << last << "\n";
            return false;
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
        }
      }
    }
    progress("front-end: every host reaching every other");
    for (size_t i = 0; i < n_; i++) facts_[i]["reach"] = ask_or_null(i, {{"cmd", "audit_reach"}}, 10000 + 4000 * n_);
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
      json h = ask_or_null(a,
                           {{"cmd", "audit_hops"},
                            {"rail", r},
                            {"peer", rails_[b][r].ipv4},
                            {"n", o_.candidates},
                            {"wait_ms", o_.discovery_ms}},
                           15000);
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
      ask(a,
          {{"cmd", "audit_connect"},
           {"id", id},
           {"remote", eb},
           {"flow_label", sport ? sport & 0x3fff : 0}},
          15000);
      json x = ask(
          a, {{"cmd", "audit_measure"}, {"id", id}, {"ms", o_.bw_ms}, {"rounds", o_.lat_rounds}},
          o_.bw_ms + 30000);
      if (x.contains("rc_error"))
        m.error = x["rc_error"];
      else
        m.mbps = x.value("mbps", 0.0), m.lat_us = x.value("lat_us", 0.0);
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
          progress(fmt::format("back-end: {}/{} pairs, rail {} {} -> {}", done++, total, r,
                               names_[a], names_[b]));
          std::string why;
          for (size_t h : {a, b}) {
            if (r >= rails_[h].size())
              why = names_[h] + " has no rail " + std::to_string(r);
            else if (!rails_[h][r].active)
              why = names_[h] + "'s " + rails_[h][r].dev + " port is not ACTIVE";
            else if (rails_[h][r].ipv4.empty())
              why = names_[h] + "'s " + rails_[h][r].dev + " has no IPv4 RoCEv2 GID";
            if (!why.empty()) break;
          }
          if (!why.empty()) {
            audit::Measurement m{static_cast<int>(a), static_cast<int>(b), ri};
            m.skipped = why;
            ms.push_back(m);
            continue;
          }
          for (auto& [router, sport] : paths(a, b, ri))
            ms.push_back(measure(a, b, ri, router, sport));
        }
    // Outliers and errors again, twice at most (a busy host, a lost
    // packet): the best result counts, so what is reported is what
    // repeats. Those a degraded link explains are not measured again.
    int left = o_.retests;
    for (int round = 0; round < 2; round++) {
      audit::Judged j = audit::judge_backend(ms, o_.t);
      for (size_t i = 0; i < ms.size() && left > 0; i++) {
        auto& m = ms[i];
        if (!m.skipped.empty() ||
            (j.bw[i] == audit::Status::pass && j.lat[i] == audit::Status::pass && m.error.empty()))
          continue;
        left--;
        progress(fmt::format("back-end: again, rail {} {} -> {}", m.rail, names_[m.src], names_[m.dst]));
        auto again = measure(m.src, m.dst, m.rail, m.router, m.sport);
        if (!again.error.empty()) continue;
        if (!m.error.empty())
          m = again;
        else
          m.mbps = std::max(m.mbps, again.mbps), m.lat_us = std::min(m.lat_us, again.lat_us);
      }
    }
    return ms;
  }

  // The probe mesh, after the measurements so that nothing else loads the
  // paths: every host's probe engine probes every other host on every rail
  // both have up, from the probe port and from a source port through each
  // spine that path discovery finds (for the probes' own destination port). Loss is read from the
  // feedback counters twice, after a warm-up and --probe-s later, from the sender's own view (no
  // two hosts' readings are compared, so when each was taken does not matter).
  audit::Mesh probe_mesh() {
    audit::Mesh mesh;
    if (o_.probe_s <= 0) return mesh;
    size_t nrails = 0;
    for (auto& r : rails_) nrails = std::max(nrails, r.size());
    if (nrails == 0) return mesh;  // no RDMA port anywhere: nothing to probe
    json hosts = json::array();
    for (size_t h = 0; h < n_; h++) {
      json a = json::array();
      for (size_t r = 0; r < nrails; r++)
        a.push_back(r < rails_[h].size() && rails_[h][r].active ? rails_[h][r].ipv4 : "");
      hosts.push_back({{"addrs", a}});
    }
    auto stop = [&] {
      for (size_t h = 0; h < n_; h++) ask_or_null(h, {{"cmd", "audit_mesh_stop"}}, 5000);
    };
    progress("probe mesh: finding each host's paths through the spines");
    // Every host at once: each finds its own source paths first.
    std::vector<std::future<json>> started;
    for (size_t h = 0; h < n_; h++)
      started.push_back(std::async(std::launch::async, [&, h] {
        return ask_or_null(h,
                           {{"cmd", "audit_mesh_start"},
                            {"hosts", hosts},
                            {"candidates", std::min(o_.candidates, 4)},
                            {"discovery_ms", o_.discovery_ms},
                            {"port", o_.probe_port},
                            {"interval_ms", o_.probe_ms}},
                           60000);
      }));
    for (size_t h = 0; h < n_; h++) {
      json r = started[h].get();
      if (r.is_null() && mesh.error.empty())
        mesh.error = names_[h] + " could not start its probe engine";
      for (auto& e : r.is_object() ? r.value("errors", json::array()) : json::array())
        std::cerr << "shunt-audit: " << names_[h] << ": source path " << e.get<std::string>()
                  << "\n";
    }
    if (!mesh.error.empty()) {
      stop();
      return mesh;
    }
    auto reports = [&] {
      std::vector<json> out;
      for (size_t h = 0; h < n_; h++)
        out.push_back(ask_or_null(h, {{"cmd", "audit_mesh_report"}}, 15000));
      return out;
    };
    auto wait = [&](double secs, const char* what) {
      auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(secs);
      while (std::chrono::steady_clock::now() < until) {
        progress(fmt::format("probe mesh: {}", what));
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
      }
    };
    wait(3, "warming up");
    auto t1 = std::chrono::steady_clock::now();
    std::vector<json> before = reports();
    wait(o_.probe_s, "probing every path");
    std::vector<json> after = reports();
    mesh.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
    stop();
    // One path's counters out of a report: its rail entry, or the source
    // path with that rail and port.
    auto find = [](const json& rep, size_t peer, int rail, int port) -> json {
      if (!rep.is_object()) return nullptr;
      for (auto& p : rep.value("peers", json::array())) {
        if (p.value("host", -1) != static_cast<int>(peer)) continue;
        if (!port) return rail < static_cast<int>(p["rails"].size()) ? p["rails"][rail] : json();
        for (auto& s : p["sources"])
          if (s.value("rail", -1) == rail && s.value("port", -1) == port) return s;
      }
      return nullptr;
    };
    auto add = [&](size_t a, size_t b, int rail, int port, const std::string& router) {
      audit::ProbedPath p{static_cast<int>(a), static_cast<int>(b), rail, router, port};
      json x = find(after[a], b, rail, port), y = find(before[a], b, rail, port);
      if (x.is_object()) {
        double sent = x.value("sent", 0.0) - (y.is_object() ? y.value("sent", 0.0) : 0.0);
        double rx = x.value("rx", 0.0) - (y.is_object() ? y.value("rx", 0.0) : 0.0);
        p.heard = rx > 0;
        p.loss = sent > 0 ? std::clamp(1 - rx / sent, 0.0, 1.0) : 1.0;
        double owd = x.value("owd_ns", -1.0);
        p.owd_us = owd >= 0 ? owd / 1000 : -1;
      }
      mesh.paths.push_back(p);
    };
    for (size_t a = 0; a < n_; a++)
      for (size_t b = 0; b < n_; b++) {
        if (a == b) continue;
        for (size_t r = 0; r < nrails; r++)
          if (!hosts[a]["addrs"][r].get<std::string>().empty() &&
              !hosts[b]["addrs"][r].get<std::string>().empty())
            add(a, b, static_cast<int>(r), 0, "");
      }
    // The source paths each host found, by the routers it found them through.
    for (size_t a = 0; a < n_; a++)
      if (after[a].is_object())
        for (auto& p : after[a].value("peers", json::array()))
          for (auto& sp : p.value("sources", json::array())) {
            int b = p.value("host", -1);
            if (b < 0 || b >= static_cast<int>(n_)) continue;
            add(a, b, sp.value("rail", 0), sp.value("port", 0), sp.value("router", ""));
          }
    mesh.clocks.assign(n_, audit::HostClock{});
    mesh.clocks[0].valid = true;
    if (after[0].is_object())
      for (auto& p : after[0].value("peers", json::array())) {
        int h = p.value("host", -1);
        json c = p.value("clock", json::object());
        if (h <= 0 || h >= static_cast<int>(n_) || !c.value("valid", false)) continue;
        mesh.clocks[h] = {true, c.value("offset_ns", 0.0) / 1e6,
                          c.value("rough", false) ? -1.0 : c.value("bound_ns", 0.0) / 1e3};
      }
    mesh.ran = true;
    return mesh;
  }

  void progress(const std::string& s) {
    if (o_.quiet) return;
    auto secs =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() - start_)
            .count();
    if (isatty(2))
      std::cerr << "\r\033[K[shunt-audit " << secs << "s] " << s << std::flush;
    else
      std::cerr << "[shunt-audit " << secs << "s] " << s << "\n";
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

int drive(const Options& o, const shunt::peer::Key& key) {
  return Driver(o, key).run();
}

}  // namespace audit
