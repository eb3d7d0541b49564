// SHUNT_STATS_FILE: the process's counters as one JSON document, written at
// exit (to a temporary name, then renamed, so a reader never sees half).
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::telemetry {

// What a snapshot holds: everything, or the process's sockets and
// identity alone (no verbs section: no walk over every QP and bundle).
enum class Detail { full, sockets };
nlohmann::json stats_json(Detail detail = Detail::full);

// A part's section of every snapshot: it adds its own keys to `snapshot`
// (with Detail::sockets, what it has without walking every QP and
// bundle). The verbs part's (interpose/verbs/stats_source.cc) and the
// socket part's (interpose/socket/stats_source.cc) are registered by
// shunt::register_stats_sources() (interpose/stats_sources.h), so
// telemetry includes neither. Registering a source again is a no-op;
// safe from any thread, at any time (the table needs no initializer).
using StatsSource = void (*)(nlohmann::json& snapshot, Detail detail);
void register_stats_source(StatsSource source);
// Writes stats_json() to the expanded SHUNT_STATS_FILE; false on error.
bool write_stats_file(const std::string& pattern);
// Registers the exit hook when SHUNT_STATS_FILE is set (called at init).
void install_stats_file();

}  // namespace shunt::telemetry
