// shuntctl: inspect shunt. `config` needs no running job; the other
// commands ask the host agent of a running job (SHUNT_RUN_DIR).
#include <CLI/CLI.hpp>
#include <iostream>

#include "tools/common/cli_exit.h"
#include "tools/shuntctl/agent_cmd.h"
#include "tools/shuntctl/config_cmd.h"
#include "tools/shuntctl/diagnose_cmd.h"
#include "tools/shuntctl/telemetry_cmd.h"

int main(int argc, char** argv) {
  CLI::App app{"shuntctl: inspect and control shunt"};
  app.set_version_flag("--version", std::string("shuntctl ") + SHUNT_VERSION);
  app.require_subcommand(1);
  bool json = false, markdown = false, man = false;
  auto* config = app.add_subcommand("config", "Every SHUNT_* variable: default, value in force here, help");
  config->add_flag("--json", json, "JSON output");
  config->add_flag("--markdown", markdown, "Markdown table (docs/configuration.md's)");
  config->add_flag("--man", man, "mdoc list items (the man pages' ENVIRONMENT)");
  struct AgentCmd {
    const char* name;
    const char* help;
  };
  const AgentCmd agent_cmds[] = {
      {"status", "The host agent and every shunt process on this host"},
      {"peers", "Probe peers: clock offset and bound, per-rail path state and delay"},
      {"members", "Every process's latest counters as reported to the agent"},
      {"sockets", "Rails, MPTCP endpoints and limits, and the commands that would fix missing ones"},
  };
  std::vector<std::pair<CLI::App*, std::string>> subs;
  for (auto& c : agent_cmds) {
    auto* s = app.add_subcommand(c.name, c.help);
    s->add_flag("--json", json, "JSON output");
    subs.emplace_back(s, c.name);
  }
  shunt::ctl::LiveOptions live;
  auto* paths = app.add_subcommand("paths", "Every probed path (state, traffic rate, one-way delay, RTT, loss) and every path of every bundle (state, carrier, send rate, failures)");
  paths->add_flag("--json", live.json, "JSON output");
  paths->add_option("--interval", live.interval_ms, "Milliseconds between the two samples a rate is taken from")
      ->check(CLI::Range(10, 60000));
  auto* events = app.add_subcommand("events", "The job's events on this host (SHUNT_EVENT_LOG), oldest first");
  events->add_flag("--json", live.json, "JSON output (an array; with --follow one object per line)");
  events->add_flag("-f,--follow", live.follow, "Keep printing events as they come");
  events->add_option("--file", live.file, "Read this event log instead of asking the agent");
  auto* top = app.add_subcommand("top", "Live view: every process's traffic rates and every path");
  top->add_flag("--json", live.json, "One JSON object per refresh");
  top->add_option("--interval", live.interval_ms, "Milliseconds between refreshes")->check(CLI::Range(10, 60000));
  top->add_option("-n,--iterations", live.iterations, "Stop after this many refreshes (0: never)");
  shunt::ctl::DiagnoseArgs da;
  auto* diagnose = app.add_subcommand("diagnose", "Why the job is slow: the link, host or path blamed, with every peer pair's rate");
  diagnose->add_flag("--json", da.json, "JSON output");
  diagnose->add_flag("--local", da.local, "This host's view alone (do not ask the other hosts' agents)");
  diagnose->add_option("--timeout", da.timeout_ms, "Milliseconds to wait for each other host")->check(CLI::Range(100, 60000));
  diagnose->add_option("--watch", da.watch_s, "Ask once a second for this many seconds, a line each time")
      ->check(CLI::Range(1, 86400));
  diagnose->add_option("--plot", da.plot, "With --watch: draw each rank's step time over the blamed route's queue (FILE.svg or FILE.png)")
      ->needs("--watch");
  shunt::ctl::ProbingArgs pa;
  auto* probing = app.add_subcommand(
      "probing", "Pause the host's probe engine (every host of the job at the same time, to price probing), or end a pause");
  probing->add_option("--pause", pa.pause_ms, "Pause for this many ms")->check(CLI::Range(1, 600000));
  probing->add_option("--at", pa.at_unix_ms, "From this wall-clock time (unix ms; default now)")->needs("--pause");
  auto* every = probing->add_option("--every", pa.every_ms, "Pause again this many ms after each pause began")
                    ->needs("--pause");
  probing->add_option("--count", pa.count, "Pauses in all, with --every")->check(CLI::Range(2, 10000))->needs(every);
  every->needs("--count");
  probing->add_flag("--resume", pa.resume, "End the pauses now")->excludes("--pause");
  probing->add_flag("--json", json, "JSON output");
  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;
  if (diagnose->parsed()) return shunt::ctl::diagnose_command(std::cout, da);
  if (probing->parsed()) return shunt::ctl::probing_command(std::cout, pa, json);
  if (paths->parsed()) return shunt::ctl::paths_command(std::cout, live);
  if (events->parsed()) return shunt::ctl::events_command(std::cout, live);
  if (top->parsed()) return shunt::ctl::top_command(std::cout, live);
  if (config->parsed()) {
    using shunt::ctl::ConfigFormat;
    ConfigFormat f = json ? ConfigFormat::json
                     : markdown ? ConfigFormat::markdown
                     : man ? ConfigFormat::man
                           : ConfigFormat::table;
    return shunt::ctl::print_config(std::cout, f);
  }
  for (auto& [s, name] : subs)
    if (s->parsed()) return shunt::ctl::agent_command(std::cout, name, json);
  return 0;
}
