// shuntctl: inspect shunt. `config` needs no running job; the commands that
// read a live job's state talk to the host agent.
#include <CLI/CLI.hpp>
#include <iostream>

#include "tools/shuntctl/config_cmd.h"

int main(int argc, char** argv) {
  CLI::App app{"shuntctl: inspect and control shunt"};
  app.require_subcommand(1);
  bool json = false, markdown = false, man = false;
  auto* config = app.add_subcommand("config", "Every SHUNT_* variable: default, value in force here, help");
  config->add_flag("--json", json, "JSON output");
  config->add_flag("--markdown", markdown, "Markdown table (the README's)");
  config->add_flag("--man", man, "mdoc list items (the man pages' ENVIRONMENT)");
  CLI11_PARSE(app, argc, argv);
  if (config->parsed()) {
    using shunt::ctl::ConfigFormat;
    ConfigFormat f = json ? ConfigFormat::json
                     : markdown ? ConfigFormat::markdown
                     : man ? ConfigFormat::man
                           : ConfigFormat::table;
    return shunt::ctl::print_config(std::cout, f);
  }
  return 0;
}
