// The host agent's workload diagnosis (diagnose.h): a look every second
// from the members' reports and the probe engine, the "diagnose" control
// command, and slowdown events in the event log.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>

namespace shunt::clocksync {
class ProbeEngine;
}

namespace shunt::telemetry {

// Called once from register_agent_services.
void register_diagnose(std::function<clocksync::ProbeEngine*()> engine);

// This host's latest diagnosis (Diagnoser::view() plus "host"); any thread.
nlohmann::json diagnosis_now();

}  // namespace shunt::telemetry
