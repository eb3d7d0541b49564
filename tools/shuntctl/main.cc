// shuntctl: inspect shunt. `config` needs no running job; the other
// commands ask the host agent of a running job (SHUNT_RUN_DIR).
#include <CLI/CLI.hpp>
#include <iostream>

#include "tools/shuntctl/agent_cmd.h"
#include "tools/shuntctl/config_cmd.h"

int main(int argc, char** argv) {
  CLI::App app{"shuntctl: inspect and control shunt"};
  app.require_subcommand(1);
  bool json = false, markdown = false, man = false;
  auto* config = app.add_subcommand("config", "Every SHUNT_* variable: default, value in force here, help");
  config->add_flag("--json", json, "JSON output");
  config->add_flag("--markdown", markdown, "Markdown table (the README's)");
  config->add_flag("--man", man, "mdoc list items (the man pages' ENVIRONMENT)");
  struct AgentCmd {
    const char* name;
    const char* help;
  };
  const AgentCmd agent_cmds[] = {
      {"status", "The host agent and every shunt process on this host"},
      {"peers", "Probe peers: clock offset and bound, per-rail path state and delay"},
      {"members", "Every process's latest counters as reported to the agent"},
  };
  std::vector<std::pair<CLI::App*, std::string>> subs;
  for (auto& c : agent_cmds) {
    auto* s = app.add_subcommand(c.name, c.help);
    s->add_flag("--json", json, "JSON output");
    subs.emplace_back(s, c.name);
  }
  CLI11_PARSE(app, argc, argv);
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
