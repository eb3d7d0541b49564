// What the host agent keeps of the exited processes it lets go.
#pragma once
#include <cstddef>
#include <nlohmann/json.hpp>

namespace shunt::telemetry {

// Folds an exited member's counters (the only thing left of it once the
// agent lets its report go) into retired: one entry per job and rank, in a
// member's own form but with counters alone, so every counter series that
// sums processes of that job and rank never goes backwards. Entries and
// their lists are bounded (kMaxRetired, kMaxRetiredKeys); what is beyond
// them is not kept.
constexpr size_t kMaxRetired = 1024;
constexpr size_t kMaxRetiredKeys = 4096;
void fold_exited(nlohmann::json& retired, const nlohmann::json& member);

}  // namespace shunt::telemetry
