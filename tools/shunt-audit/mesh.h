// The probe mesh's part of the audit, free of sockets: what every host's
// probe engine saw of its paths to every other host (loss and one-way delay
// per rail, and per spine through the source ports path discovery found)
// and of their clocks, judged against the fleet. Lossy paths are
// attributed, as slow measurements are, to the link they share.
#pragma once
#include <string>
#include <vector>

#include "tools/shunt-audit/verdict.h"

namespace audit {

// One probed path: src's probes to dst on a rail, from the probe port (the
// rail path: router "" and sport 0) or from a source port that path
// discovery found going through `router`.
struct ProbedPath {
  int src = 0, dst = 0, rail = 0;
  std::string router;
  int sport = 0;
  bool heard = false;  // dst acknowledged at least one of src's probes
  double loss = 0;     // of src's probes, the share dst did not get (the engine's window)
  double owd_us = -1;  // src -> dst one-way delay, median; -1: no clock estimate yet
};

// A host's clock as the driver's probe engine estimates it.
struct HostClock {
  bool valid = false;    // an estimate exists (the driver itself: always)
  double offset_ms = 0;  // its clock minus the driver's
  double bound_us =
      0;  // how far that estimate can be off; -1: not known (a rough, NTP-style estimate)
};

struct Mesh {
  bool ran = false;
  std::string error;   // not empty: the mesh could not run (why)
  double seconds = 0;  // how long the hosts probed
  std::vector<ProbedPath> paths;
  std::vector<HostClock> clocks;  // per host (index = host), the driver's view
};

struct MeshJudged {
  std::vector<Status> loss, owd;  // per path, after attribution
  std::vector<std::string> note;  // per path: why it was excused
  std::vector<LinkFault> links;   // lossy links (LinkFault::loss set)
  std::vector<Status> clock;      // per host
  std::vector<std::string> clock_detail;
};

MeshJudged judge_mesh(const Mesh& m, const Thresholds& t, const std::vector<std::string>& names);

// The mesh's nodes in the tree: per rail, its lossy links (appended to the
// rail's "host links" / "leaf-spine links" nodes) and a "probed paths"
// node; and a "clocks" node under `backend`.
void add_mesh_nodes(Node& backend, const Mesh& m, const MeshJudged& j,
                    const std::vector<std::string>& names,
                    const std::vector<nlohmann::json>& facts);

}  // namespace audit
