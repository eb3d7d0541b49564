#include "tools/shunt-audit/mesh.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>

using nlohmann::json;

namespace audit {

namespace {

Status judge_loss(double loss, const Thresholds& t) {
  if (loss >= t.loss_fail) return Status::fail;
  if (loss >= t.loss_warn) return Status::warn;
  return Status::pass;
}

std::string name_of(const std::vector<std::string>& names, int h) {
  return h < static_cast<int>(names.size()) ? names[h] : fmt::format("host {}", h);
}

void excuse(const std::vector<size_t>& idx, const std::string& why, MeshJudged* out) {
  for (size_t i : idx)
    if (out->note[i].empty() && out->loss[i] != Status::pass)
      out->loss[i] = out->owd[i] = Status::pass, out->note[i] = why;
}

std::string pct(double f) {
  return fmt::format("{:.1f}%", 100 * f);
}

// Lossy paths grouped by their sender and rail, then by router
// (find_links): where the sender loses on every router its NIC or its link
// to the leaf is named; otherwise each router it loses through names the
// link between its leaf and that router (the router is that link's spine
// end).
void by_sender(const Mesh& m, const Thresholds& t, const std::vector<std::string>& names,
               MeshJudged* out) {
  std::vector<PathValue> pv;
  for (auto& p : m.paths) pv.push_back({p.src, p.rail, p.router, p.heard ? p.loss : 1.0});
  for (auto& f : find_links(pv, false, [&](double loss, int) { return judge_loss(loss, t); })) {
    LinkFault l{f.host, f.rail, f.router, f.status};
    l.loss = f.value;
    out->links.push_back(l);
    excuse(f.idx,
           f.router.empty()
               ? fmt::format("lossy from {} on every path: its NIC or its link to the leaf",
                             name_of(names, f.host))
               : fmt::format("lossy through the link between {}'s leaf and {}",
                             name_of(names, f.host), f.router),
           out);
  }
}

// A host that others lose probes to on (nearly) every path of a rail,
// while it loses none of its own: its NIC or its link to the leaf, inbound.
// (A spine's link down to one leaf alone cannot be told from here: each
// sender names a different address of that spine.)
void by_receiver(const Mesh& m, const Thresholds& t, const std::vector<std::string>& names,
                 MeshJudged* out) {
  const auto& ps = m.paths;
  std::map<std::pair<int, int>, std::vector<size_t>> groups;
  for (size_t i = 0; i < ps.size(); i++) groups[{ps[i].dst, ps[i].rail}].push_back(i);
  for (auto& [k, idx] : groups) {
    auto [host, rail] = k;
    std::vector<double> lossy;
    for (size_t i : idx)
      if (out->loss[i] != Status::pass && out->note[i].empty())
        lossy.push_back(ps[i].heard ? ps[i].loss : 1.0);
    if (idx.size() < 2 || lossy.size() * 5 < idx.size() * 4) continue;
    double loss = median(lossy);
    LinkFault l{host, rail, "", judge_loss(loss, t)};
    l.loss = loss;
    l.inbound = true;
    out->links.push_back(l);
    excuse(idx,
           fmt::format("lossy to {} on every path: its NIC or its link to the leaf",
                       name_of(names, host)),
           out);
  }
}

}  // namespace

MeshJudged judge_mesh(const Mesh& m, const Thresholds& t, const std::vector<std::string>& names) {
  MeshJudged out;
  const auto& ps = m.paths;
  out.loss.assign(ps.size(), Status::pass);
  out.owd.assign(ps.size(), Status::pass);
  out.note.assign(ps.size(), "");
  std::map<int, std::vector<double>> owd_of_rail;
  for (auto& p : ps)
    if (p.heard && p.owd_us >= 0) owd_of_rail[p.rail].push_back(p.owd_us);
  for (size_t i = 0; i < ps.size(); i++) {
    auto& p = ps[i];
    out.loss[i] = p.heard ? judge_loss(p.loss, t) : Status::fail;
    if (p.heard && p.owd_us >= 0)
      out.owd[i] = judge_lower(p.owd_us, median(owd_of_rail[p.rail]), t.lat_warn_mult,
                               t.lat_fail_mult, t.lat_slack_us);
  }
  // A link found from its host's side carries traffic down to that host as
  // well (netem, a bad optic: usually both ways), so lossy paths towards
  // it on that rail are its; and a path from the probe port, whose spine
  // is not known, is that of a link named at either of its ends.
  auto towards = [&] {
    for (size_t i = 0; i < ps.size(); i++) {
      if (out.loss[i] == Status::pass || !out.note[i].empty()) continue;
      for (auto& l : out.links) {
        if (l.rail != ps[i].rail || (l.host != ps[i].src && l.host != ps[i].dst)) continue;
        if (l.host == ps[i].src && !l.router.empty() && !ps[i].router.empty() &&
            l.router != ps[i].router)
          continue;
        out.loss[i] = out.owd[i] = Status::pass;
        out.note[i] = l.router.empty()
                          ? fmt::format("lossy, probably through {}'s NIC or link to its leaf",
                                        name_of(names, l.host))
                          : fmt::format("lossy, probably through the link between {}'s leaf and {}",
                                        name_of(names, l.host), l.router);
        break;
      }
    }
  };
  by_sender(m, t, names, &out);
  towards();
  by_receiver(m, t, names, &out);
  towards();
  // Clocks: each host against the fleet's median offset.
  std::vector<double> offs;
  for (auto& c : m.clocks)
    if (c.valid) offs.push_back(c.offset_ms);
  double med = median(offs);
  for (size_t h = 0; h < m.clocks.size(); h++) {
    auto& c = m.clocks[h];
    if (!c.valid) {
      out.clock.push_back(Status::warn);
      out.clock_detail.push_back("no estimate: too few probes answered");
      continue;
    }
    double off = std::fabs(c.offset_ms - med);
    Status s = off > t.clock_fail_ms   ? Status::fail
               : off > t.clock_warn_ms ? Status::warn
                                       : Status::pass;
    std::string d =
        h == 0 ? fmt::format("the reference; fleet median {:+.3f} ms", med)
        : c.bound_us < 0
            ? fmt::format(
                  "{:+.3f} ms from the driver (rough: from the latest probes, "
                  "the clock model had too few clean pairs)",
                  c.offset_ms)
            : fmt::format("{:+.3f} ms from the driver, within {:.0f} us", c.offset_ms, c.bound_us);
    if (s != Status::pass)
      d += fmt::format(" ({:.1f} ms from the fleet's median: beyond {:g} ms)", off,
                       s == Status::fail ? t.clock_fail_ms : t.clock_warn_ms);
    if (h != 0 && c.bound_us > t.clock_bound_warn_us) {
      s = worst(s, Status::warn);
      d += fmt::format(" (bound beyond {:g} us: one-way delays to it are uncertain)",
                       t.clock_bound_warn_us);
    }
    out.clock.push_back(s);
    out.clock_detail.push_back(d);
  }
  return out;
}

namespace {

Node* child(Node& n, const std::string& name) {
  for (auto& c : n.children)
    if (c.name == name) return &c;
  return nullptr;
}

}  // namespace

void add_mesh_nodes(Node& be, const Mesh& m, const MeshJudged& j,
                    const std::vector<std::string>& names, const std::vector<json>& facts) {
  std::map<int, bool> rails;
  for (auto& p : m.paths) rails[p.rail] = true;
  for (auto& [r, _] : rails) {
    std::string rname = fmt::format("rail {}", r);
    Node* rn = child(be, rname);
    if (!rn) {
      rn = &be.add({rname});
      rn->add({"host links", Status::pass, "none found degraded"});
      rn->add({"leaf-spine links", Status::pass, "none found degraded"});
    }
    for (auto& l : j.links) {
      if (l.rail != r) continue;
      const char* way = l.inbound ? "to" : "from";
      std::string label, where;
      if (l.router.empty()) {
        auto devs = facts[l.host].value("devices", json::array());
        std::string dev = r < static_cast<int>(devs.size()) ? devs[r].value("name", "?") : "?";
        label = fmt::format("{}'s {} <-> its leaf", name_of(names, l.host), dev);
        where = fmt::format("{}/{}", name_of(names, l.host), dev);
      } else {
        label = fmt::format("{}'s leaf <-> {}", name_of(names, l.host), l.router);
        where = fmt::format("rail {} {}-leaf uplink {}", r, name_of(names, l.host), l.router);
      }
      std::string what =
          l.router.empty() ? fmt::format("loses {} of probes on every path {} it", pct(l.loss), way)
                           : fmt::format("loses {} of probes {} {} through it", pct(l.loss), way,
                                         name_of(names, l.host));
      Node& group = *child(*rn, l.router.empty() ? "host links" : "leaf-spine links");
      if (group.children.empty()) group.detail = "";
      if (Node* same = child(group, label)) {  // also found slow by the measurements
        same->status = worst(same->status, l.status);
        same->detail += "; " + what;
      } else {
        group.add({label, l.status, what, where});
      }
    }
    std::vector<double> loss;
    for (auto& p : m.paths)
      if (p.rail == r) loss.push_back(p.heard ? p.loss : 1.0);
    Node& pn = rn->add({"probed paths", Status::pass,
                        fmt::format("{} paths, median loss {} over {:.0f} s", loss.size(),
                                    pct(median(loss)), m.seconds)});
    for (size_t i = 0; i < m.paths.size(); i++) {
      auto& p = m.paths[i];
      if (p.rail != r) continue;
      std::string via =
          p.sport ? fmt::format(" via {} (port {})", p.router.empty() ? "?" : p.router, p.sport)
                  : " (probe port)";
      Node x{names[p.src] + " -> " + names[p.dst] + via, worst(j.loss[i], j.owd[i]), "",
             fmt::format("rail {} {}->{}{}", r, names[p.src], names[p.dst],
                         p.router.empty() ? "" : " via " + p.router)};
      if (!p.heard)
        x.detail = "no probe acknowledged";
      else
        x.detail = fmt::format("loss {}, one-way {}", pct(p.loss),
                               p.owd_us < 0 ? std::string("unknown (no clock estimate)")
                                            : fmt::format("{:.0f} us", p.owd_us));
      if (j.loss[i] != Status::pass) x.detail += fmt::format(" (loss {})", status_name(j.loss[i]));
      if (j.owd[i] != Status::pass) x.detail += fmt::format(" (delay {})", status_name(j.owd[i]));
      if (!j.note[i].empty()) x.detail += " (" + j.note[i] + ")";
      pn.add(std::move(x));
    }
  }
  std::vector<double> bounds;
  for (size_t h = 1; h < m.clocks.size(); h++)
    if (m.clocks[h].valid && m.clocks[h].bound_us >= 0) bounds.push_back(m.clocks[h].bound_us);
  Node& cn = be.add({"clocks", Status::pass,
                     bounds.empty() ? "no estimate"
                                    : fmt::format("shunt's probes bound each host's offset to the "
                                                  "driver within {:.0f} us (median)",
                                                  median(bounds))});
  for (size_t h = 0; h < m.clocks.size() && h < names.size(); h++)
    cn.add({names[h], j.clock[h], j.clock_detail[h], names[h]});
}

}  // namespace audit
