// Events: what changed and when, as JSON lines in SHUNT_EVENT_LOG. Any part
// calls telemetry::event() from any thread, including the hot path: the
// call formats into a slot of a lock-free ring (no lock, no allocation) and
// the process's event writer thread appends it to the log. The well-known
// types are also counted, so their totals reach the metrics even when no
// log is written.
//
//   telemetry::event("bundle_fallback", {{"reason", "peer has one rail"}, {"qpn", qpn}});
//
// The first event of a process starts its writer thread (when a log is
// configured), so a hot-path caller finds it running after its own setup
// event. Each line has the wall time (CLOCK_REALTIME, the host's
// synchronized clock: "time" and "wall_ns") and CLOCK_MONOTONIC ("mono_ns").
#pragma once
#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

namespace shunt::telemetry {

struct Field {
  enum class Kind { str, i64, f64, boolean };
  const char* key;
  Kind kind;
  const char* s = nullptr;
  int64_t i = 0;
  double d = 0;
  Field(const char* k, const char* v) : key(k), kind(Kind::str), s(v) {}
  Field(const char* k, const std::string& v) : key(k), kind(Kind::str), s(v.c_str()) {}
  Field(const char* k, bool v) : key(k), kind(Kind::boolean), i(v) {}
  Field(const char* k, int v) : key(k), kind(Kind::i64), i(v) {}
  Field(const char* k, long v) : key(k), kind(Kind::i64), i(v) {}
  Field(const char* k, long long v) : key(k), kind(Kind::i64), i(v) {}
  Field(const char* k, unsigned v) : key(k), kind(Kind::i64), i(v) {}
  Field(const char* k, unsigned long v) : key(k), kind(Kind::i64), i(static_cast<int64_t>(v)) {}
  Field(const char* k, unsigned long long v) : key(k), kind(Kind::i64), i(static_cast<int64_t>(v)) {}
  Field(const char* k, double v) : key(k), kind(Kind::f64), d(v) {}
};

// The types every dashboard knows (counted per process as
// shunt_events_total{type} and, for failover/failback/replay, as their own
// counters). Other types are logged and counted as "other".
#define SHUNT_EVENT_TYPES(X) \
  X(path_up) X(path_down) X(bundle_setup) X(bundle_fallback) X(failover) X(failback) X(replay) X(config) X(other)

// Records one event. Never blocks; an event that finds the ring full is
// dropped and counted (events_dropped()). Strings are copied before return;
// a line longer than about 700 bytes has its last fields cut.
void event(const char* type, std::initializer_list<Field> fields = {});

uint64_t event_count(const char* type);
nlohmann::json event_counts();  // {"path_up": n, ...} every known type
uint64_t events_dropped();

// The expanded SHUNT_EVENT_LOG of this process ("" when none).
std::string event_log_path();
// Starts the writer now (the host agent does at start) and logs the config
// in force as the first event. Idempotent; a no-op without a log.
void start_event_log();
// Writes every event recorded so far (tests, exit).
void flush_event_log();

// Formats one event's fields as the body of a JSON object (`"k":v,...`,
// no braces) into buf; returns the length. Exposed for the unit tests.
size_t format_fields(char* buf, size_t cap, std::initializer_list<Field> fields);

}  // namespace shunt::telemetry
