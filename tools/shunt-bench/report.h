// What rank 0 prints and saves: the nccl-tests style table, its footer and
// the same numbers as JSON.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "tools/shunt-bench/options.h"

namespace bench {

class Timeline;
class Workload;

struct SizeResult {
  size_t bytes = 0;
  size_t count = 0;
  double time_us = 0;  // per iteration, slowest rank's average
  double algbw = 0;    // GB/s, GB = 1e9
  double busbw = 0;
  uint64_t wrong = 0;  // summed over ranks; -1 column when not checked
  uint64_t iters = 0;
};

struct RunSummary {
  std::vector<SizeResult> rows;
  uint64_t errors = 0;  // transport errors seen at this rank
  std::string error;    // the first one, empty when none
  std::vector<std::string> ranks;  // one description per rank
};

void print_header(FILE* out, const Options& o, const Workload& w, int world, const std::vector<std::string>& ranks);
void print_row(FILE* out, const Options& o, const Workload& w, const SizeResult& r);
void print_footer(FILE* out, const Options& o, const RunSummary& s);
double avg_busbw(const RunSummary& s);
uint64_t total_wrong(const RunSummary& s);

void write_json(const std::string& path, const Options& o, const Workload& w, int world, const RunSummary& s,
                const Timeline* tl, const std::vector<Mark>& marks, const std::string& label);

}  // namespace bench
