#include "tools/shunt-audit/report.h"

#include <fmt/format.h>

#include <map>
#include <set>

using nlohmann::json;

namespace audit {

json matrices(const std::vector<Measurement>& ms, const Judged& j,
              const std::vector<std::string>& names) {
  std::set<int> rails;
  for (auto& m : ms) rails.insert(m.rail);
  json out = json::array();
  size_t n = names.size();
  for (int r : rails) {
    json cells = json::array();
    for (size_t a = 0; a < n; a++) {
      json row = json::array();
      for (size_t b = 0; b < n; b++) {
        json c = nullptr;
        for (size_t i = 0; i < ms.size(); i++) {
          auto& m = ms[i];
          if (m.rail != r || size_t(m.src) != a || size_t(m.dst) != b) continue;
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
    out.push_back({{"rail", r}, {"hosts", names}, {"cells", cells}});
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

json report_json(const Node& root, const std::vector<std::string>& names,
                 const std::vector<std::string>& addrs, const std::vector<json>& facts,
                 const std::vector<Measurement>& ms, const Judged& j, double elapsed_s) {
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
  return {{"schema", "shunt-audit/1"},      {"verdict", status_name(root.status)},
          {"exit", exit_code(root.status)}, {"summary", root.detail},
          {"elapsed_s", elapsed_s},         {"hosts", hosts},
          {"tree", to_json(root)},          {"matrices", matrices(ms, j, names)},
          {"measurements", meas},           {"links", links}};
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
  for (auto& m : r.value("matrices", json::array())) {
    auto hosts = m["hosts"];
    h += fmt::format(
        "<h3>rail {}</h3>\n<table class=\"matrix\" data-rail=\"{}\"><tr><th>from \\ to</th>",
        m["rail"].get<int>(), m["rail"].get<int>());
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
  h += "</body></html>\n";
  return h;
}

}  // namespace audit
