// The socket part's section of every process snapshot (stats_json in
// telemetry/stats_file.h): "sockets", "closed_sockets", "sockets_untracked"
// and "forks".
#pragma once

namespace shunt::sock {

// Registers the section with telemetry (register_stats_source), through
// register_stats_sources() (interpose/stats_sources.h). Idempotent, any
// thread.
void register_stats();

}  // namespace shunt::sock
