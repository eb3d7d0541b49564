#include "interpose/verbs/steer.h"

#include <algorithm>
#include <cmath>

namespace shunt::verbs {

SteerResult steer_step(std::vector<SteerPath>& paths, double interval_ns, std::mt19937& rng) {
  SteerResult r;
  int n = 0;
  bool any = false;
  for (const auto& p : paths)
    if (p.known) n++, any |= p.congested;
  auto remember = [&] {
    for (auto& p : paths) p.prev_excess_ns = p.known ? p.excess_ns : -1;
  };
  if (!any || n < 2) {
    remember();
    return r;
  }
  // Each path's queue as it will be kTrendNs ahead if it keeps changing as
  // it did since the last step: for senders that are not window-limited the
  // queue is the integral of the path's overload, so steering on the queue
  // alone overshoots and swings; its change is the overload itself.
  std::vector<double> ahead(paths.size(), 0);
  double asum = 0, esum = 0;
  for (size_t i = 0; i < paths.size(); i++) {
    const SteerPath& p = paths[i];
    if (!p.known) continue;
    const double d = p.prev_excess_ns >= 0 ? p.excess_ns - p.prev_excess_ns : 0;
    ahead[i] = std::max(0.0, p.excess_ns + kTrendNs / interval_ns * d);
    asum += ahead[i];
    esum += p.excess_ns;
  }
  const double mean = asum / n, emean = esum / n;
  // u: a path's extrapolated queue over the bundle's mean, relative to the
  // larger of that mean, its threshold and one interval, plus kLevelGain
  // times its present queue over the bundle's mean, relative to that mean
  // (steer.h).
  const double g = kSteerGain * std::uniform_real_distribution<double>(0.5, 1.5)(rng);
  std::vector<double> before(paths.size());
  double raw = 0;
  for (size_t i = 0; i < paths.size(); i++) {
    SteerPath& p = paths[i];
    before[i] = p.share;
    if (p.known && std::fabs(ahead[i] - mean) > p.threshold_ns / 2) {
      const double u = std::clamp((ahead[i] - mean) / std::max({mean, p.threshold_ns, interval_ns}) +
                                      kLevelGain * (p.excess_ns - emean) / std::max(emean, p.threshold_ns),
                                  -kMaxStep, kMaxStep);
      p.share *= std::exp(-g * u);
    }
    raw += p.share;
  }
  remember();
  const double k = static_cast<double>(paths.size());
  for (size_t i = 0; i < paths.size(); i++) {
    SteerPath& p = paths[i];
    p.share = std::clamp(p.share * k / raw, 0.25, 4.0);
    if (p.share < before[i] * 0.995) r.from.push_back(static_cast<int>(i));
    if (p.share > before[i] * 1.005) r.to.push_back(static_cast<int>(i));
  }
  r.moved = !r.from.empty() || !r.to.empty();
  return r;
}

bool carrier_congested(const CarrierDir& c) {
  return c.verdict == 1 && c.excess_ns >= kCarrierQueueNoise * c.threshold_ns;
}

namespace {
double clear_floor(const CarrierDir& t) { return std::max(kCarrierClearNoise * t.threshold_ns, kCarrierClearFloorNs); }

bool clears(const CarrierDir& t, const CarrierDir& c) {
  return carrier_congested(c) && t.verdict >= 0 &&
         (t.verdict == 0 || (t.excess_ns * kCarrierClearRatio < c.excess_ns && t.excess_ns < clear_floor(t)));
}

// The target's queue rose with the carrier's (QueueEcho): the host's, not the spine's.
bool echoes(const CarrierDir& t, const CarrierDir& c) {
  return carrier_congested(c) && t.recent_ns >= kCarrierEchoShare * c.excess_ns;
}

bool no_worse(const CarrierDir& t, const CarrierDir& c) {
  if (t.same || t.verdict == 0) return true;
  if (t.verdict < 0) return c.verdict < 0;  // nothing known that way at all: no objection
  return t.excess_ns <= 2 * c.excess_ns || t.excess_ns < clear_floor(t);
}
}  // namespace

int carrier_target(const CarrierView& carrier, const std::vector<CarrierView>& others, std::mt19937& rng) {
  if (!carrier_congested(carrier.own) && !carrier_congested(carrier.peer)) return -1;
  // Those that clear the most congested directions (both, where both
  // queue and some path clears both).
  std::vector<int> clear;
  int best = 1;
  for (const auto& o : others) {
    if (o.path == carrier.path || !o.usable) continue;
    if (!no_worse(o.own, carrier.own) || !no_worse(o.peer, carrier.peer)) continue;
    if (echoes(o.own, carrier.own) || echoes(o.peer, carrier.peer)) continue;
    const int n = clears(o.own, carrier.own) + clears(o.peer, carrier.peer);
    if (n < best) continue;
    if (n > best) clear.clear(), best = n;
    clear.push_back(o.path);
  }
  if (clear.empty()) return -1;
  return clear[std::uniform_int_distribution<size_t>(0, clear.size() - 1)(rng)];
}

double QueueEcho::note(int64_t now_ms, int path, int dir, const CarrierDir& d) {
  auto& q = seen_[{path, dir}];
  if (d.verdict >= 0) q.emplace_back(now_ms, d.excess_ns);
  while (!q.empty() && now_ms - q.front().first > kCarrierEchoMs) q.pop_front();
  double top = -1;
  for (const auto& [at, v] : q) top = std::max(top, v);
  return top;
}

int CarrierHold::tick(int64_t now_ms, int target, std::mt19937& rng) {
  if (now_ms < after_) {
    since_ = 0;
    return -1;
  }
  if (target < 0) {
    // The condition lapsed: past kCarrierLapseMs, a new hold, drawn anew,
    // when it returns.
    if (since_ && now_ms - last_seen_ > kCarrierLapseMs) since_ = 0;
    return -1;
  }
  last_seen_ = now_ms;
  if (!since_) {
    since_ = now_ms;
    wait_ = std::uniform_int_distribution<int64_t>(kCarrierHoldMinMs, max_ - 1)(rng);
  }
  return now_ms - since_ >= wait_ ? target : -1;
}

void CarrierHold::moved(int64_t now_ms) {
  max_ = last_move_ && now_ms - last_move_ < kCarrierCalmMs ? std::min(max_ * 2, kCarrierHoldCapMs) : kCarrierHoldMaxMs;
  last_move_ = now_ms;
  since_ = 0;
  after_ = now_ms + kCarrierDwellMs;
}

}  // namespace shunt::verbs
