#include "tools/shunt-audit/drive.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <map>
#include <thread>

#include "interpose/peer/channel.h"
#include "tools/shunt-audit/facts.h"
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
    progress("counters");
    std::vector<json> after;
    for (size_t i = 0; i < n_; i++)
      after.push_back(ask_or_null(i, {{"cmd", "audit_counters"}}, 20000));
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
