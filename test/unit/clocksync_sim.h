// Synthetic two-host probe exchange for clocksync unit tests: true offset
// theta(t) = offset + drift * t + wander * sin(2 pi t / period), propagation
// delay D (+/- a fixed asymmetry), queueing noise that is exponential, bursty
// (on/off congestion in one direction) or both.
#pragma once
#include <cmath>
#include <cstdint>
#include <random>

namespace shunt::clocksync::sim {

struct Scenario {
  double offset_ns = 1.5e6;
  double drift = 80e-6;          // ns per ns
  double wander_ns = 0;
  double wander_period_s = 60;
  double delay_ns = 20'000;
  double asym_ns = 0;            // forward delay +asym, reverse -asym
  double exp_mean_ns = 3'000;    // queueing in both directions
  double burst_mean_ns = 0;      // extra queueing while a burst is on (forward only)
  double burst_on_s = 1, burst_off_s = 1;
  int64_t interval_ns = 100'000'000;
  int64_t t_start = int64_t(1.7e18);
};

class Link {
 public:
  Link(const Scenario& s, uint64_t seed) : s_(s), rng_(seed) {}
  double theta(int64_t t) const {
    double x = double(t - s_.t_start);
    return s_.offset_ns + s_.drift * x +
           s_.wander_ns * std::sin(2 * M_PI * x * 1e-9 / s_.wander_period_s);
  }
  double queue(bool forward, int64_t t) {
    double q = s_.exp_mean_ns > 0 ? std::exponential_distribution<>(1 / s_.exp_mean_ns)(rng_) : 0;
    if (forward && s_.burst_mean_ns > 0) {
      double x = std::fmod(double(t - s_.t_start) * 1e-9, s_.burst_on_s + s_.burst_off_s);
      if (x < s_.burst_on_s) q += std::exponential_distribution<>(1 / s_.burst_mean_ns)(rng_);
    }
    return q;
  }
  // One-way sample d = rx - tx for a probe sent at local (estimator) time t.
  int64_t forward(int64_t t) {
    return int64_t(std::llround(s_.delay_ns + s_.asym_ns + theta(t) + queue(true, t)));
  }
  int64_t reverse(int64_t t) {
    return int64_t(std::llround(s_.delay_ns - s_.asym_ns - theta(t) + queue(false, t)));
  }
  std::mt19937_64& rng() { return rng_; }
  const Scenario& scenario() const { return s_; }

 private:
  Scenario s_;
  std::mt19937_64 rng_;
};

}  // namespace shunt::clocksync::sim
