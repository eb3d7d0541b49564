#include "clocksync/congestion.h"

#include <algorithm>
#include <cmath>

namespace shunt::clocksync {

void CongestionDetector::add(int64_t now, double owd_ns) {
  if (!std::isfinite(owd_ns)) return;
  last_[hlast_] = owd_ns;
  last_at_[hlast_] = now;
  hlast_ = (hlast_ + 1) % kLevel;
  if (nlast_ < kLevel) nlast_++;
  s_.samples++;
  const double level = median_level();
  // The base: the lowest level in the last kBuckets buckets. A level, not a
  // single sample, so one lucky probe does not set it.
  const int newest = (hb_ + kBuckets - 1) % kBuckets;
  if (nb_ == 0 || now - starts_[newest] >= bucket_ns_) {
    mins_[hb_] = level;
    starts_[hb_] = min_at_[hb_] = now;
    hb_ = (hb_ + 1) % kBuckets;
    if (nb_ < kBuckets) nb_++;
  } else if (level < mins_[newest]) {
    mins_[newest] = level;
    min_at_[newest] = now;
  }
  // Noise: the mean absolute deviation of single samples from the level,
  // i.e. the probes' own jitter. A queue building up moves the level, not
  // this. Learned from every sample during the warm-up (a path is presumed
  // clear when it starts), then only while clear and from deviations under
  // the threshold (the first samples of a step, before the median follows,
  // and lone spikes are not jitter).
  const double dev = std::fabs(owd_ns - level);
  if (s_.samples <= kWarmup)
    s_.noise_ns += (dev - s_.noise_ns) / s_.samples;
  else if (!s_.congested && dev < s_.threshold_ns)
    s_.noise_ns += kNoiseEwma * (dev - s_.noise_ns);
  s_.threshold_ns = std::max(kMinThresholdNs, kNoiseGain * s_.noise_ns);
  judge();
}

// The median of the newest kLevel samples (fewer at the start).
double CongestionDetector::median_level() {
  double v[kLevel];
  for (int i = 0; i < nlast_; i++) {  // insertion sort of at most five
    int j = i;
    for (; j > 0 && v[j - 1] > last_[i]; j--) v[j] = v[j - 1];
    v[j] = last_[i];
  }
  s_.level_ns = v[(nlast_ - 1) / 2];
  return s_.level_ns;
}

// Base, excess and verdict from the buckets and the level.
void CongestionDetector::judge() {
  if (s_.samples < kWarmup || nb_ == 0) return;  // level and noise settle first
  double base = mins_[(hb_ + kBuckets - 1) % kBuckets];
  for (int i = 0; i < nb_; i++) base = std::min(base, mins_[i]);
  s_.base_ns = base;
  s_.excess_ns = std::max(0.0, s_.level_ns - base);
  const bool was = s_.congested;
  if (!was && s_.excess_ns > s_.threshold_ns) s_.congested = true;
  if (was && s_.excess_ns < s_.threshold_ns / 2) s_.congested = false;
  if (was != s_.congested) s_.changes++;
}

void CongestionDetector::rebase(const std::function<double(int64_t)>& by) {
  for (int i = 0; i < nlast_; i++) last_[i] -= by(last_at_[i]);
  for (int i = 0; i < nb_; i++) mins_[i] -= by(min_at_[i]);
  if (nlast_) median_level();
  judge();
}

bool CongestionDetector::seed_from(int64_t now, const CongestionDetector& o) {
  if (o.s_.samples < kWarmup || s_.samples) return false;
  mins_[0] = o.s_.base_ns;
  starts_[0] = now;
  min_at_[0] = now;
  for (int i = 0; i < o.nb_; i++)  // when o measured it: a rebase needs the offset then
    if (o.mins_[i] == o.s_.base_ns) min_at_[0] = o.min_at_[i];
  nb_ = 1;
  hb_ = 1 % kBuckets;
  s_.noise_ns = o.s_.noise_ns;
  s_.threshold_ns = o.s_.threshold_ns;
  s_.samples = kWarmup;  // judged from its first sample on
  return true;
}

}  // namespace shunt::clocksync
