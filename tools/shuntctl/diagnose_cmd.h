// `shuntctl diagnose`: why the job is slow, job-wide. This host's agent
// answers with its own view and where its probe peers' agents listen; each
// of them is asked over the peer channel (with SHUNT_JOB_KEY) for its own.
#pragma once
#include <ostream>
#include <string>

namespace shunt::ctl {

struct DiagnoseArgs {
  bool json = false;
  bool local = false;  // this host alone
  int timeout_ms = 2000;
  int watch_s = 0;   // > 0: ask once a second this long, a line each time
  std::string plot;  // with watch: draw each rank's step time and the blamed route's queue (FILE.svg or .png)
};
int diagnose_command(std::ostream& out, const DiagnoseArgs& a);

}  // namespace shunt::ctl
