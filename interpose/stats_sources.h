// The interposed parts' sections of the process snapshot (stats_json in
// telemetry/stats_file.h): the verbs part's and the socket part's, each
// registered with telemetry::register_stats_source. Nothing registers
// them at load (libshunt builds no state then: e2e 15-no-early-state), so
// a program that takes snapshots calls this first: libshunt.so in its
// constructor and in the agent's start (which can come first: a socket
// opened in another library's constructor starts the agent), the unit
// tests and the benchmark before theirs. Idempotent, any thread.
#pragma once

namespace shunt {

void register_stats_sources();

}  // namespace shunt
