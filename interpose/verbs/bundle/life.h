// A path's life: where a bundle's path (a shadow QP, or the application's
// own) stands between service and failure, as states and events with one
// pure transition function. Path::life holds it, under Bundle::lk.
#pragma once
#include <cstdint>

namespace shunt::verbs::bundle {

enum class Life : uint8_t {
  in_service,        // in the rotation
  checking,          // in service, its probe out (another path failed: is this one behind
                     // the same fault?): out of the rotation until the probe completes
  probation,         // renewed, its probe out: back in the rotation, and up, once it completes
  failed,            // out of service after a failure, until renewed; its errors are shunt's
  failed_unproven,   // failed again on probation, before its probe completed
  stopped,           // out of service: a planned carrier move (steering) took it, no failure
  stopped_unproven,  // stopped while on probation
};
inline constexpr int kLives = 7;

enum class LifeEvent : uint8_t {
  fail,          // an error completion, a stall, a port event, its probes lost, the peer's word
  stop,          // a planned carrier move stops it
  reset,         // its QP is set up again on a new port (renewal, before it goes back in service)
  renew,         // back in service on the new port, its probe to follow
  probe_sent,    // shunt's probe posted on it
  probe_unsent,  // the probe could not be posted: the path is trusted
  probe_done,    // its probe completed
};
inline constexpr int kLifeEvents = 7;

// The state after event e in state s; an event that does not apply leaves
// the state as it is.
Life next(Life s, LifeEvent e);

// Not posted to; its completions are shunt's.
inline bool is_down(Life s) { return s >= Life::failed; }
// Out of the rotation until its probe completes.
inline bool on_probation(Life s) { return s == Life::checking || s == Life::probation; }
// Renewed and not yet seen to work: its probe's completion is its path_up,
// and a failure before that counts against the renewal's damping.
inline bool unproven(Life s) {
  return s == Life::probation || s == Life::failed_unproven || s == Life::stopped_unproven;
}
// Down by a planned move, not a failure.
inline bool planned(Life s) { return s == Life::stopped || s == Life::stopped_unproven; }
const char* life_name(Life s);

}  // namespace shunt::verbs::bundle
