// A process where shunt turned itself off over a bad setting has no agent
// thread, yet the operator must see it: it reports itself to the host agent,
// mode "off" and the reason, at start and at exit.
#pragma once
#include <nlohmann/json.hpp>

namespace shunt::telemetry {

// The report's snapshot: what stats_json() says of a process, with mode
// "off" and "off_reason", and no counters (there are none).
nlohmann::json off_snapshot(const std::string& reason);
// Sends it when init turned shunt off and SHUNT_AGENT allows reporting, and
// registers the last one at exit (called at init, after ensure_init()).
void report_off_process();

}  // namespace shunt::telemetry
