// The step rhythm of a job, found without help from the application: a
// training step is a stretch of compute (no work out on the QPs) and a
// stretch of communication, again and again. The busy sampler
// (interpose/verbs/busy.h) looks every 12-28 ms whether any of the process's
// QPs has work out; here those looks become a busy share per 20 ms bin over
// the last 20 s, and the lag at which that series best matches itself
// (its autocorrelation's first strong peak) is the step time. How well it
// matches (0..1) is how sure the estimate is. A job that communicates all
// the time, or at random, has no rhythm: none is reported.
#pragma once
#include <array>
#include <cstdint>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>

namespace shunt::telemetry {

// Bounds (ms) of the histogram of a QP's transfer times: how long each
// stretch of work out on it lasted, from the busy sampler's looks (so to
// about 20 ms), one step's exchange with that peer.
inline constexpr std::array<int64_t, 10> kTransferBucketsMs{10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000};

struct StepEstimate {
  double period_ms = 0;   // 0: no rhythm found
  double confidence = 0;  // the autocorrelation at that lag (0..1)
  double comm_share = 0;  // share of the span with work out
  double span_ms = 0;     // history the estimate is taken over
};

class StepRhythm {
 public:
  static constexpr int64_t kBinMs = 20;
  static constexpr size_t kBins = 1000;     // 20 s of history
  static constexpr size_t kMinBins = 150;   // 3 s before any estimate
  static constexpr std::array<size_t, 4> kSmoothBins{1, 5, 10, 20};  // the estimate's moving sums: 20-400 ms
  static constexpr double kMinConfidence = 0.4;
  // view() estimates again once the looks moved on this far: a quarter of
  // the history, so an estimate is at most that stale. Once a second, the
  // estimate was still the agent thread's largest item on a one-CPU
  // soft-RoCE guest (about 1% of the guest's CPU, perf in the guest).
  static constexpr int64_t kViewMs = 5000;

  // A look of the sampler at now_ms (monotonic): whether any QP had work
  // out. The time since the previous look counts as that (as the sampler
  // credits busy time).
  void look(int64_t now_ms, bool busy);
  StepEstimate estimate() const;
  // {"period_ms", "confidence", "comm_share"}, or null without a rhythm:
  // estimate() again only once the looks moved on kViewMs since the last.
  nlohmann::json view() const;

 private:
  mutable std::mutex mu_;       // the sampler's thread and a report at exit
  std::deque<uint8_t> bins_;    // busy ms per bin, the last one still filling
  int64_t first_bin_ = 0;       // bin number (now_ms / kBinMs) of bins_.front()
  int64_t last_ms_ = -1;
  mutable std::mutex view_mu_;  // view()'s estimate, taken outside mu_
  mutable StepEstimate view_;
  mutable int64_t view_at_ = -1;  // last_ms_ when view_ was estimated
};

// This process's (fed by the busy sampler). Never destroyed.
StepRhythm& process_rhythm();

}  // namespace shunt::telemetry
