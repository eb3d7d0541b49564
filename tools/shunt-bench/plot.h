// Draws one or more timelines with gnuplot (PNG or SVG by file extension),
// with vertical lines at the marked times (fault injected, link restored...).
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "tools/shunt-bench/options.h"

namespace bench {

struct Series {
  std::string label;
  std::vector<std::pair<double, double>> points;  // (seconds since start, GB/s)
};

// Marks with absolute times are placed relative to start_wall.
void plot_timelines(const std::vector<Series>& series, const std::vector<Mark>& marks, double start_wall,
                    const std::string& title, const std::string& out_file);

// "T:label" (seconds since the timeline start) or "@EPOCH:label".
Mark parse_mark(const std::string& s);
// One mark per non-empty, non-# line, same syntax.
std::vector<Mark> read_marks_file(const std::string& path);

}  // namespace bench
