// shuntctl's live views of a running job, all read from the host agent's
// "telemetry" command (no privilege needed: the control socket is open to
// every user, event logs are world-readable).
#pragma once
#include <ostream>
#include <string>

namespace shunt::ctl {

struct LiveOptions {
  bool json = false;
  int interval_ms = 1000;  // between the two samples a rate is taken from
  int iterations = 0;      // top: 0 = until interrupted
  bool follow = false;     // events: keep printing new ones
  std::string file;        // events: read this log instead of asking the agent
};

// A rate as text: "0 B/s", "12.3 kB/s", ... "1.2 GB/s".
std::string rate(double bytes_per_s);

int paths_command(std::ostream& out, const LiveOptions& o);
int events_command(std::ostream& out, const LiveOptions& o);
int top_command(std::ostream& out, const LiveOptions& o);

}  // namespace shunt::ctl
