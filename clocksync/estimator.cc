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

double total_gap(const std::vector<Segment>& segs, double b) {
  double g = 0;
  for (auto& s : segs)
    if (!s.upper.empty() && !s.lower.empty()) g += gap(s.upper, s.lower, b, nullptr);
  return g;
}
}  // namespace

bool fit_segments(const std::vector<Segment>& segs, double* slope, std::vector<EnvelopeFit>* out) {
  out->assign(segs.size(), EnvelopeFit{0, 0, -1});
  bool any = false;
  for (auto& s : segs) any |= !s.upper.empty() && !s.lower.empty();
  if (!any) return false;
  // Each gap(b) is concave (a min of lines minus a max of lines), so is their
  // sum: ternary search.
  double lo = -kMaxSlope, hi = kMaxSlope;
  for (int i = 0; i < 120 && hi - lo > 1e-15; i++) {
    double m1 = lo + (hi - lo) / 3, m2 = hi - (hi - lo) / 3;
    if (total_gap(segs, m1) < total_gap(segs, m2))
      lo = m1;
    else
      hi = m2;
  }
  double b = (lo + hi) / 2;
  // A slope pinned at the search edge means the points do not determine it.
  if (std::fabs(b) > kMaxSlope * 0.999) return false;
  *slope = b;
  for (size_t i = 0; i < segs.size(); i++) {
    if (segs[i].upper.empty() || segs[i].lower.empty()) continue;
    double lmax;
    double g = gap(segs[i].upper, segs[i].lower, b, &lmax);
    (*out)[i] = EnvelopeFit{lmax + g / 2, b, g / 2};  // the middle of the gap at t = 0
  }
  return true;
}

bool fit_envelope(const std::deque<std::pair<double, double>>& upper,
                  const std::deque<std::pair<double, double>>& lower, EnvelopeFit* out) {
  std::vector<Segment> s(1);
  s[0].upper = upper;
  s[0].lower = lower;
  std::vector<EnvelopeFit> f;
  double b;
  if (!fit_segments(s, &b, &f)) return false;
  *out = f[0];
  return true;
}

OffsetEstimator::OffsetEstimator(const EstimatorParams& p)
    : p_(p), fwin_(p.window_ns), rwin_(p.window_ns) {}

void OffsetEstimator::reset() {
  fwin_.reset();
  rwin_.reset();
  fwd_.clear();
  rev_.clear();
  segs_.clear();
  fit_ = model_ = ClockModel{};
  fit_gen_ = steps_;
  cand_.clear();
  cand_dir_ = -1;
  above_n_[0] = above_n_[1] = 0;
}

size_t OffsetEstimator::segment_of(int64_t t) const {
  return size_t(std::upper_bound(segs_.begin(), segs_.end(), t) - segs_.begin());
}

void OffsetEstimator::push(std::deque<Point>& q, const Sample& s) {
  q.push_back({s.t, s.d});
  int64_t horizon = s.t - int64_t(p_.max_windows) * p_.window_ns;
  while (!q.empty() && (q.front().t < horizon || int(q.size()) > p_.max_windows)) q.pop_front();
  // Boundaries older than every point left separate nothing.
  while (!segs_.empty() && !fwd_.empty() && !rev_.empty() && fwd_.front().t >= segs_.front() &&
         rev_.front().t >= segs_.front())
    segs_.pop_front();
  dirty_ = true;
}

void OffsetEstimator::feed(int dir, const Sample& s) {
  if (dir == 0) {
    if (auto w = fwin_.add(s, fit_.drift)) push(fwd_, *w);
  } else {
    if (auto w = rwin_.add(s, -fit_.drift)) push(rev_, *w);
  }
}

void OffsetEstimator::add(int dir, const Sample& s) {
  // Checked only against a model of the current segment.
  if (fit_.valid && fit_gen_ == steps_) {
    // The path delay a step does not change: from the best-filled segment.
    double D = d_ref_, th = fit_.offset_at(s.t);
    // How far the sample lies below its direction's envelope; queueing only
    // ever makes this negative.
    double below = dir == 0 ? (D + th) - double(s.d) : (D - th) - double(s.d);
    double limit = std::max(p_.step_min_ns, 8 * rms_) + young_extra_ + (fit_.bound_at(s.t) - fit_.bound_ns);
    // A run of samples far *above* the envelope is queueing or a step whose
    // proof (the other direction, below) is missing: while the other
    // direction has said nothing since the run began, the model is suspect.
    if (-below > limit) {
      if (above_n_[dir]++ == 0) {
        above_since_[dir] = s.t;
        above_min_[dir] = above_max_[dir] = -below;
      }
      above_min_[dir] = std::min(above_min_[dir], -below);
      above_max_[dir] = std::max(above_max_[dir], -below);
      above_limit_[dir] = limit;
    } else {
      above_n_[dir] = 0;
      last_clean_t_[dir] = std::max(last_clean_t_[dir], s.t);  // on the envelope (or below)
    }
    last_t_[dir] = std::max(last_t_[dir], s.t);
    if (below > limit) {
      if (cand_dir_ != dir) {
        if (!cand_.empty()) glitches_ += cand_.size();
        cand_.clear();
        cand_dir_ = dir;
      }
      cand_.push_back(s);
      if (int(cand_.size()) >= p_.step_samples) confirm_step();
      publish();
      return;
    }
    if (dir == cand_dir_ && !cand_.empty() && below >= -limit) {
      // The next sample in the same direction is back on the envelope: a
      // glitch. (One far above it, queued, says nothing either way.)
      glitches_ += cand_.size();
      cand_.clear();
      cand_dir_ = -1;
    }
  }
  feed(dir, s);
  publish();
}

void OffsetEstimator::add_forward(const Sample& s) { add(0, s); }
void OffsetEstimator::add_reverse(const Sample& s) { add(1, s); }

void OffsetEstimator::confirm_step() {
  // The new segment starts at the first sample that showed the step: the other
  // direction's samples since the step lie above the old envelope (they look
  // queued), so leaving them in the old segment cannot move its fit.
  int64_t start = cand_.front().t;
  if (segs_.empty() || segs_.back() < start) segs_.push_back(start);
  steps_++;
  above_n_[0] = above_n_[1] = 0;
  std::vector<Sample> c;
  c.swap(cand_);
  int dir = cand_dir_;
  cand_dir_ = -1;
  for (const Sample& s : c) feed(dir, s);
  dirty_ = true;
}

void OffsetEstimator::tick(int64_t now) {
  if (auto w = fwin_.flush(now)) push(fwd_, *w);
  if (auto w = rwin_.flush(now)) push(rev_, *w);
  if (!dirty_) return;
  dirty_ = false;
  refit();
  publish();
}

void OffsetEstimator::publish() {
  model_ = fit_;
  bool silent = false;
  for (int d = 0; d < 2; d++) {
    // Direction d sits far above the envelope and the other direction has
    // not confirmed the model since: either it said nothing, or d's shift is
    // steady (a step or a route change; queueing varies) and the other
    // direction's samples were all queued.
    bool steady = above_max_[d] - above_min_[d] <= above_limit_[d];
    silent |= above_n_[d] >= p_.step_samples && last_clean_t_[1 - d] < above_since_[d] &&
              (steady || last_t_[1 - d] < above_since_[d]);
  }
  model_.valid = fit_.valid && fit_gen_ == steps_ && cand_.empty() && !silent;
}

void OffsetEstimator::refit() {
  if (fwd_.empty() || rev_.empty()) return;
  int64_t t0 = std::max(fwd_.back().t, rev_.back().t);
  double c = (double(fwd_.back().d) - double(rev_.back().d)) / 2;  // rough theta keeps doubles small
  size_t nseg = segs_.size() + 1;
  std::vector<Segment> seg(nseg);
  for (const Point& f : fwd_) seg[segment_of(f.t)].upper.emplace_back(double(f.t - t0), double(f.d) - c);
  for (const Point& r : rev_) seg[segment_of(r.t)].lower.emplace_back(double(r.t - t0), -double(r.d) - c);
  const Segment& last = seg.back();
  if (last.upper.empty() || last.lower.empty()) return;  // the newest segment has no model yet
  std::vector<EnvelopeFit> fit;
  double b;
  if (!fit_segments(seg, &b, &fit)) return;

  // Per-window estimates (windows holding both directions, same segment)
  // around their segment's line.
  std::vector<double> absr;
  std::vector<double> tmid;
  for (const Point& f : fwd_) {
    int64_t id = f.t / p_.window_ns;
    size_t sf = segment_of(f.t);
    for (const Point& r : rev_) {
      if (r.t / p_.window_ns != id || segment_of(r.t) != sf || fit[sf].half_gap < 0) continue;
      double th = ((double(f.d) - c - b * double(f.t - t0)) - (double(r.d) + c + b * double(r.t - t0))) / 2;
      absr.push_back(std::fabs(th - fit[sf].a));
      tmid.push_back(double((f.t - t0) + (r.t - t0)) / 2);
      break;
    }
  }
  if (int(absr.size()) < p_.min_windows) return;
  // Robust spread: windows whose minimum was queued in one direction are far
  // off and say nothing about the envelope (the fit ignores them too).
  std::nth_element(absr.begin(), absr.begin() + absr.size() / 2, absr.end());
  rms_ = 1.4826 * absr[absr.size() / 2];
  double tm = 0, stt = 0;
  for (double x : tmid) tm += x;
  tm /= double(tmid.size());
  for (double x : tmid) stt += (x - tm) * (x - tm);

  ClockModel m;
  m.valid = true;
  m.t_ref = t0;
  m.offset_ns = fit.back().a + c;
  m.drift = b;
  // Not divided by sqrt(n): on real hosts the window errors share causes
  // (scheduling, stamp placement) and do not average out. The newest
  // segment's offset rests on as few as one window each way: one window's
  // error is what the spread describes.
  // A segment younger than a few windows may rest on a queued window in one
  // direction: with the path delay D from the best-filled segment, its offset
  // is only known to lie within its gap less 2 D.
  size_t best = 0;
  std::vector<size_t> cnt(nseg, 0);
  for (const Point& f : fwd_) cnt[segment_of(f.t)]++;
  for (const Point& r : rev_) cnt[segment_of(r.t)]++;
  for (size_t i = 0; i < nseg; i++)
    if (fit[i].half_gap >= 0 && (fit[best].half_gap < 0 || cnt[i] > cnt[best])) best = i;
  d_ref_ = fit[best].half_gap;
  young_extra_ = std::max(0.0, fit.back().half_gap - d_ref_);
  m.bound_ns = p_.bound_floor_ns + 3 * rms_ + young_extra_;
  // The fitted line is surest at the windows' centre; the offset at t_ref
  // lies |tm| past it, where the slope's uncertainty adds to the bound (a
  // young fit over two seconds of windows was seen past its bound without).
  double sigma_b = stt > 0 ? rms_ / std::sqrt(stt) : 1e-6;
  m.bound_ns += 3 * sigma_b * std::fabs(tm);
  m.bound_rate = 3 * sigma_b + p_.wander_rate;
  m.half_rtt_ns = fit.back().half_gap;
  m.windows = uint32_t(absr.size());
  fit_ = m;
  fit_gen_ = steps_;
}

}  // namespace shunt::clocksync
