#include "clocksync/path_view.h"

#include <algorithm>
#include <vector>

namespace shunt::clocksync {

namespace {
template <typename T, size_t N>
void push(std::array<T, N>& ring, int& n, int& head, const T& v) {
  ring[head] = v;
  head = (head + 1) % int(N);
  if (n < int(N)) n++;
}

}  // namespace

void PathView::on_sent(int64_t, uint64_t seq) {
  if (first_seq_ == ~0ull) first_seq_ = seq;
  sent_ += 2;
}

void PathView::on_received(int64_t now, uint64_t seq) {
  rx_++;
  last_rx_ = now;
  if (peer_first_seq_ == ~0ull || seq < peer_first_seq_) peer_first_seq_ = seq;
  peer_last_seq_ = std::max(peer_last_seq_, seq);
  push(rc_, nrc_, hrc_, Count{now, 2 * (peer_last_seq_ - peer_first_seq_ + 1), uint32_t(rx_)});
}

void PathView::on_peer_restart() {
  peer_first_seq_ = ~0ull;
  peer_last_seq_ = 0;
  nrc_ = hrc_ = 0;
}

void PathView::on_feedback(int64_t now, uint32_t rx_count, uint64_t seq) {
  if (first_seq_ == ~0ull || seq < first_seq_) return;
  if (rx_count > last_fb_count_) last_fb_progress_ = now;
  if (rx_count < last_fb_count_) nfb_ = 0;  // the peer restarted: counts start over
  last_fb_count_ = rx_count;
  push(fb_, nfb_, hfb_, Count{now, 2 * (seq - first_seq_ + 1), rx_count});
}

void DelayHistogram::add(double ns) {
  for (size_t i = 0; i < le.size(); i++)
    if (ns <= kDelayBucketsNs[i]) le[i]++;
  count++;
  sum_ns += std::max(ns, 0.0);
}

void PathView::add_delay(int64_t now, bool forward, double owd_ns) {
  (forward ? fwd_hist_ : rev_hist_).add(owd_ns);
  if (forward)
    push(fwd_, nf_, hf_, Delay{now, float(owd_ns)});
  else
    push(rev_, nr_, hr_, Delay{now, float(owd_ns)});
}

void PathView::add_queue_sample(int64_t now, double raw_ns, const std::function<double(int64_t)>* offset) {
  if (offset && !queue_on_model_) {  // raw until the model exists, then on it for good
    fwd_queue_.rebase(*offset);
    queue_on_model_ = true;
  }
  if (!offset && queue_on_model_) return;  // a model lost for a while: no samples
  fwd_queue_.add(now, offset ? raw_ns - (*offset)(now) : raw_ns);
}

bool PathView::update_liveness(int64_t now, int64_t dead_ns, int64_t since) {
  if (!alive_) since = 0;  // only proof of life revives a path
  bool alive = last_rx_ != 0 && last_fb_progress_ != 0 && now - std::max(last_rx_, since) <= dead_ns &&
               now - std::max(last_fb_progress_, since) <= dead_ns;
  bool changed = alive != alive_;
  alive_ = alive;
  return changed;
}

int64_t PathView::dead_at(int64_t dead_ns, int64_t since) const {
  if (!alive_) return INT64_MAX;
  return std::max(std::min(last_rx_, last_fb_progress_), since) + dead_ns + 1;  // update_liveness: "> dead_ns"
}

PathStats PathView::stats(int64_t now) const {
  PathStats s;
  s.alive = alive_;
  s.sent = sent_;
  s.received = rx_;
  s.last_heard_ns = std::min(last_rx_, last_fb_progress_);
  s.fwd_queue = fwd_queue_.state();
  s.fwd_hist = fwd_hist_;
  s.rev_hist = rev_hist_;
  auto q = [&](const std::array<Delay, kRing>& ring, int n, double* p50, double* p99) {
    std::vector<float> v;
    v.reserve(n);
    for (int i = 0; i < n; i++)
      if (now - ring[i].t <= window_) v.push_back(ring[i].owd);
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    *p50 = v[(v.size() - 1) / 2];
    *p99 = v[size_t(0.99 * double(v.size() - 1))];
    return int(v.size());
  };
  s.delay_samples = q(fwd_, nf_, &s.fwd_p50_ns, &s.fwd_p99_ns);
  q(rev_, nr_, &s.rev_p50_ns, &s.rev_p99_ns);
  // Loss over the window: the oldest and newest counts inside it.
  auto loss = [&](const std::array<Count, 64>& ring, int n, int head) {
    if (n < 2) return 0.0;
    const Count& newest = ring[(head + 63) % 64];
    const Count* oldest = nullptr;
    for (int k = n; k >= 1; k--) {
      const Count& c = ring[(head + 64 - k) % 64];
      if (now - c.t <= window_) {
        oldest = &c;
        break;
      }
    }
    if (!oldest || oldest == &newest || newest.sent_upto <= oldest->sent_upto) return 0.0;
    double sent = double(newest.sent_upto - oldest->sent_upto);
    double got = double(newest.rx) - double(oldest->rx);
    return std::clamp(1 - got / sent, 0.0, 1.0);
  };
  s.fwd_loss = loss(fb_, nfb_, hfb_);
  if (nfb_ > 0) {
    const Count& newest = fb_[(hfb_ + 63) % 64];
    s.acked_sent = newest.sent_upto;
    s.acked_rx = newest.rx;
  }
  s.rev_loss = loss(rc_, nrc_, hrc_);
  if (!alive_ && now - s.last_heard_ns > window_) s.fwd_loss = 1;
  return s;
}

}  // namespace shunt::clocksync
