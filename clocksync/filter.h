// Sample filters in front of the clock estimator.
//
// A one-way sample is d = rx - tx: receiver's clock minus sender's clock, so
// it holds the path delay plus the clock offset. Queueing only ever adds to d,
// so what carries the offset is the lower envelope of the samples.
//
// PairFilter: Huygens' coded probes. Two probes leave back to back; if they
// arrive with the spacing they left with (within a tolerance), neither met a
// queue the other did not, and the less delayed of the two is a clean
// sample. Pairs whose spacing changed saw queueing and are dropped.
// The tolerance is the configured one (10 us), or where the stamps
// themselves are noisier than that (a virtual machine's software stamps:
// tens to hundreds of microseconds on emulated CPUs), three times that
// noise, at most kMaxTolNs: the noise is the 25th percentile of the
// spacing errors of a block of 16 pairs, the lowest of the last 32 blocks
// (hundreds of pairs, a minute or more), so a congested spell, which
// spreads every pair, does not widen it.
//
// WindowMin: keeps the lowest sample per fixed window of local time, after
// removing the current drift estimate (without that, at 100 ppm the trend
// inside a 0.5 s window is 50 us and would pick the window's edge, not its
// least-queued sample). It bounds what the estimator stores.
#pragma once
#include <cstdint>
#include <optional>

namespace shunt::clocksync {

struct Sample {
  int64_t t = 0;  // send time on the local (estimating) host's clock, ns
  int64_t d = 0;  // one-way delay plus offset, ns
};

struct PairStamps {
  int64_t tx0 = 0, tx1 = 0;  // sender clock, kernel send stamps
  int64_t rx0 = 0, rx1 = 0;  // receiver clock, kernel receive stamps (0 = lost)
};

class PairFilter {
 public:
  static constexpr int64_t kMaxTolNs = 1'000'000;
  static constexpr int kBlock = 16, kBlocks = 32;
  explicit PairFilter(int64_t tolerance_ns) : floor_(tolerance_ns), tol_(tolerance_ns) {}
  // The pair's lesser delay if it kept its spacing; nullopt otherwise.
  std::optional<int64_t> accept(const PairStamps& p);
  uint64_t accepted() const { return accepted_; }
  uint64_t rejected() const { return rejected_; }
  int64_t tolerance() const { return tol_; }

 private:
  void learn(int64_t err);
  int64_t floor_, tol_;
  uint64_t accepted_ = 0, rejected_ = 0;
  int64_t block_[kBlock] = {};
  int in_block_ = 0;
  int64_t noise_[kBlocks] = {};  // each finished block's 25th percentile, a ring
  int next_ = 0, blocks_ = 0;     // where the next goes; how many are in the ring
};

class WindowMin {
 public:
  explicit WindowMin(int64_t window_ns) : window_(window_ns) {}
  // Adds a sample; returns the finished previous window's minimum when `s`
  // opens a new window. `slope` (ns per ns) is the drift estimate to remove.
  std::optional<Sample> add(const Sample& s, double slope);
  // Returns the open window's minimum if its window has ended by `now`.
  std::optional<Sample> flush(int64_t now);
  void reset() { have_ = false; }
  int64_t window_ns() const { return window_; }
  // When flush() will next return a window: the open window's end (INT64_MAX if none).
  int64_t ends_at() const { return have_ ? (win_id_ + 1) * window_ : INT64_MAX; }

 private:
  int64_t window_;
  bool have_ = false;
  int64_t win_id_ = 0;
  Sample best_;
  double best_key_ = 0;
};

}  // namespace shunt::clocksync
