#include "tools/shunt-audit/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>

using nlohmann::json;

namespace audit {

json matrices(const std::vector<Measurement>& ms, const Judged& j,
              const std::vector<std::string>& names, bool by_spine) {
  // By spine: the routers path discovery found from each host's leaf, in
  // address order; the k-th of every leaf is taken for the same spine (the
  // spine ends of the uplinks numbered in the spines' order).
  std::map<std::pair<int, int>, std::vector<std::string>> routers;  // (src, rail)
  for (auto& m : ms)
    if (!m.router.empty()) {
      auto& v = routers[{m.src, m.rail}];
      if (std::find(v.begin(), v.end(), m.router) == v.end()) v.push_back(m.router);
    }
  for (auto& [k, v] : routers) std::sort(v.begin(), v.end());
  auto spine_of = [&](const Measurement& m) {
    auto& v = routers[{m.src, m.rail}];
    return static_cast<int>(std::find(v.begin(), v.end(), m.router) - v.begin());
  };
  std::set<std::pair<int, int>> planes;  // (rail, spine); spine -1 per rail
  for (auto& m : ms)
    if (!by_spine || !m.router.empty()) planes.insert({m.rail, by_spine ? spine_of(m) : -1});
  json out = json::array();
  size_t n = names.size();
  for (auto& [r, spine] : planes) {
    json cells = json::array();
    for (size_t a = 0; a < n; a++) {
      json row = json::array();
      for (size_t b = 0; b < n; b++) {
        json c = nullptr;
        for (size_t i = 0; i < ms.size(); i++) {
          auto& m = ms[i];
          if (m.rail != r || size_t(m.src) != a || size_t(m.dst) != b) continue;
          if (by_spine && (m.router.empty() || spine_of(m) != spine)) continue;
          if (c.is_null()) c = {{"status", "pass"}, {"paths", json::array()}};
          Status s = worst(j.bw[i], j.lat[i]);
          json p{{"router", m.router}, {"sport", m.sport}, {"status", status_name(s)}};
          if (!m.skipped.empty())
            p["skipped"] = m.skipped;
          else if (!m.error.empty())
            p["error"] = m.error;
          else {
            p["mbps"] = m.mbps, p["lat_us"] = m.lat_us;
            if (!c.contains("mbps") || m.mbps > c["mbps"].get<double>()) c["mbps"] = m.mbps;
            if (!c.contains("lat_us") || m.lat_us < c["lat_us"].get<double>())
              c["lat_us"] = m.lat_us;
          }
          if (!j.note[i].empty()) p["note"] = j.note[i], c["explained"] = true;
          if (!m.skipped.empty() && c["paths"].empty()) c["skipped"] = true;
          if (s > Status::pass) c["outlier"] = true;
          std::string was = c["status"];
          if (s > (was == "fail" ? Status::fail : was == "warn" ? Status::warn : Status::pass))
            c["status"] = status_name(s);
          c["paths"].push_back(p);
        }
        row.push_back(c);
      }
      cells.push_back(row);
    }
    json x{{"rail", r}, {"hosts", names}, {"cells", cells}};
    if (by_spine) {
      json via = json::object();  // each sending host's router for this spine
      for (auto& [k, v] : routers)
        if (k.second == r && spine < static_cast<int>(v.size())) via[names[k.first]] = v[spine];
      x["spine"] = spine, x["routers"] = via;
    }
    out.push_back(x);
  }
  return out;
}

namespace {
const char* tag(Status s, bool colour) {
  if (!colour) return s == Status::pass ? "PASS" : s == Status::warn ? "WARN" : "FAIL";
  return s == Status::pass   ? "\033[32mPASS\033[0m"
         : s == Status::warn ? "\033[33mWARN\033[0m"
                             : "\033[31mFAIL\033[0m";
}
void print_node(std::ostream& o, const Node& x, int depth, bool verbose, bool colour) {
  o << std::string(2 * depth, ' ') << tag(x.status, colour) << " " << x.name;
  if (!x.detail.empty()) o << ": " << x.detail;
  o << "\n";
  if (depth >= 2 && x.status == Status::pass && !verbose) return;
  for (auto& c : x.children) print_node(o, c, depth + 1, verbose, colour);
}
}  // namespace

void print_tree(std::ostream& o, const Node& root, bool verbose, bool colour) {
  print_node(o, root, 0, verbose, colour);
}

std::string verdict_line(const Node& root) {
  const char* v = root.status == Status::pass   ? "PASS"
                  : root.status == Status::warn ? "WARN"
                                                : "FAIL";
  return fmt::format("verdict: {} ({})", v, root.detail);
}

namespace {

// The probe mesh's part of the report; a link the probes found lossy joins
// its entry in `links` where the measurements found it slow too.
json probes_json(const Mesh& mesh, const MeshJudged& mj, const std::vector<std::string>& names,
                 json* links) {
  for (auto& l : mj.links) {
    json* same = nullptr;
    for (auto& x : *links)
      if (x["rail"] == l.rail && x["host"] == names[l.host] && x["router"] == l.router) same = &x;
    if (!same) {
      links->push_back({{"rail", l.rail}, {"host", names[l.host]}, {"router", l.router}, {"status", "pass"}});
      same = &links->back();
    }
    const std::string was = (*same)["status"];
    (*same)["status"] = status_name(worst(l.status, was == "fail"   ? Status::fail
                                                    : was == "warn" ? Status::warn
                                                                    : Status::pass));
    (*same)["loss"] = l.loss;
    (*same)["loss_inbound"] = l.inbound;
  }
  json paths = json::array(), clocks = json::array();
  for (size_t i = 0; i < mesh.paths.size(); i++) {
    auto& p = mesh.paths[i];
    json x{{"rail", p.rail},      {"src", names[p.src]},
           {"dst", names[p.dst]}, {"router", p.router},
           {"sport", p.sport},    {"heard", p.heard},
           {"loss", p.loss},      {"status", status_name(worst(mj.loss[i], mj.owd[i]))}};
    if (p.owd_us >= 0) x["owd_us"] = p.owd_us;
    if (!mj.note[i].empty()) x["note"] = mj.note[i];
    paths.push_back(x);
  }
  for (size_t h = 0; h < mesh.clocks.size() && h < names.size(); h++) {
    auto& c = mesh.clocks[h];
    json x{{"host", names[h]}, {"valid", c.valid}, {"status", status_name(mj.clock[h])}};
    if (c.valid) x["offset_ms"] = c.offset_ms, x["bound_us"] = c.bound_us;
    clocks.push_back(x);
  }
  return {{"seconds", mesh.seconds}, {"paths", paths}, {"clocks", clocks}};
}

}  // namespace

json report_json(const Node& root, const std::vector<std::string>& names,
                 const std::vector<std::string>& addrs, const std::vector<json>& facts,
                 const std::vector<Measurement>& ms, const Judged& j, double elapsed_s,
                 const Mesh* mesh, const Thresholds& t) {
  json hosts = json::array();
  for (size_t i = 0; i < names.size(); i++)
    hosts.push_back({{"name", names[i]}, {"addr", addrs[i]}, {"rank", i}, {"facts", facts[i]}});
  json meas = json::array();
  for (size_t i = 0; i < ms.size(); i++) {
    auto& m = ms[i];
    json x{{"rail", m.rail},      {"src", names[m.src]},
           {"dst", names[m.dst]}, {"router", m.router},
           {"sport", m.sport},    {"status", status_name(worst(j.bw[i], j.lat[i]))}};
    if (!m.skipped.empty())
      x["skipped"] = m.skipped;
    else if (!m.error.empty())
      x["error"] = m.error;
    else
      x["mbps"] = m.mbps, x["lat_us"] = m.lat_us;
    if (!j.note[i].empty()) x["note"] = j.note[i];
    meas.push_back(x);
  }
  json links = json::array();
  for (auto& l : j.links)
    links.push_back({{"rail", l.rail},
                     {"host", names[l.host]},
                     {"router", l.router},
                     {"status", status_name(l.status)},
                     {"mbps", l.mbps},
                     {"rail_median_mbps", l.fleet_mbps}});
  json probes = nullptr;
  if (mesh && mesh->ran)
    probes = probes_json(*mesh, judge_mesh(*mesh, t, names), names, &links);
  else if (mesh && !mesh->error.empty())
    probes = {{"error", mesh->error}};
  return {{"schema", "shunt-audit/1"},
          {"verdict", status_name(root.status)},
          {"exit", exit_code(root.status)},
          {"summary", root.detail},
          {"elapsed_s", elapsed_s},
          {"hosts", hosts},
          {"tree", to_json(root)},
          {"matrices", matrices(ms, j, names)},
          {"spine_matrices", matrices(ms, j, names, true)},
          {"measurements", meas},
          {"links", links},
          {"probes", probes}};
}

namespace {

std::string esc(const std::string& s) {
  std::string o;
  for (char c : s) switch (c) {
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '&':
        o += "&amp;";
        break;
      case '"':
        o += "&quot;";
        break;
      case '\'':
        o += "&#39;";
        break;
      default:
        o += c;
    }
  return o;
}

void html_node(std::string& h, const json& n, int depth) {
  std::string st = n.value("status", "pass");
  bool kids = n.contains("children");
  h += fmt::format("<li class=\"{}\">", st);
  std::string line =
      fmt::format("<span class=\"tag {0}\">{0}</span> <b>{1}</b>{2}", st, esc(n.value("name", "")),
                  n.contains("detail") ? ": " + esc(n.value("detail", "")) : "");
  if (kids) {
    h += fmt::format("<details{}><summary>{}</summary><ul>",
                     st != "pass" || depth < 1 ? " open" : "", line);
    for (auto& c : n["children"]) html_node(h, c, depth + 1);
    h += "</ul></details>";
  } else {
    h += line;
  }
  h += "</li>\n";
}

void html_matrix(std::string& h, const json& m, const std::string& title, const char* cls_table) {
  auto hosts = m["hosts"];
  h += fmt::format("<h3>{}</h3>\n<table class=\"{}\" data-rail=\"{}\"><tr><th>from \\ to</th>",
                   esc(title), cls_table, m["rail"].get<int>());
  for (auto& n : hosts) h += "<th>" + esc(n.get<std::string>()) + "</th>";
  h += "</tr>\n";
  for (size_t a = 0; a < hosts.size(); a++) {
    h += "<tr><th>" + esc(hosts[a].get<std::string>()) + "</th>";
    for (size_t b = 0; b < hosts.size(); b++) {
      auto& c = m["cells"][a][b];
      if (a == b || c.is_null()) {
        h += std::string("<td class=\"") + (a == b ? "self" : "skipped") + "\">&ndash;</td>";
        continue;
      }
      std::string tip;
      for (auto& p : c["paths"]) {
        tip += fmt::format("port {} via {}: ", p.value("sport", 0),
                           p.value("router", "").empty() ? "?" : p.value("router", ""));
        if (p.contains("mbps"))
          tip += fmt::format("{:.1f} MB/s {:.0f} us", p["mbps"].get<double>(),
                             p["lat_us"].get<double>());
        else
          tip += p.value("error", p.value("skipped", ""));
        if (p.contains("note")) tip += " (" + p["note"].get<std::string>() + ")";
        tip += "\n";
      }
      std::string cls = c.value("skipped", false) ? "skipped" : c.value("status", "pass");
      if (c.value("outlier", false)) cls += " outlier";
      std::string text = c.contains("mbps")
                             ? fmt::format("{:.1f} MB/s<br>{:.0f} us", c["mbps"].get<double>(),
                                           c["lat_us"].get<double>())
                         : c.value("skipped", false) ? "skipped"
                                                     : "error";
      h += fmt::format("<td class=\"{}\" title=\"{}\">{}</td>", cls, esc(tip), text);
    }
    h += "</tr>\n";
  }
  h += "</table>\n";
}

// Per rail, the probe mesh's loss and one-way delay between every pair:
// the worst of the pair's probed paths (the probe port's and one per spine).
void html_probes(std::string& h, const json& probes, const json& r) {
  std::vector<std::string> hosts;
  for (auto& x : r.value("hosts", json::array())) hosts.push_back(x.value("name", ""));
  std::set<int> rails;
  for (auto& p : probes["paths"]) rails.insert(p.value("rail", 0));
  h += fmt::format(
      "<h2>Probe mesh</h2>\n<p>Rows send, columns receive: the share of probes lost "
      "over {:.0f} s (the worst of the pair's paths) and the one-way delay; each path in "
      "the cell's tooltip.</p>\n",
      probes.value("seconds", 0.0));
  for (int rail : rails) {
    h += fmt::format(
        "<h3>rail {}</h3>\n<table class=\"matrix probes\" data-rail=\"{}\"><tr><th>from \\ to</th>",
        rail, rail);
    for (auto& n : hosts) h += "<th>" + esc(n) + "</th>";
    h += "</tr>\n";
    for (auto& a : hosts) {
      h += "<tr><th>" + esc(a) + "</th>";
      for (auto& b : hosts) {
        if (a == b) {
          h += "<td class=\"self\">&ndash;</td>";
          continue;
        }
        double loss = -1, owd = -1;
        std::string st = "pass", tip;
        for (auto& p : probes["paths"]) {
          if (p.value("rail", -1) != rail || p.value("src", "") != a || p.value("dst", "") != b)
            continue;
          loss = std::max(loss, p.value("loss", 0.0));
          if (p.contains("owd_us")) owd = std::max(owd, p["owd_us"].get<double>());
          std::string s = p.value("status", "pass");
          if (s == "fail" || (s == "warn" && st == "pass")) st = s;
          tip += fmt::format(
              "{}: loss {:.1f}%{}{}\n",
              p.value("sport", 0)
                  ? fmt::format("port {} via {}", p.value("sport", 0), p.value("router", ""))
                  : std::string("probe port"),
              100 * p.value("loss", 0.0),
              p.contains("owd_us") ? fmt::format(", {:.0f} us", p["owd_us"].get<double>()) : "",
              p.contains("note") ? " (" + p["note"].get<std::string>() + ")" : "");
        }
        if (loss < 0) {
          h += "<td class=\"skipped\">&ndash;</td>";
          continue;
        }
        h += fmt::format("<td class=\"{}{}\" title=\"{}\">{:.1f}%<br>{}</td>", st,
                         st == "pass" ? "" : " outlier", esc(tip), 100 * loss,
                         owd < 0 ? std::string("?") : fmt::format("{:.0f} us", owd));
      }
      h += "</tr>\n";
    }
    h += "</table>\n";
  }
}

}  // namespace

std::string report_html(const json& r) {
  std::string h = R"(<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>shunt-audit report</title>
<style>
body{font-family:sans-serif;margin:1.5em;color:#222}
ul{list-style:none;padding-left:1.2em}
.tag{display:inline-block;width:3.2em;text-align:center;border-radius:3px;font-size:80%;color:#fff}
.tag.pass{background:#2e7d32}.tag.warn{background:#ef8f00}.tag.fail{background:#c62828}
#verdict{font-size:130%;padding:.5em;border-radius:4px}
#verdict.pass{background:#e8f5e9}#verdict.warn{background:#fff3e0}#verdict.fail{background:#ffebee}
table.matrix{border-collapse:collapse;margin:.5em 0 1.5em}
table.matrix td,table.matrix th{border:1px solid #bbb;padding:.3em .5em;text-align:right;font-size:90%}
td.pass{background:#c8e6c9}td.warn{background:#ffe0b2}td.fail{background:#ffcdd2}td.self{background:#eee}td.skipped{background:#f5f5f5;color:#777}
td.outlier{font-weight:bold;outline:2px solid #333}
</style></head><body>
<h1>shunt-audit</h1>
)";
  std::string v = r.value("verdict", "fail");
  h += fmt::format("<p id=\"verdict\" class=\"{}\">verdict: <b>{}</b> &mdash; {} ({:.0f} s)</p>\n",
                   v, v, esc(r.value("summary", "")), r.value("elapsed_s", 0.0));
  h += "<h2>Checks</h2>\n<ul id=\"tree\">";
  html_node(h, r["tree"], 0);
  h += "</ul>\n<h2>Back-end, all pairs</h2>\n<p>Rows send, columns receive: best path's MB/s and "
       "latency "
       "(us); each path (source port, the router path discovery named) in the cell's tooltip. Bold "
       "outline: "
       "an outlier against the rail's median.</p>\n";
  for (auto& m : r.value("matrices", json::array()))
    html_matrix(h, m, fmt::format("rail {}", m["rail"].get<int>()), "matrix");
  if (!r.value("spine_matrices", json::array()).empty()) {
    h += "<h2>Back-end, per spine</h2>\n<p>The same, of the paths through one spine: the k-th "
         "router (by address) path discovery found from the sending host's leaf.</p>\n";
    for (auto& m : r["spine_matrices"])
      html_matrix(h, m, fmt::format("rail {}, spine {}", m["rail"].get<int>(), m.value("spine", 0)),
                  "matrix spine");
  }
  if (r.contains("probes") && r["probes"].is_object() && r["probes"].contains("paths"))
    html_probes(h, r["probes"], r);
  h += "</body></html>\n";
  return h;
}

}  // namespace audit
