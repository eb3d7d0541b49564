#include "telemetry/rhythm.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace shunt::telemetry {

void StepRhythm::look(int64_t now_ms, bool busy) {
  std::lock_guard lk(mu_);
  const int64_t now_bin = now_ms / kBinMs;
  // The first look, or one after so long a gap that no bin before it
  // stays: the history starts here.
  if (last_ms_ < 0 || now_ms - last_ms_ > static_cast<int64_t>(kBins) * kBinMs) {
    bins_.assign(1, 0);
    first_bin_ = now_bin;
    last_ms_ = now_ms;
    return;
  }
  if (now_ms <= last_ms_) return;
  for (int64_t t = last_ms_; t < now_ms;) {
    const int64_t b = t / kBinMs, end = std::min(now_ms, (b + 1) * kBinMs);
    while (first_bin_ + static_cast<int64_t>(bins_.size()) <= b) bins_.push_back(0);
    if (busy) bins_[static_cast<size_t>(b - first_bin_)] += static_cast<uint8_t>(end - t);
    t = end;
  }
  while (first_bin_ + static_cast<int64_t>(bins_.size()) <= now_bin) bins_.push_back(0);
  while (bins_.size() > kBins + 1) {
    bins_.pop_front();
    first_bin_++;
  }
  last_ms_ = now_ms;
}

namespace {

// The step in raw (busy ms per bin) smoothed over w bins, as
// {period in bins, confidence}; {0, 0} without one.
std::pair<double, double> periodicity(const std::vector<int32_t>& raw, size_t w) {
  if (raw.size() < 2 * w) return {0, 0};
  // A moving sum over w bins: a step's communication whose start or length
  // varies from step to step (a late look of a starved sampler credits its
  // whole gap at once) still overlaps its neighbours' at the step's lag.
  const size_t n = raw.size() - w + 1;
  std::vector<int32_t> x(n);
  int32_t run = 0;
  for (size_t i = 0; i < w; i++) run += raw[i];
  for (size_t i = 0; i < n; i++) {
    x[i] = run;
    if (i + w < raw.size()) run += raw[i + w] - raw[i];
  }
  // prefix[j]: the sum of the first j smoothed bins
  std::vector<int64_t> prefix(n + 1, 0);
  int64_t squares = 0;
  for (size_t i = 0; i < n; i++) {
    prefix[i + 1] = prefix[i] + x[i];
    squares += int64_t(x[i]) * x[i];
  }
  const double dn = static_cast<double>(n), mean = static_cast<double>(prefix[n]) / dn;
  const double var = static_cast<double>(squares) / dn - mean * mean;
  // Busy all the time, or idle: nothing repeats. (A step must have both.)
  const double unit = static_cast<double>(StepRhythm::kBinMs) * static_cast<double>(w);  // w bins wholly busy
  if (var < 0.01 * unit * unit) return {0, 0};
  // The autocorrelation over lags up to half the span (two steps at least),
  // each lag's products averaged over the pairs it has. The products are
  // summed in integers and the mean taken out after:
  //   sum (x[i] - m)(x[i+k] - m) = sum x[i]x[i+k] - m (head + tail) + (n-k) m^2
  // with head and tail the sums of the two overlapping stretches. In
  // doubles, one pass at each of three views a second cost a one-CPU
  // soft-RoCE guest (emulated floating point) 4% of the job's CPU.
  const size_t max_lag = n / 2;
  std::vector<double> r(max_lag + 2, 0.0);
  for (size_t k = 1; k <= max_lag + 1 && k < n; k++) {
    int64_t c = 0;
    const int32_t* a = x.data();
    const int32_t* b = x.data() + k;
    for (size_t i = 0, m = n - k; i < m; i++) c += int64_t(a[i]) * b[i];
    const double head = static_cast<double>(prefix[n - k]), tail = static_cast<double>(prefix[n] - prefix[k]);
    const double pairs = static_cast<double>(n - k);
    r[k] = (static_cast<double>(c) - mean * (head + tail) + pairs * mean * mean) / pairs / var;
  }
  // A periodic series (its mean removed) falls below zero within its
  // period: peaks before that are the series' own smoothness. The step is
  // the first peak nearly as high as the highest (the others are its
  // multiples).
  size_t from = 1;
  while (from <= max_lag && r[from] >= 0) from++;
  double best = 0;
  std::vector<size_t> peaks;
  for (size_t k = std::max<size_t>(from, 2); k <= max_lag; k++)
    if (r[k] > 0 && r[k] >= r[k - 1] && r[k] >= r[k + 1]) {
      peaks.push_back(k);
      best = std::max(best, r[k]);
    }
  if (best <= 0) return {0, 0};
  size_t k = 0;
  for (size_t p : peaks)
    if (r[p] >= 0.85 * best) {
      k = p;
      break;
    }
  // Between bins: the vertex of the parabola through the peak and its two
  // neighbours.
  double shift = 0;
  const double den = r[k - 1] - 2 * r[k] + r[k + 1];
  if (den < 0) shift = std::clamp(0.5 * (r[k - 1] - r[k + 1]) / den, -0.5, 0.5);
  return {static_cast<double>(k) + shift, std::min(1.0, r[k])};
}

}  // namespace

StepEstimate StepRhythm::estimate() const {
  std::vector<int32_t> x;  // busy ms per whole bin (the last one is still filling)
  {
    std::lock_guard lk(mu_);
    if (bins_.size() < 2) return {};
    x.assign(bins_.begin(), bins_.end() - 1);
  }
  StepEstimate e;
  e.span_ms = static_cast<double>(x.size() * kBinMs);
  int64_t busy = 0;
  for (int32_t v : x) busy += v;
  e.comm_share = static_cast<double>(busy) / static_cast<double>(x.size()) / kBinMs;
  if (x.size() < kMinBins) return e;
  // As it is, and smoothed over 100, 200 and 400 ms: the one whose step
  // stands out most, of those no wider than a quarter of the step they
  // find (wider ones blur the step itself away).
  for (size_t w : kSmoothBins) {
    const auto [period, sure] = periodicity(x, w);
    if (period <= 0 || static_cast<double>(4 * w) > period + 0.5) continue;
    if (sure > e.confidence) {
      e.confidence = sure;
      e.period_ms = period * kBinMs;
    }
  }
  if (e.confidence < kMinConfidence) e.period_ms = e.confidence = 0;
  return e;
}

nlohmann::json StepRhythm::view() const {
  StepEstimate e;
  {
    // One estimate serves every view within kViewMs of looks: a report, the
    // diagnosis and its host view each ask about once a second.
    std::lock_guard lk(view_mu_);
    int64_t at;
    {
      std::lock_guard l(mu_);
      at = last_ms_;
    }
    if (view_at_ < 0 || at < view_at_ || at - view_at_ >= kViewMs) {
      view_ = estimate();
      view_at_ = at;
    }
    e = view_;
  }
  if (e.period_ms <= 0) return nullptr;
  auto round_to = [](double v, double q) { return std::round(v / q) * q; };
  return {{"period_ms", round_to(e.period_ms, 0.1)},
          {"confidence", round_to(e.confidence, 0.01)},
          {"comm_share", round_to(e.comm_share, 0.01)}};
}

StepRhythm& process_rhythm() {
  static auto* r = new StepRhythm;  // the agent thread may use it while exit() runs
  return *r;
}

}  // namespace shunt::telemetry
