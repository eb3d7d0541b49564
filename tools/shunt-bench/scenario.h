// `shunt-bench scenario NAME`: hands over to the scenario script installed
// next to the binary (shunt-bench-scenario), which brings up a fabric, runs
// the workload without and with libshunt, injects the fault and compares.
#pragma once
#include "tools/shunt-bench/cli.h"

namespace bench {
int run_scenario(const char* argv0, const ScenarioArgs& s);
}
