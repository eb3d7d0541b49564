// Loop correction on synthetic meshes with known clocks.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "clocksync/loop.h"

namespace shunt::clocksync {
namespace {

TEST(ClocksyncLoop, TriangleResidualIsSharedByVariance) {
  // True clocks 0, 100, 300; edge 0->2 is off by +60 with all bounds equal:
  // least squares spreads the 60 ns loop residual evenly, 20 ns per edge.
  Edge e[] = {{0, 1, 100, 10}, {1, 2, 200, 10}, {0, 2, 360, 10}};
  LoopSolution s;
  ASSERT_TRUE(solve_loops(3, 0, e, &s));
  EXPECT_NEAR(s.offset_ns[1], 120, 1e-6);
  EXPECT_NEAR(s.offset_ns[2], 340, 1e-6);
  EXPECT_EQ(s.dof, 1);
}

TEST(ClocksyncLoop, TightEdgesWinOverLooseOnes) {
  Edge e[] = {{0, 1, 100, 1}, {1, 2, 200, 1}, {0, 2, 400, 100}};
  LoopSolution s;
  ASSERT_TRUE(solve_loops(3, 0, e, &s));
  EXPECT_NEAR(s.offset_ns[2], 300, 1);
}

TEST(ClocksyncLoop, FullMeshShrinksErrorAndBound) {
  // 6 hosts, every pair measured with independent noise of sigma = bound / 3.
  const int n = 6;
  std::mt19937_64 rng(11);
  std::normal_distribution<> noise(0, 100);
  double raw2 = 0, cor2 = 0;
  int trials = 200, within = 0;
  for (int t = 0; t < trials; t++) {
    std::vector<double> clk(n);
    for (auto& c : clk) c = std::uniform_real_distribution<>(-1e6, 1e6)(rng);
    std::vector<Edge> edges;
    for (int i = 0; i < n; i++)
      for (int j = i + 1; j < n; j++) edges.push_back({i, j, clk[j] - clk[i] + noise(rng), 300});
    LoopSolution s;
    ASSERT_TRUE(solve_loops(n, 0, edges, &s));
    for (int j = 1; j < n; j++) {
      double raw = edges[j - 1].offset_ns - (clk[j] - clk[0]);
      double cor = s.offset_ns[j] - (clk[j] - clk[0]);
      raw2 += raw * raw;
      cor2 += cor * cor;
      within += std::fabs(cor) <= s.bound_ns[j];
      EXPECT_LT(s.bound_ns[j], 300);
    }
  }
  // Direct edge plus 4 two-hop routes: variance falls to about 1/3.
  EXPECT_LT(cor2, 0.5 * raw2);
  EXPECT_GE(within, trials * (n - 1) * 99 / 100);
}

TEST(ClocksyncLoop, InconsistentLoopInflatesBounds) {
  Edge e[] = {{0, 1, 0, 10}, {1, 2, 0, 10}, {0, 2, 1000, 10}};
  LoopSolution s;
  ASSERT_TRUE(solve_loops(3, 0, e, &s));
  EXPECT_GT(s.bound_ns[2], 100);
}

TEST(ClocksyncLoop, UnreachableHostGetsInfiniteBound) {
  Edge e[] = {{0, 1, 5, 1}};
  LoopSolution s;
  ASSERT_TRUE(solve_loops(3, 0, e, &s));
  EXPECT_NEAR(s.offset_ns[1], 5, 1e-9);
  EXPECT_TRUE(std::isinf(s.bound_ns[2]));
}

}  // namespace
}  // namespace shunt::clocksync
