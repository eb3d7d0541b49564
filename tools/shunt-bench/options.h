// Everything a run of shunt-bench is told on its command line, in one place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace bench {

enum class TransportKind { tcp, verbs };
enum class Verb { write_imm, send };
enum class Pattern { alltoall, allreduce, sendrecv };

// A point in time to mark on the timeline plot: seconds since the start of
// the timeline, or (absolute) seconds since the epoch.
struct Mark {
  double t = 0;
  bool absolute = false;
  std::string label;
};

struct Options {
  // world
  int rank = -1;
  int world = -1;
  std::string bootstrap;  // HOST:PORT; rank 0 listens there
  double connect_timeout_s = 30;

  // transport
  TransportKind transport = TransportKind::tcp;
  Verb verb = Verb::write_imm;
  std::string addr;  // tcp: address this rank listens on (default: the bootstrap route)
  std::string device;  // verbs: device name (-d), first one when empty
  int ib_port = 1;     // verbs: port (-i)
  int gid_index = -1;  // verbs: GID index (-x), -1 = first RoCEv2 IPv4 GID
  size_t seg_bytes = 1 << 20;  // verbs: largest single WR
  int qp_timeout = 14;         // verbs: local ACK timeout exponent
  int retry_cnt = 7;           // verbs: transport retries

  // workload
  Pattern pattern = Pattern::alltoall;
  size_t min_bytes = 1 << 20;
  size_t max_bytes = 64 << 20;
  double factor = 2;
  int iters = 20;
  int warmup = 5;
  bool check = false;
  double duration_s = 0;      // > 0: each size runs this long instead of -n iterations
  double stall_timeout_s = 60;  // no progress for this long is an error
  int compute_ms = 0;  // a training step's compute: the network idle this long after each iteration

  // output
  std::string json_file;
  int timeline_ms = 0;
  std::string timeline_file;  // also write the rows here (TSV)
  std::string plot_file;
  std::vector<Mark> marks;
  std::string marks_file;  // "SECONDS LABEL" lines, read when plotting
  bool quiet = false;
  std::string label;  // names this run in JSON and plots
  std::string ready_file;  // created when measuring starts (for fault injectors)
  std::string stop_file;   // duration mode: its appearance on rank 0's host ends the size early

  // test only: flip one byte of the data rank 0 sends, so the check must fail
  bool corrupt = false;
};

// Parses a byte count with an optional K/M/G suffix (powers of 1024).
bool parse_bytes(const std::string& s, size_t* out);
const char* to_string(Pattern p);
const char* to_string(TransportKind t);
const char* to_string(Verb v);

}  // namespace bench
