#include "tools/shunt-audit/verdict.h"

#include <fmt/format.h>

#include <algorithm>
#include <functional>
#include <map>
#include <set>
#include <tuple>

#include "tools/shunt-audit/mesh.h"

using nlohmann::json;

namespace audit {

const char* status_name(Status s) {
  switch (s) {
    case Status::pass:
      return "pass";
    case Status::warn:
      return "warn";
    case Status::fail:
      return "fail";
  }
  return "?";
}

Status Node::roll_up() {
  for (auto& c : children) status = worst(status, c.roll_up());
  return status;
}

json to_json(const Node& n) {
  json j{{"name", n.name}, {"status", status_name(n.status)}};
  if (!n.detail.empty()) j["detail"] = n.detail;
  if (!n.where.empty()) j["where"] = n.where;
  if (!n.children.empty()) {
    j["children"] = json::array();
    for (auto& c : n.children) j["children"].push_back(to_json(c));
  }
  return j;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string majority(const std::vector<std::string>& values) {
  std::map<std::string, int> n;
  for (auto& v : values) n[v]++;
  std::string best;
  int most = 0;
  for (auto& [v, c] : n)  // ordered: ties go to the smallest
    if (c > most) most = c, best = v;
  return best;
}

Status judge_higher(double v, double m, double warn_frac, double fail_frac, double warn_floor,
                    double fail_floor) {
  if (v < fail_floor || v < fail_frac * m) return Status::fail;
  if (v < warn_floor || v < warn_frac * m) return Status::warn;
  return Status::pass;
}

Status judge_lower(double v, double m, double warn_mult, double fail_mult, double slack) {
  if (v - m <= slack) return Status::pass;
  if (v > fail_mult * m) return Status::fail;
  if (v > warn_mult * m) return Status::warn;
  return Status::pass;
}

std::vector<LinkFinding> find_links(const std::vector<PathValue>& ps, bool higher_better,
                                    const std::function<Status(double, int)>& judge) {
  std::vector<LinkFinding> out;
  std::map<std::pair<int, int>, std::map<std::string, std::vector<size_t>>> groups;
  for (size_t i = 0; i < ps.size(); i++)
    if (!ps[i].skip) groups[{ps[i].host, ps[i].rail}][ps[i].router].push_back(i);
  for (auto& [k, by_router] : groups) {
    auto [host, rail] = k;
    std::map<std::string, double> med;
    double best = 0;
    size_t count = 0;
    for (auto& [router, idx] : by_router) {
      std::vector<double> v;
      for (size_t i : idx) v.push_back(ps[i].value);
      med[router] = median(v);
      if (count == 0 || (higher_better ? med[router] > best : med[router] < best))
        best = med[router];
      count += idx.size();
    }
    if (Status s = judge(best, rail); s != Status::pass) {
      if (count < 2) continue;  // one path: that pair, nothing to tell a link by
      LinkFinding f{host, rail, "", s, best, {}};
      for (auto& [router, idx] : by_router) f.idx.insert(f.idx.end(), idx.begin(), idx.end());
      out.push_back(std::move(f));
      continue;
    }
    for (auto& [router, idx] : by_router) {
      Status s = judge(med[router], rail);
      if (router.empty() || s == Status::pass) continue;
      out.push_back({host, rail, router, s, med[router], idx});
    }
  }
  return out;
}

namespace {

// One round of judge_backend: every measurement against its rail's median
// over the measurements not in `excluded`.
Judged judge_round(const std::vector<Measurement>& ms, const Thresholds& t,
                   const std::vector<std::string>& names, const std::vector<bool>& excluded) {
  Judged out;
  auto name = [&](int h) {
    return h < static_cast<int>(names.size()) ? names[h] : fmt::format("host {}", h);
  };
  out.bw.assign(ms.size(), Status::pass);
  out.lat.assign(ms.size(), Status::pass);
  out.note.assign(ms.size(), "");
  out.explained.assign(ms.size(), false);
  std::map<int, std::vector<double>> bw_of_rail, lat_of_rail;
  for (size_t i = 0; i < ms.size(); i++)
    if (ms[i].error.empty() && ms[i].skipped.empty() && !excluded[i])
      bw_of_rail[ms[i].rail].push_back(ms[i].mbps), lat_of_rail[ms[i].rail].push_back(ms[i].lat_us);
  std::map<int, double>& bw_med = out.bw_median;
  std::map<int, double> lat_med;
  for (auto& [r, v] : bw_of_rail) bw_med[r] = median(v);
  for (auto& [r, v] : lat_of_rail) lat_med[r] = median(v);
  for (size_t i = 0; i < ms.size(); i++) {
    auto& m = ms[i];
    if (!m.skipped.empty()) continue;
    if (!m.error.empty()) {
      out.bw[i] = out.lat[i] = Status::fail;
      continue;
    }
    out.bw[i] = judge_higher(m.mbps, bw_med[m.rail], t.bw_warn_frac, t.bw_fail_frac,
                             t.bw_warn_floor, t.bw_fail_floor);
    out.lat[i] =
        judge_lower(m.lat_us, lat_med[m.rail], t.lat_warn_mult, t.lat_fail_mult, t.lat_slack_us);
  }
  // A host's measurements on a rail, by the router they went through.
  // Where even its best router's are slow, the host itself is (its NIC, or
  // its link to the leaf: router "" in links); otherwise a router whose
  // measurements are slow as a group names the link from the host's leaf
  // up to that router. Either way the link, not its pairs, is reported.
  std::vector<PathValue> pv;
  for (auto& m : ms)
    pv.push_back({m.src, m.rail, m.router, m.error.empty() ? m.mbps : 0, !m.skipped.empty()});
  auto judge_bw = [&](double v, int rail) {
    return judge_higher(v, bw_med[rail], t.bw_warn_frac, t.bw_fail_frac, t.bw_warn_floor, t.bw_fail_floor);
  };
  for (auto& f : find_links(pv, true, judge_bw)) {
    out.links.push_back({f.host, f.rail, f.router, f.status, f.value, bw_med[f.rail]});
    // (its queue slows the reads too: their latency is the link's as well)
    std::string why =
        f.router.empty()
            ? fmt::format("slow from {} on every path: its NIC or its link to the leaf",
                          name(f.host))
            : fmt::format("slow through the link from {}'s leaf up to {}", name(f.host), f.router);
    for (size_t i : f.idx)
      out.bw[i] = out.lat[i] = Status::pass, out.note[i] = why, out.explained[i] = true;
  }
  // The same link carries traffic down to that host as well (its fault
  // is usually both ways): slow measurements towards it on that rail are
  // its, not their senders', and so are connections that failed (a queue
  // that drops or a link that loses ends RC's retries; those from the
  // host through the link are the link's above, as measurements of 0).
  for (auto& l : out.links)
    for (size_t i = 0; i < ms.size(); i++)
      if (ms[i].dst == l.host && ms[i].rail == l.rail && out.bw[i] != Status::pass) {
        const char* what = ms[i].error.empty() ? "slow" : "failed";
        out.bw[i] = out.lat[i] = Status::pass;
        out.explained[i] = true;
        out.note[i] = l.router.empty()
                          ? fmt::format("{}, probably through {}'s NIC or link to its leaf", what, name(l.host))
                          : fmt::format("{}, probably down the link from {}'s leaf to {}", what, name(l.host), l.router);
      }
  return out;
}

}  // namespace

// Where degraded links carry many of a rail's measurements (on a small
// fabric, two links of four hosts' carry half), the rail's median is one of
// theirs and hides the milder link. So the median is taken again without
// the measurements the links found so far explain, until no new link is
// found: what a rail carries is what its healthy paths carry.
Judged judge_backend(const std::vector<Measurement>& ms, const Thresholds& t,
                     const std::vector<std::string>& names) {
  std::vector<bool> excluded(ms.size(), false);
  Judged out = judge_round(ms, t, names, excluded);
  for (int round = 0; round < 4; round++) {
    bool more = false;  // newly explained measurements leave the median
    for (size_t i = 0; i < ms.size(); i++)
      if (out.explained[i] && !excluded[i]) excluded[i] = more = true;
    if (!more) break;
    Judged next = judge_round(ms, t, names, excluded);
    if (next.links.size() < out.links.size()) break;  // (a link found against a lower median stays)
    out = std::move(next);
  }
  return out;
}

namespace {

std::string str(const json& j, const char* k) {
  if (!j.is_object() || !j.contains(k)) return "";
  auto& v = j[k];
  return v.is_string() ? v.get<std::string>() : v.is_null() ? "" : v.dump();
}

std::string bytes_text(double b) {
  if (b < 0) return "unlimited";
  if (b >= 1 << 30) return fmt::format("{:.1f} GiB", b / (1 << 30));
  if (b >= 1 << 20) return fmt::format("{:.1f} MiB", b / (1 << 20));
  return fmt::format("{:.0f} KiB", b / 1024);
}

// A fleet-wide "same everywhere" check: one leaf per host, those that
// differ from the majority get `differ`.
Node same_everywhere(const std::string& name, const std::vector<std::string>& vals,
                     const std::vector<std::string>& names, Status differ) {
  Node n{name};
  std::string maj = majority(vals);
  std::set<std::string> distinct(vals.begin(), vals.end());
  n.detail = distinct.size() <= 1 ? (maj.empty() ? "(none)" : maj) + " on every host"
                                  : fmt::format("{} values; most hosts: {}", distinct.size(), maj);
  for (size_t i = 0; i < vals.size(); i++) {
    Node h{names[i], vals[i] == maj ? Status::pass : differ, vals[i].empty() ? "(none)" : vals[i],
           names[i]};
    if (vals[i] != maj) h.detail += " (most hosts: " + (maj.empty() ? "(none)" : maj) + ")";
    n.add(std::move(h));
  }
  return n;
}

// Link error counters (any rise fails) and retransmit/sequence counters.
bool is_link_error(const std::string& c) {
  static const std::set<std::string> k{"symbol_error",
                                       "link_downed",
                                       "link_error_recovery",
                                       "port_rcv_errors",
                                       "local_link_integrity_errors",
                                       "excessive_buffer_overrun_errors",
                                       "port_rcv_remote_physical_errors",
                                       "port_xmit_discards"};
  return k.count(c) > 0;
}
bool is_retransmit(const std::string& c) {
  static const std::set<std::string> k{
      "completer_retry_err", "retry_exceeded_err", "rcvd_seq_err",          "out_of_sequence",
      "packet_seq_err",      "duplicate_request",  "local_ack_timeout_err", "rnr_nak_retry_err",
      "roce_slow_restart",   "implied_nak_seq_err"};
  return k.count(c) > 0;
}

}  // namespace

Node evaluate(const std::vector<json>& facts, const std::vector<std::string>& names,
              const std::vector<json>& after, const std::vector<Measurement>& ms,
              const Thresholds& t, const Mesh* mesh) {
  size_t n = facts.size();
  Node root{"fleet"};
  // ---------------------------------------------------------------- software
  Node& sw = root.add({"Software"});
  auto column = [&](auto get) {
    std::vector<std::string> v;
    for (auto& f : facts) v.push_back(get(f));
    return v;
  };
  sw.add(same_everywhere("kernel", column([](const json& f) { return str(f, "kernel"); }), names,
                         Status::warn));
  sw.add(same_everywhere("RDMA provider modules", column([](const json& f) {
                           std::string s;
                           for (auto& m : f.value("provider_modules", json::array()))
                             s += (s.empty() ? "" : " ") + m.get<std::string>();
                           return s;
                         }),
                         names, Status::warn));
  sw.add(same_everywhere("rdma-core", column([](const json& f) { return str(f, "rdma_core"); }),
                         names, Status::warn));
  {
    auto v = column([](const json& f) {
      auto m = f.value("mptcp", -1);
      return std::string(m < 0 ? "absent" : m ? "enabled" : "disabled");
    });
    Node& mp = sw.add(same_everywhere("MPTCP", v, names, Status::warn));
    for (size_t i = 0; i < n; i++)
      if (v[i] != "enabled")
        mp.children[i].status = Status::warn,
        mp.children[i].detail += ": shunt's socket rails need net.mptcp.enabled=1";
  }
  sw.add(same_everywhere("system clock", column([](const json& f) {
                           auto c = f.value("clock", json::object());
                           if (c.empty()) return std::string("unknown");
                           return std::string(c.value("synchronized", false)
                                                  ? "synchronized (NTP or PTP)"
                                                  : "not synchronized by NTP or PTP");
                         }),
                         names, Status::warn));
  {
    Node& ml = sw.add({"memlock limit"});
    for (size_t i = 0; i < n; i++) {
      auto m = facts[i].value("memlock", json::object());
      double soft = m.value("soft", -1.0);
      bool cap = m.value("cap_ipc_lock", false);
      Node h{names[i], Status::pass, bytes_text(soft), names[i]};
      if (soft >= 0 && soft < t.memlock_floor) {
        if (cap)
          h.detail += " (not binding: CAP_IPC_LOCK)";
        else
          h.status = Status::warn,
          h.detail +=
              fmt::format(" (below {}: RDMA registration will fail)", bytes_text(t.memlock_floor));
      }
      ml.add(std::move(h));
    }
  }
  {
    Node& nc = sw.add({"NCCL"});
    for (size_t i = 0; i < n; i++) {
      auto m = facts[i].value("nccl", json::object());
      bool shunt = facts[i].value("shunt_preloaded", false);
      Node h{names[i], Status::pass, "", names[i]};
      if (m.value("path", "").empty()) {
        h.detail = "not installed";
        if (t.expect_nccl) h.status = Status::fail;
      } else {
        h.detail = m.value("path", "") +
                   (m.value("version", "").empty() ? "" : " (" + m.value("version", "") + ")");
        if (shunt)
          h.detail += "; libshunt.so is preloaded: shunt reaches it";
        else
          h.status = Status::warn,
          h.detail += "; libshunt.so is not in LD_PRELOAD: shunt will not reach it";
      }
      nc.add(std::move(h));
    }
    std::vector<std::string> v;
    for (auto& c : nc.children) v.push_back(c.detail);
    nc.detail = majority(v);
  }
  // ---------------------------------------------------------------- node
  Node& node = root.add({"Node"});
  Judged j = judge_backend(ms, t, names);
  // Hosts and rails whose traffic crossed a link found degraded: their
  // retransmits are that link's.
  std::map<std::pair<int, int>, std::string> crossed;
  for (size_t i = 0; i < ms.size(); i++)
    if (!j.note[i].empty())
      crossed[{ms[i].src, ms[i].rail}] = crossed[{ms[i].dst, ms[i].rail}] = j.note[i];
  const bool probed = mesh && mesh->ran;
  MeshJudged mj;
  if (probed) {
    mj = judge_mesh(*mesh, t, names);
    for (size_t i = 0; i < mesh->paths.size(); i++)
      if (!mj.note[i].empty()) {
        auto& p = mesh->paths[i];
        for (auto k : {std::make_pair(p.src, p.rail), std::make_pair(p.dst, p.rail)})
          if (!crossed.count(k)) crossed[k] = mj.note[i];
      }
  }
  // Fleet values of every port attribute that must agree, over ACTIVE ports.
  std::map<std::string, std::vector<std::string>> fleet;
  auto ports_of = [](const json& f) {
    std::vector<std::pair<std::string, json>> out;
    for (auto& d : f.value("devices", json::array()))
      for (auto& p : d.value("ports", json::array())) out.emplace_back(d.value("name", "?"), p);
    return out;
  };
  std::vector<std::string> ndev;
  for (auto& f : facts) {
    ndev.push_back(std::to_string(f.value("devices", json::array()).size()));
    for (auto& [d, p] : ports_of(f))
      if (p.value("state", "") == "ACTIVE")
        for (auto* k : {"speed", "width", "mtu", "netdev_mtu"}) fleet[k].push_back(str(p, k));
  }
  std::string want_ndev = majority(ndev);
  std::map<std::string, std::vector<double>>
      rises;  // retransmit counter rises over the fleet, per counter
  auto rise = [&](size_t i, const std::string& key, const std::string& c,
                  double before) -> std::optional<double> {
    if (i >= after.size() || !after[i].contains(key) || !after[i][key].contains(c))
      return std::nullopt;
    return after[i][key][c].get<double>() - before;
  };
  for (size_t i = 0; i < n; i++)
    for (auto& [d, p] : ports_of(facts[i])) {
      json cs = p.value("counters", json::object());
      for (auto& [c, v] : cs.items())
        if (is_retransmit(c))
          if (auto r = rise(i, d + "/" + str(p, "port"), c, v.get<double>()))
            rises[c].push_back(*r);
    }
  for (size_t i = 0; i < n; i++) {
    Node& h = node.add({names[i], Status::pass, "", names[i]});
    auto devs = facts[i].value("devices", json::array());
    Node& cnt = h.add({"RDMA devices", Status::pass, std::to_string(devs.size()), names[i]});
    if (devs.empty())
      cnt.status = Status::fail, cnt.detail = "none";
    else if (std::to_string(devs.size()) != want_ndev)
      cnt.status = Status::warn, cnt.detail += " (most hosts: " + want_ndev + ")";
    int rail = -1;
    std::string last_dev;
    for (auto& [d, p] : ports_of(facts[i])) {
      if (d != last_dev) rail++, last_dev = d;
      std::string where = names[i] + "/" + d + "/" + str(p, "port");
      Node& pn = h.add({d + " port " + str(p, "port"), Status::pass, "", where});
      std::string state = p.value("state", "?");
      pn.add({"state", state == "ACTIVE" ? Status::pass : Status::fail,
              state + (state == "ACTIVE" ? "" : " (want ACTIVE)"), where});
      if (state != "ACTIVE") continue;  // nothing else about a port that is down is meaningful
      for (auto* k : {"speed", "width", "mtu", "netdev_mtu"}) {
        std::string v = str(p, k), m = majority(fleet[k]);
        std::string label =
            std::string(k) == "netdev_mtu" ? "netdev " + p.value("netdev", "?") + " MTU" : k;
        Node c{label, v == m ? Status::pass : Status::warn, v, where};
        if (v != m) c.detail += " (fleet: " + m + ")";
        pn.add(std::move(c));
      }
      std::string ip = p.value("ipv4", "");
      pn.add({"IPv4 RoCEv2 GID", ip.empty() ? Status::fail : Status::pass,
              ip.empty() ? "none (RoCE cannot be routed to this port)"
                         : fmt::format("index {} ({})", p.value("gid_index", -1), ip),
              where});
      Node errs{"error counters", Status::pass, "not rising", where};
      std::string risen;
      json cs = p.value("counters", json::object());
      for (auto& [c, v] : cs.items()) {
        auto r = rise(i, d + "/" + str(p, "port"), c, v.get<double>());
        if (!r || *r <= 0) continue;
        if (is_link_error(c)) {
          errs.status = Status::fail;
          risen += fmt::format("{}{} +{:.0f}", risen.empty() ? "" : ", ", c, *r);
        } else if (is_retransmit(c)) {
          double med = median(rises[c]);
          if (*r > t.retrans_warn && *r > t.retrans_mult * med) {
            auto x = crossed.find({static_cast<int>(i), rail});
            if (x == crossed.end()) errs.status = worst(errs.status, Status::warn);
            risen +=
                fmt::format("{}{} +{:.0f} (fleet median +{:.0f}{})", risen.empty() ? "" : ", ", c,
                            *r, med, x == crossed.end() ? "" : "; its traffic was " + x->second);
          }
        }
      }
      if (!risen.empty()) errs.detail = "rose during the audit: " + risen;
      pn.add(std::move(errs));
    }
  }
  // ---------------------------------------------------------------- front-end
  Node& fe = root.add({"Front-end network"});
  for (size_t i = 0; i < n; i++) {
    auto r = facts[i].value("reach", json::array());
    Node h{names[i], Status::pass, "", names[i]};
    std::string bad;
    for (size_t k = 0; r.is_array() && k < r.size() && k < n; k++)
      if (!r[k].is_boolean() || !r[k].get<bool>()) bad += (bad.empty() ? "" : ", ") + names[k];
    if (r.is_null())
      h.status = Status::fail, h.detail = "did not answer the reachability check";
    else if (r.empty())
      h.detail = "not checked";
    else if (bad.empty())
      h.detail = fmt::format("reaches every host's audit port ({})", r.size());
    else
      h.status = Status::fail, h.detail = "cannot reach " + bad;
    fe.add(std::move(h));
  }
  // ---------------------------------------------------------------- back-end
  Node& be = root.add({"Back-end network"});
  std::set<int> rails;
  for (auto& m : ms) rails.insert(m.rail);
  for (int r : rails) {
    std::vector<double> bw, lat;
    for (auto& m : ms)
      if (m.rail == r && m.error.empty() && m.skipped.empty())
        bw.push_back(m.mbps), lat.push_back(m.lat_us);
    std::string without;
    if (j.bw_median.count(r) && j.bw_median.at(r) != median(bw))
      without = fmt::format(" ({:.1f} MB/s without the degraded links' measurements)", j.bw_median.at(r));
    Node& rn = be.add({fmt::format("rail {}", r), Status::pass,
                       fmt::format("median {:.1f} MB/s, {:.0f} us over {} measurements{}", median(bw),
                                   median(lat), bw.size(), without)});
    rn.add({"host links", Status::pass, "none found degraded"});
    rn.add({"leaf-spine links", Status::pass, "none found degraded"});
    Node &hl = rn.children[0], &links = rn.children[1];  // (references after both adds: the vector grows)
    for (auto& l : j.links) {
      if (l.rail != r) continue;
      std::string speed = fmt::format("{:.1f} MB/s, rail median {:.1f}", l.mbps, l.fleet_mbps);
      if (l.router.empty()) {
        // the rail's device on that host: its devices in name order, as the rails are
        auto devs = facts[l.host].value("devices", json::array());
        std::string dev = r < static_cast<int>(devs.size()) ? devs[r].value("name", "?") : "?";
        hl.detail = "";
        hl.add({fmt::format("{}'s {} <-> its leaf", names[l.host], dev), l.status,
                "slow on every path from it: " + speed, fmt::format("{}/{}", names[l.host], dev)});
      } else {
        links.detail = "";
        links.add({fmt::format("{}'s leaf <-> {}", names[l.host], l.router), l.status, "slow through it: " + speed,
                   fmt::format("rail {} {}-leaf uplink {}", r, names[l.host], l.router)});
      }
    }
    Node& pairs = rn.add({"pairs"});
    for (size_t i = 0; i < ms.size(); i++) {
      auto& m = ms[i];
      if (m.rail != r) continue;
      std::string label =
          names[m.src] + " -> " + names[m.dst] + (m.router.empty() ? "" : " via " + m.router);
      std::string where = fmt::format("rail {} {}->{}{}", r, names[m.src], names[m.dst],
                                      m.router.empty() ? "" : " via " + m.router);
      Node p{label, worst(j.bw[i], j.lat[i]), "", where};
      if (!m.skipped.empty())
        p.detail = "not measured: " + m.skipped;
      else if (!m.error.empty())
        p.detail = "RC connection failed: " + m.error;
      else {
        p.detail = fmt::format("{:.1f} MB/s, {:.0f} us", m.mbps, m.lat_us);
        if (j.bw[i] != Status::pass)
          p.detail += fmt::format(" (bandwidth {})", status_name(j.bw[i]));
        if (j.lat[i] != Status::pass)
          p.detail += fmt::format(" (latency {})", status_name(j.lat[i]));
        if (!j.note[i].empty()) p.detail += " (" + j.note[i] + ")";
      }
      pairs.add(std::move(p));
    }
  }
  if (probed)
    add_mesh_nodes(be, *mesh, mj, names, facts);
  else if (mesh && !mesh->error.empty())
    be.add({"probe mesh", Status::warn, "did not run: " + mesh->error});
  if (rails.empty() && !probed) be.detail = "no measurement";
  root.roll_up();
  size_t fails = 0, warns = 0;
  std::function<void(const Node&)> count = [&](const Node& x) {
    if (x.children.empty()) fails += x.status == Status::fail, warns += x.status == Status::warn;
    for (auto& c : x.children) count(c);
  };
  count(root);
  root.detail = fmt::format("{} hosts, {} failed and {} warned checks", n, fails, warns);
  return root;
}

}  // namespace audit
