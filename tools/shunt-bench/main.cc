// shunt-bench: measures what a collective job sees of the network, with
// and without libshunt, before, during and after a fault.
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tools/shunt-bench/bootstrap.h"
#include "tools/shunt-bench/cli.h"
#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/plot.h"
#include "tools/shunt-bench/report.h"
#include "tools/shunt-bench/runner.h"
#include "tools/shunt-bench/scenario.h"
#include "tools/shunt-bench/timeline.h"
#include "tools/shunt-bench/transport.h"
#include "tools/shunt-bench/workload.h"

namespace bench {
namespace {

constexpr int kExitWrong = 1;  // ran, but the check found wrong data
constexpr int kExitError = 2;  // transport or setup failure

std::string describe_rank(const Transport& t) {
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  return "Pid " + std::to_string(getpid()) + " on " + host + " " + t.describe();
}

void write_timeline_file(const std::string& path, const Timeline& tl) {
  FILE* f = fopen(path.c_str(), "w");
  if (!f) throw BenchError("cannot write " + path);
  Timeline::print_header(f, tl.interval_ms());
  for (const auto& s : tl.samples()) Timeline::print_row(f, s);
  fclose(f);
}

// Saves, plots and reports whatever was measured, also after a failure.
void finish(const Options& o, const Workload& w, int world, RunSummary& sum, Timeline* tl) {
  std::vector<Mark> marks = o.marks;
  if (!o.marks_file.empty()) {
    try {  // a missing marks file costs the marks, not the results
      for (auto& m : read_marks_file(o.marks_file)) marks.push_back(m);
    } catch (const BenchError& e) {
      fprintf(stderr, "shunt-bench: warning: %s\n", e.what());
    }
  }
  print_footer(stdout, o, sum);
  if (!o.json_file.empty()) write_json(o.json_file, o, w, world, sum, tl, marks, o.label);
  if (tl && !o.timeline_file.empty()) write_timeline_file(o.timeline_file, *tl);
  if (tl && !o.plot_file.empty()) {
    Series s{o.label.empty() ? std::string(to_string(o.pattern)) + " over " + to_string(o.transport) : o.label, {}};
    for (const auto& x : tl->samples()) s.points.emplace_back(x.t, x.gbps);
    plot_timelines({s}, marks, tl->start_wall(), "shunt-bench timeline", o.plot_file);
  }
}

int run_bench(const Options& o) {
  if (o.world > 1 && o.bootstrap.empty()) throw BenchError("--bootstrap HOST:PORT is needed with more than one rank");
  if (o.rank < 0 || o.world < 1 || o.rank >= o.world) throw BenchError("need 0 <= --rank < --world");
  if (!o.plot_file.empty() && o.timeline_ms == 0) throw BenchError("--plot needs --timeline MS");

  Bootstrap bs(o.rank, o.world, o.bootstrap.empty() ? "127.0.0.1:0" : o.bootstrap, o.connect_timeout_s);
  bs.set_wait_s(o.stall_timeout_s);
  Progress prog;
  auto w = make_workload(o.pattern, o.rank, o.world, o.max_bytes);
  auto t = o.transport == TransportKind::tcp ? make_tcp_transport(o, bs, w->region_bytes(), prog)
                                             : make_verbs_transport(o, bs, w->region_bytes(), prog);
  const bool lead = o.rank == 0;
  RunSummary sum;
  sum.ranks = bs.allgather(describe_rank(*t));
  if (lead) print_header(stdout, o, *w, o.world, sum.ranks);

  std::unique_ptr<Timeline> tl;
  if (o.timeline_ms > 0) {
    tl = std::make_unique<Timeline>(prog, o.timeline_ms, lead && !o.quiet ? stdout : nullptr);
    tl->start();
  }
  if (!o.ready_file.empty()) {
    FILE* f = fopen(o.ready_file.c_str(), "w");
    if (!f) throw BenchError("cannot create " + o.ready_file);
    fprintf(f, "%.6f\n", wall_now());
    fclose(f);
  }
  try {
    run_sweep(o, bs, *t, *w, sum, [&](const SizeResult& r) {
      if (lead) print_row(stdout, o, *w, r);
    });
  } catch (const BenchError& e) {
    sum.error = e.what();
  }
  if (tl) tl->stop();
  sum.errors = prog.errors.load();
  if (!sum.error.empty()) {
    fprintf(stderr, "shunt-bench: rank %d: error: %s\n", o.rank, sum.error.c_str());
    if (sum.errors == 0) sum.errors = 1;
  }
  if (lead) finish(o, *w, o.world, sum, tl.get());
  if (!sum.error.empty()) return kExitError;
  return o.check && total_wrong(sum) ? kExitWrong : 0;
}

int run_plot(const PlotArgs& p) {
  std::vector<Series> series;
  std::vector<Mark> marks;
  double start = 0;
  for (const auto& in : p.inputs) {
    std::ifstream f(in);
    auto j = nlohmann::json::parse(f);
    if (!j.contains("timeline")) throw BenchError(in + " has no timeline (run with --timeline)");
    Series s{j.value("label", std::string()), {}};
    if (s.label.empty()) s.label = in;
    double t0 = j["timeline"]["start_wall"].get<double>();
    // All files share the first one's clock, so runs started at different
    // times can be drawn against their own start: use each file's t column.
    if (series.empty()) start = t0;
    for (const auto& row : j["timeline"]["samples"]) s.points.emplace_back(row[1].get<double>(), row[3].get<double>());
    series.push_back(std::move(s));
    if (series.size() == 1)
      for (const auto& m : j["marks"]) marks.push_back({m["t"].get<double>(), false, m["label"].get<std::string>()});
  }
  for (const auto& m : p.marks) marks.push_back(parse_mark(m));
  if (!p.marks_file.empty())
    for (auto& m : read_marks_file(p.marks_file)) marks.push_back(m);
  plot_timelines(series, marks, start, p.title.empty() ? "shunt-bench timeline" : p.title, p.out);
  return 0;
}

}  // namespace
}  // namespace bench

int main(int argc, char** argv) {
  using namespace bench;
  Options o;
  PlotArgs p;
  ScenarioArgs s;
  Command cmd = Command::bench;
  try {
    // Everything after `scenario` belongs to the scenario script (--help too).
    if (argc > 1 && std::string(argv[1]) == "scenario") {
      if (argc > 2) s.name = argv[2];
      for (int i = 3; i < argc; i++) s.passthrough.push_back(argv[i]);
      return run_scenario(argv[0], s);
    }
    int rc = parse_command_line(argc, argv, &o, &p, &s, &cmd);
    if (rc >= 0) return rc;
    switch (cmd) {
      case Command::bench: return run_bench(o);
      case Command::plot: return run_plot(p);
      case Command::scenario: return run_scenario(argv[0], s);
    }
  } catch (const BenchError& e) {
    if (cmd == Command::bench && o.rank >= 0)
      fprintf(stderr, "shunt-bench: rank %d: error: %s\n", o.rank, e.what());
    else
      fprintf(stderr, "shunt-bench: error: %s\n", e.what());
    return kExitError;
  } catch (const std::exception& e) {
    fprintf(stderr, "shunt-bench: error: %s\n", e.what());
    return kExitError;
  }
  return 0;
}
