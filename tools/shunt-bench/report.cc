#include "tools/shunt-bench/report.h"

#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/timeline.h"
#include "tools/shunt-bench/workload.h"

#ifndef SHUNT_VERSION
#define SHUNT_VERSION "0"
#endif

namespace bench {

void print_header(FILE* out, const Options& o, const Workload& w, int world, const std::vector<std::string>& ranks) {
  fprintf(out, "# shunt-bench %s: %s over %s%s%s, %d ranks\n", SHUNT_VERSION, to_string(o.pattern),
          to_string(o.transport), o.transport == TransportKind::verbs ? " " : "",
          o.transport == TransportKind::verbs ? to_string(o.verb) : "", world);
  fprintf(out, "# minBytes %zu maxBytes %zu step: %g(factor) warmup iters: %d iters: %d duration: %g s validation: %d\n",
          o.min_bytes, o.max_bytes, o.factor, o.warmup, o.iters, o.duration_s, o.check ? 1 : 0);
  fprintf(out, "#\n# Using devices\n");
  for (size_t r = 0; r < ranks.size(); r++) fprintf(out, "#  Rank %2zu %s\n", r, ranks[r].c_str());
  fprintf(out, "#\n");
  // nccl-tests' layout: an out-of-place and an in-place group. The
  // collectives here always move data between separate send and receive
  // buffers, so the in-place group holds N/A (parsers still find 13 columns).
  fprintf(out, "# %10s %12s %8s %6s %6s %37s %37s\n", "", "", "", "", "", "out-of-place", "in-place");
  fprintf(out, "# %10s %12s %8s %6s %6s %10s %8s %8s %7s %10s %8s %8s %7s\n", "size", "count", "type", "redop",
          "root", "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong");
  fprintf(out, "# %10s %12s %8s %6s %6s %10s %8s %8s %7s %10s %8s %8s %7s\n", "(B)", "(elements)", "", "", "",
          "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", "");
  (void)w;
  fflush(out);
}

void print_row(FILE* out, const Options& o, const Workload& w, const SizeResult& r) {
  char wrong[32];
  if (o.check)
    snprintf(wrong, sizeof wrong, "%llu", static_cast<unsigned long long>(r.wrong));
  else
    snprintf(wrong, sizeof wrong, "N/A");
  fprintf(out, "  %10zu %12zu %8s %6s %6d %10.2f %8.3f %8.3f %7s %10s %8s %8s %7s\n", r.bytes, r.count, w.type(),
          w.redop(), -1, r.time_us, r.algbw, r.busbw, wrong, "N/A", "N/A", "N/A", "N/A");
  fflush(out);
}

double avg_busbw(const RunSummary& s) {
  if (s.rows.empty()) return 0;
  double sum = 0;
  for (const auto& r : s.rows) sum += r.busbw;
  return sum / s.rows.size();
}

uint64_t total_wrong(const RunSummary& s) {
  uint64_t n = 0;
  for (const auto& r : s.rows) n += r.wrong;
  return n;
}

void print_footer(FILE* out, const Options& o, const RunSummary& s) {
  uint64_t wrong = total_wrong(s);
  if (o.check) fprintf(out, "# Out of bounds values : %llu %s\n", static_cast<unsigned long long>(wrong), wrong ? "FAILED" : "OK");
  fprintf(out, "# Errors seen          : %llu%s%s\n", static_cast<unsigned long long>(s.errors),
          s.error.empty() ? "" : "  first: ", s.error.c_str());
  fprintf(out, "# Avg bus bandwidth    : %g\n", avg_busbw(s));
  fprintf(out, "#\n");
  fflush(out);
}

void write_json(const std::string& path, const Options& o, const Workload& w, int world, const RunSummary& s,
                const Timeline* tl, const std::vector<Mark>& marks, const std::string& label) {
  using nlohmann::json;
  json j;
  j["tool"] = "shunt-bench";
  j["version"] = SHUNT_VERSION;
  j["label"] = label;
  j["pattern"] = to_string(o.pattern);
  j["transport"] = to_string(o.transport);
  if (o.transport == TransportKind::verbs) j["verb"] = to_string(o.verb);
  j["world"] = world;
  j["ranks"] = s.ranks;
  j["options"] = {{"min_bytes", o.min_bytes}, {"max_bytes", o.max_bytes}, {"factor", o.factor},
                  {"iters", o.iters},         {"warmup", o.warmup},       {"check", o.check},
                  {"duration_s", o.duration_s}, {"compute_ms", o.compute_ms}};
  json rows = json::array();
  for (const auto& r : s.rows)
    rows.push_back({{"size", r.bytes}, {"count", r.count}, {"type", w.type()}, {"redop", w.redop()},
                    {"root", -1}, {"time_us", r.time_us}, {"algbw", r.algbw}, {"busbw", r.busbw},
                    {"wrong", o.check ? json(r.wrong) : json(nullptr)}, {"iters", r.iters}});
  j["results"] = rows;
  j["avg_busbw"] = avg_busbw(s);
  j["wrong_total"] = o.check ? json(total_wrong(s)) : json(nullptr);
  j["errors"] = s.errors;
  j["error"] = s.error.empty() ? json(nullptr) : json(s.error);
  if (tl) {
    json samples = json::array();
    for (const auto& x : tl->samples()) samples.push_back({x.wall, x.t, x.bytes, x.gbps, x.errors});
    j["timeline"] = {{"interval_ms", tl->interval_ms()},
                     {"start_wall", tl->start_wall()},
                     {"sampler_cpu_s", tl->sampler_cpu_s()},
                     {"columns", {"wall_s", "t_s", "bytes", "gbps", "errors"}},
                     {"samples", samples}};
  }
  json jm = json::array();
  for (const auto& m : marks) {
    double t = m.absolute && tl ? m.t - tl->start_wall() : m.t;
    jm.push_back({{"t", t}, {"label", m.label}});
  }
  j["marks"] = jm;
  std::ofstream out(path);
  if (!out) throw BenchError("cannot write " + path);
  out << j.dump(1) << "\n";
}

}  // namespace bench
