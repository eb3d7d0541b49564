// The verbs part's section of every process snapshot (stats_json in
// telemetry/stats_file.h): "verbs" (calls, devices, QPs), "bundles",
// "closed_bundle_paths" and "replays".
#pragma once

namespace shunt::verbs {

// Registers the section with telemetry (register_stats_source), through
// register_stats_sources() (interpose/stats_sources.h). Idempotent, any
// thread.
void register_stats();

}  // namespace shunt::verbs
