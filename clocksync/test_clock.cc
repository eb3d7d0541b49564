#include "clocksync/test_clock.h"

#include <time.h>

#include <charconv>
#include <cmath>

namespace shunt::clocksync {

namespace {
template <typename T>
bool parse_num(std::string_view v, T* out) {
  auto r = std::from_chars(v.data(), v.data() + v.size(), *out);
  return r.ec == std::errc() && r.ptr == v.data() + v.size();
}
}  // namespace

std::optional<TestClockSpec> parse_test_clock(std::string_view text, std::string* err) {
  TestClockSpec s;
  while (!text.empty()) {
    auto comma = text.find(',');
    std::string_view item = text.substr(0, comma);
    text = comma == std::string_view::npos ? std::string_view{} : text.substr(comma + 1);
    if (item.empty()) continue;
    auto eq = item.find('=');
    if (eq == std::string_view::npos) {
      if (err) *err = "expected key=value, got '" + std::string(item) + "'";
      return std::nullopt;
    }
    std::string_view k = item.substr(0, eq), v = item.substr(eq + 1);
    bool ok;
    if (k == "offset") ok = parse_num(v, &s.offset_ns);
    else if (k == "drift") ok = parse_num(v, &s.drift_ppb) && std::llabs(s.drift_ppb) <= 1'000'000;
    else if (k == "wander") ok = parse_num(v, &s.wander_ns);
    else if (k == "wander_period") ok = parse_num(v, &s.wander_period_s) && s.wander_period_s > 0;
    else if (k == "step") ok = parse_num(v, &s.step_ns);
    else if (k == "step_every") ok = parse_num(v, &s.step_every_s) && s.step_every_s >= 0;
    else if (k == "epoch") ok = parse_num(v, &s.epoch_ns) && s.epoch_ns >= 0;
    else ok = false;
    if (!ok) {
      if (err) *err = "bad test clock field '" + std::string(item) + "'";
      return std::nullopt;
    }
  }
  return s;
}

TimeSource::TimeSource(const TestClockSpec& s) : spec_(s), virtual_(!s.identity()) {
  if (virtual_ && spec_.epoch_ns == 0) spec_.epoch_ns = kernel_now();
}

int64_t TimeSource::kernel_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

int64_t TimeSource::local(int64_t t) const {
  if (!virtual_) return t;
  int64_t e = t - spec_.epoch_ns;
  // drift term exactly in integers: e (< 2^63) * ppb would overflow, split it.
  int64_t sec = e / 1'000'000'000, rem = e % 1'000'000'000;
  int64_t drift = sec * spec_.drift_ppb + rem * spec_.drift_ppb / 1'000'000'000;
  int64_t out = t + spec_.offset_ns + drift;
  double es = double(e) * 1e-9;
  if (spec_.wander_ns != 0)
    out += std::llround(double(spec_.wander_ns) * std::sin(2 * M_PI * es / spec_.wander_period_s));
  if (spec_.step_ns != 0 && spec_.step_every_s > 0)
    out += spec_.step_ns * static_cast<int64_t>(std::floor(es / spec_.step_every_s));
  return out;
}

int64_t TimeSource::now() const { return local(kernel_now()); }

}  // namespace shunt::clocksync
