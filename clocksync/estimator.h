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
// (window errors on real hosts share causes and do not average out), growing in holdover with
// the drift uncertainty and an allowance for oscillator wander.
// A step in either clock shows as consecutive windows far off the line: the
// history before the step is dropped.
#pragma once
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
  int step_windows = 3;             // consecutive outliers that mean a clock step
  double step_min_ns = 10'000;      // a minimum this far below the envelope (and 8 sigma) is a step
};

class OffsetEstimator {
 public:
  explicit OffsetEstimator(const EstimatorParams& p = {});
  // A forward (us -> peer) or reverse (peer -> us) sample, t on our clock.
  void add_forward(const Sample& s);
  void add_reverse(const Sample& s);
  // Closes windows that ended before `now` and refits when any did.
  void tick(int64_t now);
  const ClockModel& model() const { return model_; }
  uint64_t steps_detected() const { return steps_; }
  void reset();

 private:
  struct Point {
    int64_t t;
    int64_t d;
  };
  struct WindowResidual {
    int64_t t_first, t_mid;
    double res;
  };
  void push(std::deque<Point>& q, const Sample& s);
  void refit();
  bool holding_for_step();
  void window_residuals(int64_t t0, double a, double b, double c,
                        std::vector<WindowResidual>* out) const;

  EstimatorParams p_;
  WindowMin fwin_, rwin_;
  std::deque<Point> fwd_, rev_;
  ClockModel model_;
  bool dirty_ = false;
  double rms_ = 0;
  int outliers_ = 0;
  int64_t last_checked_ = std::numeric_limits<int64_t>::min();
  int64_t first_outlier_t_ = 0;
  uint64_t steps_ = 0;
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

}  // namespace shunt::clocksync
