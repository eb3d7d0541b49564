#include "telemetry/stats_file.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>

#include "core/event_log.h"
#include "core/identity.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/runtime.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;

// The registered sections: a constant-initialized table, so that a
// registration or a snapshot before this library's initializers ran (the
// agent's, started by another library's constructor) finds it ready.
// Filled without a lock (a source takes the first empty slot by
// compare-and-swap; slots are never emptied) and read without one.
constexpr int kMaxStatsSources = 8;
std::atomic<StatsSource> g_sources[kMaxStatsSources];

void write_at_exit() {
  const Config& c = config();
  write_stats_file(c.str(Param::stats_file));
}
}  // namespace

void register_stats_source(StatsSource source) {
  for (auto& slot : g_sources) {
    StatsSource seen = nullptr;
    if (slot.compare_exchange_strong(seen, source, std::memory_order_acq_rel) || seen == source) return;
  }
  log::once(LogLevel::warn, "stats-sources", "more than 8 stats sources: the later ones are left out of snapshots");
}

json stats_json(Detail detail) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  // The parts' sections (the verbs part's, the socket part's), then the
  // process's own fields.
  json snap = json::object();
  for (auto& slot : g_sources)
    if (StatsSource source = slot.load(std::memory_order_acquire)) source(snap, detail);
  const char* modes[] = {"off", "observe", "active"};
  snap.update(json{{"version", SHUNT_VERSION},
                   {"host", valid_utf8(host)},
                   {"pid", getpid()},
                   {"mode", modes[static_cast<int>(current_mode())]},
                   {"job", job_id()},
                   {"rank", rank()},
                   {"events", event_counts()},
                   {"events_dropped", events_dropped()},
                   {"event_log", valid_utf8(event_log_path())}});
  return snap;
}

bool write_stats_file(const std::string& pattern) {
  if (pattern.empty()) return false;
  std::string path = expand_pattern(pattern, getpid());
  if (is_forked_child() && pattern.find("%p") == std::string::npos) path += "." + std::to_string(getpid());
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (!out) {
      log::error("SHUNT_STATS_FILE: cannot write {}", tmp);
      return false;
    }
    out << to_text(stats_json(), 2) << "\n";
    if (!out.good()) return false;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    log::error("SHUNT_STATS_FILE: cannot rename {} to {}", tmp, path);
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

void install_stats_file() {
  if (!config().str(Param::stats_file).empty() && current_mode() != Mode::off) at_exit(write_at_exit);
}

}  // namespace shunt::telemetry
