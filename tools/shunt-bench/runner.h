// The measurement loop: for each size of the sweep, warm up, then time
// iterations (or run for a duration), check, and agree on the numbers.
#pragma once
#include <functional>

#include "tools/shunt-bench/report.h"

namespace bench {

class Bootstrap;
class Transport;
class Workload;

// Appends one row per size to `sum` and calls on_row after each (rank 0
// prints it). Throws BenchError on a transport failure.
void run_sweep(const Options& o, Bootstrap& bs, Transport& t, Workload& w, RunSummary& sum,
               const std::function<void(const SizeResult&)>& on_row);

std::vector<size_t> sweep_sizes(const Options& o);

}  // namespace bench
