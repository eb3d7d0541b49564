// TEST ONLY: a virtual clock laid over the kernel clock. On one machine every
// network namespace shares one kernel clock (true offset 0 between "hosts"),
// so accuracy is measured by giving each host a virtual clock with a known
// offset, drift, slow wander and occasional steps, applied to every timestamp
// the engine sees (kernel send/receive stamps and its own clock reads).
//
//   local(t) = t + offset + drift_ppb * (t - epoch) / 1e9
//                + wander * sin(2 pi (t - epoch) / wander_period)
//                + step * floor((t - epoch) / step_every)
//
// It is a pure function of the kernel time, so a checker that knows every
// host's parameters computes the true offset between any two hosts.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace shunt::clocksync {

struct TestClockSpec {
  int64_t offset_ns = 0;
  int64_t drift_ppb = 0;      // |drift| <= 1e6 ppb (1000 ppm) accepted
  int64_t wander_ns = 0;      // amplitude of a slow sinusoid
  double wander_period_s = 60;
  int64_t step_ns = 0;        // added every step_every_s seconds
  double step_every_s = 0;    // 0: no steps
  int64_t epoch_ns = 0;       // 0: the first time the clock is read in this process

  bool identity() const {
    return offset_ns == 0 && drift_ppb == 0 && wander_ns == 0 && (step_ns == 0 || step_every_s <= 0);
  }
};

// Parses "offset=NS,drift=PPB,wander=NS,wander_period=S,step=NS,step_every=S,epoch=NS"
// (any subset, any order). Empty text is the identity. nullopt on any error;
// `err` says which field.
std::optional<TestClockSpec> parse_test_clock(std::string_view text, std::string* err);

// Maps kernel (CLOCK_REALTIME) ns to this host's local ns. Identity by default.
class TimeSource {
 public:
  TimeSource() = default;
  explicit TimeSource(const TestClockSpec& s);
  int64_t local(int64_t kernel_ns) const;
  int64_t now() const;                 // local(clock_gettime(CLOCK_REALTIME))
  static int64_t kernel_now();
  bool virtual_clock() const { return virtual_; }
  const TestClockSpec& spec() const { return spec_; }

 private:
  TestClockSpec spec_;
  bool virtual_ = false;
};

}  // namespace shunt::clocksync
