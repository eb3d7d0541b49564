// shunt-audit's command line, as every part of it reads it.
#pragma once
#include <string>
#include <vector>

#include "tools/shunt-audit/verdict.h"

namespace audit {

// The exit status when the audit could not run (0, 1, 2: the verdict).
constexpr int kExitCannotRun = 3;

struct Options {
  std::vector<std::string> hosts, devices;
  int rank = -1, port = 7479;
  int bw_ms = 400, lat_rounds = 50, candidates = 6, discovery_ms = 200, join_s = 60,
      timeout_s = 900, retests = 16;
  int probe_s = 10, probe_port = 7480, probe_ms = 25;
  bool no_backend = false, verbose = false, quiet = false;
  std::string json_out, html_out;
  Thresholds t;
};

}  // namespace audit
