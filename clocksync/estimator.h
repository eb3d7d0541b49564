// Offset and drift of one peer's clock relative to ours, fitted on the lower
// envelope of one-way delays in both directions.
//
// Forward samples (us -> peer) satisfy d_f(t) >= D + theta(t), reverse
// samples (peer -> us) satisfy d_r(t) >= D - theta(t), where theta is the
// peer's clock minus ours and D the one-way propagation delay (taken equal
// both ways: a fixed asymmetry is invisible to any two-way method). So the
// forward points lie above the line theta(t) + D and the negated reverse
// points below theta(t) - D. The fit is the line through the middle of the
// widest gap between the two clouds (the 2-D max-margin separator Huygens
// uses), found by a search over the slope: the gap is a concave function of
// it. Only the envelope points matter, so queueing (which only adds delay)
// does not bias the fit as long as some probes in each direction get through
// unqueued.
//
// Error bound: the spread of the per-window estimates around the fitted line
// (a window with both directions' minima gives theta_k = (m_f - m_r) / 2)
// says how well-defined the envelope is; the bound is a floor plus 3 robust sigma
// (window errors on real hosts share causes and do not average out), plus the
// drift uncertainty carried from the windows' centre to the newest, growing in
// holdover with that drift uncertainty and an allowance for oscillator wander.
// Steps: a clean sample well *below* the envelope in either direction cannot
// come from queueing, which only adds delay. Every sample is checked as it
// arrives (not per window: the feed often lacks one direction for a window),
// so one direction's evidence is enough. While such samples are pending the
// model is reported invalid; two in a row in the same direction confirm a
// step, a lone one is dropped as a glitch. A step starts a new segment: the
// segments share the drift (a step changes the offset, not the frequency)
// and each has its own offset, so the newest segment gets a model from its
// first sample pair each way, with the drift of the whole span.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <limits>
#include <optional>
#include <vector>

#include "clocksync/filter.h"

namespace shunt::clocksync {

struct ClockModel {
  bool valid = false;
  int64_t t_ref = 0;        // local ns where offset_ns holds (latest data)
  double offset_ns = 0;     // peer clock minus local clock at t_ref
  double drift = 0;         // d(offset)/dt, ns per ns (1e-9 = 1 ppb)
  double bound_ns = 0;      // error bound at t_ref
  double bound_rate = 0;    // growth of the bound per ns of holdover
  double half_rtt_ns = 0;   // half the least round trip: the bound no asymmetry can break
  uint32_t windows = 0;     // windows that went into the fit

  double offset_at(int64_t t) const { return offset_ns + drift * double(t - t_ref); }
  double bound_at(int64_t t) const {
    return bound_ns + bound_rate * double(t > t_ref ? t - t_ref : 0);
  }
};

struct EstimatorParams {
  int64_t window_ns = 500'000'000;  // envelope window
  int max_windows = 20;             // fit span: 10 s at the default window
  int min_windows = 3;              // windows with both directions before a model is valid
  double bound_floor_ns = 200;      // software stamps: where in the stack each side stamps
  double wander_rate = 20e-9;       // holdover allowance for frequency wander (20 ppb)
  int step_samples = 2;             // consecutive samples below the envelope that mean a clock step
  double step_min_ns = 10'000;      // a sample this far below the envelope (and 8 sigma) is step evidence
};

class OffsetEstimator {
 public:
  explicit OffsetEstimator(const EstimatorParams& p = {});
  // A forward (us -> peer) or reverse (peer -> us) sample, t on our clock.
  void add_forward(const Sample& s);
  void add_reverse(const Sample& s);
  // Closes windows that ended before `now` and refits when any did.
  void tick(int64_t now);
  // The earliest time tick() has work to do (a window ends, or a refit is
  // pending): callers sleep until then instead of ticking.
  int64_t next_due() const {
    return dirty_ ? std::numeric_limits<int64_t>::min() : std::min(fwin_.ends_at(), rwin_.ends_at());
  }
  const ClockModel& model() const { return model_; }
  uint64_t steps_detected() const { return steps_; }
  uint64_t glitches() const { return glitches_; }  // lone samples below the envelope, dropped
  // True while samples below the envelope wait for confirmation (model reported invalid).
  bool step_suspected() const { return !cand_.empty(); }
  void reset();

 private:
  struct Point {
    int64_t t;
    int64_t d;
  };
  void add(int dir, const Sample& s);
  void feed(int dir, const Sample& s);
  void push(std::deque<Point>& q, const Sample& s);
  void confirm_step();
  void refit();
  void publish();
  size_t segment_of(int64_t t) const;

  EstimatorParams p_;
  WindowMin fwin_, rwin_;
  std::deque<Point> fwd_, rev_;
  std::deque<int64_t> segs_;  // start times of the segments after the first (steps)
  ClockModel fit_;            // newest fit (of the newest segment once fit_gen_ == steps_)
  ClockModel model_;          // what model() reports
  uint64_t fit_gen_ = 0;
  bool dirty_ = false;
  double rms_ = 0;
  double d_ref_ = 0;        // one-way path delay (half the least round trip) of the best-filled segment
  double young_extra_ = 0;  // bound widening while the newest segment is young
  int cand_dir_ = -1;
  std::vector<Sample> cand_;  // samples below the envelope awaiting confirmation
  int above_n_[2] = {0, 0};   // per direction: consecutive samples far above the envelope
  int64_t above_since_[2] = {0, 0};
  double above_min_[2] = {0, 0}, above_max_[2] = {0, 0}, above_limit_[2] = {0, 0};
  int64_t last_t_[2] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min()};
  int64_t last_clean_t_[2] = {std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::min()};
  uint64_t steps_ = 0, glitches_ = 0;
};

// The gap search itself, exposed for tests: points above (upper) the line
// theta(t) + D and below (lower, already negated) theta(t) - D. Times are
// relative to t0 in ns. Returns false if either set is empty.
struct EnvelopeFit {
  double a = 0;      // theta at t0
  double b = 0;      // slope
  double half_gap = 0;
};
bool fit_envelope(const std::deque<std::pair<double, double>>& upper,
                  const std::deque<std::pair<double, double>>& lower, EnvelopeFit* out);
// Several segments (between clock steps) sharing one slope, each with its own
// offset: the slope maximizes the sum of the segments' gaps (concave), so
// long segments, whose gap falls fastest off their best slope, dominate.
// Segments lacking either side are skipped (out[i].half_gap < 0).
struct Segment {
  std::deque<std::pair<double, double>> upper, lower;
};
bool fit_segments(const std::vector<Segment>& segs, double* slope, std::vector<EnvelopeFit>* out);

}  // namespace shunt::clocksync
