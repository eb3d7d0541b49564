// Network effect: offsets around any loop of hosts sum to zero, so pairwise
// estimates that disagree around a loop carry information about each other's
// errors. Given every pairwise estimate this host knows (its own, and those its
// peers gossip), find one clock value per host that best explains them all:
// weighted least squares, weight 1 / bound^2, which distributes each loop's
// residual over its edges in proportion to their variances. The corrected
// bound of a host is the square root of its diagonal entry in the inverse of
// the weighted graph Laplacian (root removed), inflated when the residuals
// are larger than the bounds claim (chi-square per degree of freedom > 1).
#pragma once
#include <span>
#include <vector>

namespace shunt::clocksync {

struct Edge {
  int from = 0, to = 0;   // host indices
  double offset_ns = 0;   // clock[to] - clock[from]
  double bound_ns = 0;    // > 0
};

struct LoopSolution {
  std::vector<double> offset_ns;  // clock[i] - clock[root]
  std::vector<double> bound_ns;   // 0 for the root; infinity when unreachable
  double chi2 = 0;                // sum of squared normalized residuals
  int dof = 0;                    // edges - (reachable hosts - 1)
};

// n hosts, indices 0..n-1. Returns false when the system is singular beyond
// unreachable hosts (which get infinite bounds and are otherwise ignored).
bool solve_loops(int n, int root, std::span<const Edge> edges, LoopSolution* out);

}  // namespace shunt::clocksync
