// The audit's outputs: the tree as text, the JSON report and the HTML page
// (one file, no external resources) with the tree and an all-pairs matrix
// per rail. The JSON schema is in docs/audit.md.
#pragma once
#include <nlohmann/json.hpp>
#include <ostream>
#include <string>
#include <vector>

#include "tools/shunt-audit/mesh.h"
#include "tools/shunt-audit/verdict.h"

namespace audit {

// Per rail, the all-pairs matrix: a cell per (source, destination) with
// its best path's bandwidth and latency, the worst status, and each path.
// With by_spine, one per rail and spine, of the measurements through it
// (each has "spine", k, and "routers": each sender's k-th router by address).
nlohmann::json matrices(const std::vector<Measurement>& m, const Judged& j,
                        const std::vector<std::string>& names, bool by_spine = false);

// Text: every node down to depth 2, deeper ones where they did not pass
// (all of them with verbose).
void print_tree(std::ostream& o, const Node& root, bool verbose, bool colour);
std::string verdict_line(const Node& root);

// The whole report:
// {"schema","verdict","exit","summary","elapsed_s","hosts","tree","matrices","spine_matrices",
//  "measurements","links","probes"}
nlohmann::json report_json(const Node& root, const std::vector<std::string>& names,
                           const std::vector<std::string>& addrs,
                           const std::vector<nlohmann::json>& facts,
                           const std::vector<Measurement>& m, const Judged& j, double elapsed_s,
                           const Mesh* mesh = nullptr, const Thresholds& t = {});
std::string report_html(const nlohmann::json& report);

}  // namespace audit
