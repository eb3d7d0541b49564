#include "clocksync/filter.h"

#include <algorithm>
#include <cstdlib>

namespace shunt::clocksync {

std::optional<int64_t> PairFilter::accept(const PairStamps& p) {
  if (p.tx0 == 0 || p.tx1 == 0 || p.rx0 == 0 || p.rx1 == 0 || p.tx1 < p.tx0) {
    rejected_++;
    return std::nullopt;
  }
  int64_t sent = p.tx1 - p.tx0, got = p.rx1 - p.rx0;
  const int64_t err = std::llabs(got - sent);
  learn(err);
  if (err > tol_) {
    rejected_++;
    return std::nullopt;
  }
  accepted_++;
  // Receive batching (interrupt moderation, NAPI, a softirq run) can hold the
  // first probe until the second arrives: the less-delayed one is the clean one.
  return std::min(p.rx0 - p.tx0, p.rx1 - p.tx1);
}

void PairFilter::learn(int64_t err) {
  block_[in_block_++] = err;
  if (in_block_ < kBlock) return;
  in_block_ = 0;
  std::nth_element(block_, block_ + kBlock / 4, block_ + kBlock);
  noise_[next_] = block_[kBlock / 4];
  next_ = (next_ + 1) % kBlocks;
  blocks_ = std::min(blocks_ + 1, kBlocks);
  int64_t low = noise_[0];
  for (int i = 1; i < blocks_; i++) low = std::min(low, noise_[i]);
  tol_ = std::clamp(3 * low, floor_, std::max(floor_, kMaxTolNs));
}

std::optional<Sample> WindowMin::add(const Sample& s, double slope) {
  int64_t id = s.t >= 0 ? s.t / window_ : (s.t - window_ + 1) / window_;
  std::optional<Sample> out;
  if (have_ && id != win_id_) {
    out = best_;
    have_ = false;
  }
  // Detrend relative to the window start so the key stays small and exact.
  double key = double(s.d) - slope * double(s.t - id * window_);
  if (!have_ || key < best_key_) {
    best_ = s;
    best_key_ = key;
  }
  have_ = true;
  win_id_ = id;
  return out;
}

std::optional<Sample> WindowMin::flush(int64_t now) {
  if (!have_ || now < (win_id_ + 1) * window_) return std::nullopt;
  have_ = false;
  return best_;
}

}  // namespace shunt::clocksync
