// The library constructor lives here (only in libshunt.so, not in the core
// archive that tools and unit tests link): resolve and parse config, nothing
// else; threads, devices and sockets start lazily on first use.
#include "core/runtime.h"
#include "interpose/stats_sources.h"
#include "telemetry/off_report.h"
#include "telemetry/stats_file.h"

namespace {
__attribute__((constructor)) void shunt_constructor() {
  shunt::ensure_init();
  shunt::register_stats_sources();  // the snapshot's verbs and socket sections
  shunt::telemetry::install_stats_file();
  shunt::telemetry::report_off_process();
}
}  // namespace
