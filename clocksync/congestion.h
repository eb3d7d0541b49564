// Queueing on one path, told from its one-way delays alone: the path's base
// delay (its lowest level over the last minutes), its present level (median
// of the newest samples), and a threshold measured from the path's own noise
// while at its base, never a constant: a quiet path with 20 us of jitter is
// congested at a smaller rise than a noisy one with 2 ms. Hysteresis: a path
// turns congested when its level exceeds the base by more than the threshold
// and clear again only when the excess falls under half of it.
#pragma once
#include <array>
#include <cstdint>
#include <functional>

namespace shunt::clocksync {

struct CongestionState {
  double base_ns = -1;       // -1 until enough samples (kWarmup); raw delays may be negative
  double level_ns = -1;      // median of the newest kLevel samples
  double noise_ns = 0;       // mean absolute deviation of samples from the level
  double threshold_ns = 0;   // excess over the base that makes the path congested
  double excess_ns = 0;      // level - base, >= 0
  bool congested = false;
  uint32_t changes = 0;      // congested <-> clear transitions since start
  uint32_t samples = 0;
};

class CongestionDetector {
 public:
  static constexpr int kLevel = 5;          // samples in the level's median
  static constexpr int kWarmup = 20;        // samples before any verdict
  static constexpr int kBuckets = 8;        // base memory: kBuckets x bucket_ns
  // threshold = kNoiseGain x noise: the base is the lowest level seen, so
  // even at rest a path's level sits above it by up to about three standard
  // deviations of its jitter, some 5 of the noise as measured here (samples
  // deviate less from a median of five that includes them) ...
  static constexpr double kNoiseGain = 6;
  static constexpr double kNoiseEwma = 0.05;
  static constexpr double kMinThresholdNs = 10'000;  // ... but never under 10 us

  explicit CongestionDetector(int64_t bucket_ns = 15'000'000'000) : bucket_ns_(bucket_ns) {}
  void add(int64_t now, double owd_ns);
  const CongestionState& state() const { return s_; }
  // Starts from another detector's base and noise, warm-up done: for a new
  // path between the same two hosts (another source port on the same rail)
  // whose probes start while the job already loads it. Its own lower levels
  // still lower the base; nothing if `o` has no verdict yet (or this one
  // has samples). Returns whether it took the seed.
  bool seed_from(int64_t now, const CongestionDetector& o);
  // Re-expresses every delay it holds as the delay less by(t), t when that
  // delay was measured: raw delays (the peer's clock offset in them) once
  // the clock model exists, with the offset it gives at each one's time.
  // Base, level and verdict carry on; nothing is learned anew.
  void rebase(const std::function<double(int64_t)>& by);

 private:
  int64_t bucket_ns_;
  double median_level();
  void judge();
  std::array<double, kLevel> last_{};
  std::array<int64_t, kLevel> last_at_{};
  int nlast_ = 0, hlast_ = 0;
  // Minimum of the level per time bucket (the newest at head_).
  std::array<double, kBuckets> mins_{};
  std::array<int64_t, kBuckets> starts_{};
  std::array<int64_t, kBuckets> min_at_{};  // when each bucket's minimum was measured
  int nb_ = 0, hb_ = 0;
  CongestionState s_;
};

}  // namespace shunt::clocksync
