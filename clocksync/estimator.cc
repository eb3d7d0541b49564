#include "clocksync/estimator.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace shunt::clocksync {

namespace {
constexpr double kMaxSlope = 1e-3;  // 1000 ppm: beyond any crystal pair

double gap(const std::deque<std::pair<double, double>>& up,
           const std::deque<std::pair<double, double>>& lo, double b, double* lo_max) {
  double umin = std::numeric_limits<double>::infinity();
  double lmax = -std::numeric_limits<double>::infinity();
  for (auto& [t, v] : up) umin = std::min(umin, v - b * t);
  for (auto& [t, v] : lo) lmax = std::max(lmax, v - b * t);
  if (lo_max) *lo_max = lmax;
  return umin - lmax;
}
}  // namespace

bool fit_envelope(const std::deque<std::pair<double, double>>& upper,
                  const std::deque<std::pair<double, double>>& lower, EnvelopeFit* out) {
  if (upper.empty() || lower.empty()) return false;
  // gap(b) is concave (a min of lines minus a max of lines): ternary search.
  double lo = -kMaxSlope, hi = kMaxSlope;
  for (int i = 0; i < 120 && hi - lo > 1e-15; i++) {
    double m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
    if (gap(upper, lower, m1, nullptr) < gap(upper, lower, m2, nullptr))
      lo = m1;
    else
      hi = m2;
  }
  double b = (lo + hi) / 2;
  // A slope pinned at the search edge means the points do not determine it.
  if (std::fabs(b) > kMaxSlope * 0.999) return false;
  double lmax;
  double g = gap(upper, lower, b, &lmax);
  out->b = b;
  out->half_gap = g / 2;
  out->a = lmax + g / 2;  // the middle of the gap at t = 0
  return true;
}

OffsetEstimator::OffsetEstimator(const EstimatorParams& p)
    : p_(p), fwin_(p.window_ns), rwin_(p.window_ns) {}

void OffsetEstimator::reset() {
  fwin_.reset();
  rwin_.reset();
  fwd_.clear();
  rev_.clear();
  model_ = ClockModel{};
  outliers_ = 0;
  last_checked_ = std::numeric_limits<int64_t>::min();
}

void OffsetEstimator::push(std::deque<Point>& q, const Sample& s) {
  q.push_back({s.t, s.d});
  int64_t horizon = s.t - int64_t(p_.max_windows) * p_.window_ns;
  while (!q.empty() && (q.front().t < horizon || int(q.size()) > p_.max_windows)) q.pop_front();
  dirty_ = true;
}

void OffsetEstimator::add_forward(const Sample& s) {
  if (auto w = fwin_.add(s, model_.drift)) push(fwd_, *w);
}

void OffsetEstimator::add_reverse(const Sample& s) {
  if (auto w = rwin_.add(s, -model_.drift)) push(rev_, *w);
}

void OffsetEstimator::tick(int64_t now) {
  if (auto w = fwin_.flush(now)) push(fwd_, *w);
  if (auto w = rwin_.flush(now)) push(rev_, *w);
  if (!dirty_) return;
  dirty_ = false;
  if (model_.valid && holding_for_step()) return;
  refit();
}

// Per-window estimates theta_k - a for windows holding both directions,
// given the line (a, b) in coordinates relative to t0 / shift c.
void OffsetEstimator::window_residuals(int64_t t0, double a, double b, double c,
                                       std::vector<WindowResidual>* out) const {
  out->clear();
  size_t j = 0;
  for (const Point& f : fwd_) {
    int64_t id = f.t / p_.window_ns;
    while (j < rev_.size() && rev_[j].t / p_.window_ns < id) j++;
    if (j == rev_.size()) break;
    if (rev_[j].t / p_.window_ns != id) continue;
    const Point& r = rev_[j];
    double th = ((double(f.d) - c - b * double(f.t - t0)) - (double(r.d) + c + b * double(r.t - t0))) / 2;
    out->push_back({std::min(f.t, r.t), (f.t + r.t) / 2, th + c - a});
  }
}

bool OffsetEstimator::holding_for_step() {
  // The newest window with both directions, checked against the current model.
  if (fwd_.empty() || rev_.empty()) return false;
  int64_t id = std::min(fwd_.back().t, rev_.back().t) / p_.window_ns;
  if (id <= last_checked_) return false;
  const Point* f = nullptr;
  const Point* r = nullptr;
  for (auto it = fwd_.rbegin(); it != fwd_.rend() && !f; ++it)
    if (it->t / p_.window_ns == id) f = &*it;
  for (auto it = rev_.rbegin(); it != rev_.rend() && !r; ++it)
    if (it->t / p_.window_ns == id) r = &*it;
  if (!f || !r) return false;
  last_checked_ = id;
  // Queueing only ever raises a window's minimum; a minimum well *below* the
  // fitted envelope in either direction can only be a clock step.
  double D = model_.half_rtt_ns;
  double below_f = (D + model_.offset_at(f->t)) - double(f->d);
  double below_r = (D - model_.offset_at(r->t)) - double(r->d);
  double limit = std::max(p_.step_min_ns, 8 * rms_);
  if (std::max(below_f, below_r) <= limit) {
    outliers_ = 0;
    return false;
  }
  if (outliers_++ == 0) first_outlier_t_ = std::min(f->t, r->t);
  if (outliers_ < p_.step_windows) return true;  // hold the model until it is clear
  auto drop = [&](std::deque<Point>& q) {
    while (!q.empty() && q.front().t < first_outlier_t_) q.pop_front();
  };
  drop(fwd_);
  drop(rev_);
  outliers_ = 0;
  steps_++;
  model_.valid = false;
  return false;
}

void OffsetEstimator::refit() {
  if (fwd_.empty() || rev_.empty()) return;
  int64_t t0 = std::max(fwd_.back().t, rev_.back().t);
  double c = (double(fwd_.back().d) - double(rev_.back().d)) / 2;  // rough theta keeps doubles small
  std::deque<std::pair<double, double>> up, lo;
  for (const Point& f : fwd_) up.emplace_back(double(f.t - t0), double(f.d) - c);
  for (const Point& r : rev_) lo.emplace_back(double(r.t - t0), -double(r.d) - c);
  EnvelopeFit fit;
  if (!fit_envelope(up, lo, &fit)) return;

  std::vector<WindowResidual> wr;
  window_residuals(t0, fit.a + c, fit.b, c, &wr);
  if (int(wr.size()) < p_.min_windows) return;
  // Robust spread: windows whose minimum was queued in one direction are far
  // off and say nothing about the envelope (the fit ignores them too).
  std::vector<double> absr;
  double tm = 0;
  for (auto& w : wr) {
    absr.push_back(std::fabs(w.res));
    tm += double(w.t_mid - t0);
  }
  double n = double(wr.size());
  std::nth_element(absr.begin(), absr.begin() + absr.size() / 2, absr.end());
  rms_ = 1.4826 * absr[absr.size() / 2];
  tm /= n;
  double stt = 0;
  for (auto& w : wr) stt += (double(w.t_mid - t0) - tm) * (double(w.t_mid - t0) - tm);

  ClockModel m;
  m.valid = true;
  m.t_ref = t0;
  m.offset_ns = fit.a + c;
  m.drift = fit.b;
  // Not divided by sqrt(n): on real hosts the window errors share causes
  // (scheduling, stamp placement) and do not average out.
  m.bound_ns = p_.bound_floor_ns + 3 * rms_;
  double sigma_b = stt > 0 ? rms_ / std::sqrt(stt) : 1e-6;
  m.bound_rate = 3 * sigma_b + p_.wander_rate;
  m.half_rtt_ns = fit.half_gap;
  m.windows = uint32_t(wr.size());
  model_ = m;
}

}  // namespace shunt::clocksync
