#include "tools/shunt-bench/cli.h"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <initializer_list>
#include <map>

#include "tools/common/cli_exit.h"
#include "tools/shunt-bench/plot.h"

namespace bench {

bool parse_bytes(const std::string& s, size_t* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  double v = strtod(s.c_str(), &end);
  std::string suf = end;
  double mult = 1;
  if (suf == "K" || suf == "k") mult = 1024;
  else if (suf == "M" || suf == "m") mult = 1024.0 * 1024;
  else if (suf == "G" || suf == "g") mult = 1024.0 * 1024 * 1024;
  else if (!suf.empty()) return false;
  if (v < 0) return false;
  *out = static_cast<size_t>(v * mult);
  return true;
}

const char* to_string(Pattern p) {
  switch (p) {
    case Pattern::alltoall: return "alltoall";
    case Pattern::allreduce: return "allreduce";
    case Pattern::sendrecv: return "sendrecv";
  }
  return "?";
}
const char* to_string(TransportKind t) { return t == TransportKind::tcp ? "tcp" : "verbs"; }
const char* to_string(Verb v) { return v == Verb::write_imm ? "write_imm" : "send"; }

namespace {

CLI::Option* bytes_option(CLI::App& app, const std::string& name, size_t* out, const std::string& help) {
  return app.add_option_function<std::string>(
                name,
                [out, name](const std::string& s) {
                  if (!parse_bytes(s, out)) throw CLI::ValidationError(name, "bad size '" + s + "' (e.g. 64K, 8M, 1G)");
                },
                help)
      ->type_name("BYTES");
}

// A name from a fixed set. Unlike CLI11's CheckedTransformer, which also
// takes the enum's number, `-p 1` (nccl-tests' parallel-init flag) is refused
// rather than read as the second pattern.
template <class E>
CLI::Option* name_option(CLI::App& app, const std::string& flags, E* out, const std::map<std::string, E>& names,
                         const std::string& help) {
  return app.add_option_function<std::string>(
                flags,
                [out, names, flags](const std::string& s) {
                  auto it = names.find(s);
                  if (it != names.end()) return void(*out = it->second);
                  std::string all;
                  for (const auto& [n, v] : names) all += (all.empty() ? "" : ", ") + n;
                  throw CLI::ValidationError(flags, "'" + s + "' is not one of " + all);
                },
                help)
      ->type_name("NAME");
}

// The launcher tells each process its place: mpirun (Open MPI, or any PMI
// launcher) or Slurm's srun. An explicit --rank/--world wins; a --world that
// contradicts the launcher's size is refused rather than run as another job.
int world_from_environment(Options* o) {
  auto env_int = [](std::initializer_list<const char*> names, const char** which) {
    for (const char* n : names)
      if (const char* v = getenv(n)) {
        *which = n;
        return atoi(v);
      }
    return -1;
  };
  const char *rank_var = nullptr, *size_var = nullptr;
  int rank = env_int({"OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"}, &rank_var);
  int size = env_int({"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"}, &size_var);
  if (size > 0 && o->world > 0 && size != o->world) {
    fprintf(stderr, "shunt-bench: --world %d, but the launcher started %d ranks (%s=%d)\n", o->world, size,
            size_var, size);
    return shunt::cli::kExitUsage;
  }
  if (o->rank < 0) o->rank = rank;
  if (o->world < 0) o->world = size;
  if (o->bootstrap.empty())
    if (const char* v = getenv("SHUNT_BENCH_BOOTSTRAP")) o->bootstrap = v;
  if (o->rank < 0 && o->world < 0) o->rank = 0, o->world = 1;
  return -1;
}

}  // namespace

int parse_command_line(int argc, char** argv, Options* o, PlotArgs* p, ScenarioArgs* s, Command* cmd) {
  CLI::App app{"shunt-bench: all-to-all, allreduce and send/recv benchmark over RDMA verbs or TCP"};
  app.set_version_flag("--version", std::string("shunt-bench ") + SHUNT_VERSION);
  app.require_subcommand(0, 1);
  // A repeated option takes its last value (wrappers append overrides).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);

  // world
  app.add_option("--rank", o->rank, "this process's rank (default: OMPI_COMM_WORLD_RANK, PMI_RANK or SLURM_PROCID)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--world", o->world, "number of ranks (default: OMPI_COMM_WORLD_SIZE, PMI_SIZE or SLURM_NTASKS)")
      ->check(CLI::PositiveNumber);
  app.add_option("--bootstrap", o->bootstrap, "HOST:PORT that rank 0 listens on (default: SHUNT_BENCH_BOOTSTRAP)");
  app.add_option("--connect-timeout", o->connect_timeout_s, "seconds to wait for the other ranks")
      ->check(CLI::PositiveNumber);

  // transport
  std::map<std::string, TransportKind> transports{{"tcp", TransportKind::tcp}, {"verbs", TransportKind::verbs}};
  std::map<std::string, Verb> verbs{{"write_imm", Verb::write_imm}, {"send", Verb::send}};
  name_option(app, "--transport", &o->transport, transports, "tcp or verbs");
  name_option(app, "--verb", &o->verb, verbs, "verbs: write_imm (RDMA WRITE with immediate) or send (SEND/RECV)");
  app.add_option("--addr", o->addr, "tcp: local address to listen on (default: the one that reaches rank 0)");
  app.add_option("-d,--ib-dev", o->device, "verbs: RDMA device (default: the first)");
  app.add_option("-i,--ib-port", o->ib_port, "verbs: port number")->check(CLI::Range(1, 255));
  app.add_option("-x,--gid-index", o->gid_index, "verbs: GID index (default: first RoCEv2 IPv4 GID)")
      ->check(CLI::Range(0, 65535));
  bytes_option(app, "--seg", &o->seg_bytes, "verbs: largest work request (default 1M)");
  app.add_option("--qp-timeout", o->qp_timeout, "verbs: local ACK timeout exponent (4.096 us * 2^N)")
      ->check(CLI::Range(0, 31));
  app.add_option("--retry-cnt", o->retry_cnt, "verbs: transport retries")->check(CLI::Range(0, 7));

  // workload
  std::map<std::string, Pattern> patterns{
      {"alltoall", Pattern::alltoall}, {"allreduce", Pattern::allreduce}, {"sendrecv", Pattern::sendrecv}};
  name_option(app, "-p,--pattern", &o->pattern, patterns, "alltoall, allreduce (ring) or sendrecv");
  bytes_option(app, "-b,--minbytes", &o->min_bytes, "smallest size (default 1M)");
  bytes_option(app, "-e,--maxbytes", &o->max_bytes, "largest size (default 64M)");
  app.add_option("-f,--stepfactor", o->factor, "multiply the size by this between steps")->check(CLI::PositiveNumber);
  app.add_option("-n,--iters", o->iters, "timed iterations per size")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o->warmup, "untimed iterations first")->check(CLI::NonNegativeNumber);
  int check = 1;  // nccl-tests' default
  app.add_option("-c,--check", check, "1 (default): fill and verify every byte, count #wrong; 0: do not");
  app.add_option("-J,--output_file", o->json_file, "write results as JSON to FILE");
  app.add_option("--duration", o->duration_s, "run each size this many seconds instead of -n iterations")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--stall-timeout", o->stall_timeout_s, "seconds without progress that count as a failure")
      ->check(CLI::PositiveNumber);
  app.add_option("--compute-ms", o->compute_ms, "sleep MS after each iteration, untimed, as a training step's compute")
      ->check(CLI::Range(0, 600000));

  // output
  app.add_option("--timeline", o->timeline_ms, "print delivered throughput every MS milliseconds")
      ->check(CLI::Range(1, 60000));
  app.add_option("--timeline-file", o->timeline_file, "also write the timeline rows to FILE");
  app.add_option("--plot", o->plot_file, "draw the timeline to FILE.png or FILE.svg (needs --timeline)");
  std::vector<std::string> marks;
  app.add_option("--mark", marks, "mark T:LABEL (seconds since start) or @EPOCH:LABEL on the plot")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--marks-file", o->marks_file, "more marks, one per line, read when plotting");
  app.add_option("--label", o->label, "name of this run in JSON and plots");
  app.add_option("--ready-file", o->ready_file, "create FILE when the timeline starts (for fault injectors)");
  app.add_option("--stop-file", o->stop_file,
                 "with --duration: end the run early once FILE exists on rank 0's host (for harnesses "
                 "that act on the live job; the duration stays the most it runs)");
  app.add_flag("-q,--quiet", o->quiet, "no live timeline rows");
  app.add_flag("--corrupt", o->corrupt, "")->group("");  // test hook: proves that -c can fail

  CLI::App* plot = app.add_subcommand("plot", "draw timelines saved with -J (one line per file)");
  plot->add_option("inputs", p->inputs, "JSON files")
      ->required()
      ->check(CLI::ExistingFile)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  plot->add_option("-o,--output", p->out, "FILE.png or FILE.svg")->required();
  plot->add_option("--title", p->title, "plot title");
  plot->add_option("--mark", p->marks, "T:LABEL or @EPOCH:LABEL")
      ->allow_extra_args(false)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  plot->add_option("--marks-file", p->marks_file, "marks, one per line");

  CLI::App* scen = app.add_subcommand("scenario", "run a fault scenario without and with libshunt");
  scen->add_option("name", s->name, "link-down, port-down, flap or blackhole")->required();
  scen->add_option("args", s->passthrough, "options for the scenario (see --help of the script)")
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  scen->allow_extras();

  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;
  o->check = check != 0;
  if (!o->stop_file.empty() && o->duration_s <= 0) {
    fprintf(stderr, "shunt-bench: --stop-file needs --duration (the most the run lasts)\n");
    return shunt::cli::kExitUsage;
  }
  for (const auto& m : marks) o->marks.push_back(parse_mark(m));
  *cmd = plot->parsed() ? Command::plot : scen->parsed() ? Command::scenario : Command::bench;
  if (*cmd == Command::scenario)
    for (const auto& x : scen->remaining()) s->passthrough.push_back(x);
  if (*cmd == Command::bench) return world_from_environment(o);
  return -1;
}

}  // namespace bench
