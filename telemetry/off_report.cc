#include "telemetry/off_report.h"

#include <unistd.h>

#include "core/identity.h"
#include "core/json_text.h"
#include "core/mono.h"
#include "core/runtime.h"
#include "peer/control.h"

namespace shunt::telemetry {

namespace {
int g_pid = 0;
int64_t g_born_ns = 0;

void send(bool final) {
  ReentryGuard g;
  std::string dir = peer::agent_dir(config().str(Param::run_dir));
  std::string err;
  // The reason and the labels may hold any bytes; JSON wants UTF-8.
  auto snap = nlohmann::json::parse(
      to_text(off_snapshot(off_reason())));
  // Short: an agent answers a report at once, and this one delays the
  // application's start or exit by however long it waits.
  peer::request(dir + "/agent.sock",
                {{"cmd", "report"},
                 {"pid", g_pid},
                 {"final", final},
                 {"seq", final ? 2 : 1},
                 {"born", g_born_ns},
                 {"snapshot", snap}},
                300, &err);
}
}  // namespace

nlohmann::json off_snapshot(const std::string& reason) {
  return {{"version", SHUNT_VERSION}, {"host", host_name()}, {"pid", getpid()}, {"mode", "off"},
          {"off_reason", reason},     {"job", job_id()},     {"rank", rank()}};
}

void report_off_process() {
  if (off_reason().empty() || config().num(Param::agent) != 0) return;
  g_pid = getpid();
  g_born_ns = mono_ns();
  try {
    send(false);
    at_exit([] {
      if (getpid() != g_pid) return;  // a forked child: the report is its parent's
      try {
        send(true);
      } catch (...) {
      }
    });
  } catch (...) {
  }
}

}  // namespace shunt::telemetry
