// Command line: the benchmark itself, plus `plot` (redraw saved timelines)
// and `scenario` (a fault run with and without libshunt).
#pragma once
#include <string>
#include <vector>

#include "tools/shunt-bench/options.h"

namespace bench {

struct PlotArgs {
  std::vector<std::string> inputs;  // JSON files written with -J
  std::string out;
  std::string title;
  std::vector<std::string> marks;
  std::string marks_file;
};

struct ScenarioArgs {
  std::string name;
  std::vector<std::string> passthrough;  // handed to the scenario script
};

enum class Command { bench, plot, scenario };

// Returns -1 when *cmd should run, else the exit code (help, bad usage).
int parse_command_line(int argc, char** argv, Options* o, PlotArgs* p, ScenarioArgs* s, Command* cmd);

}  // namespace bench
