// What the probes say about one path (local rail -> the peer's matching
// address): one-way delay quantiles over a sliding window, probe loss, and
// liveness. A path is dead when, for `dead_ns`, either no authenticated probe
// arrived from the peer on it or the peer's feedback showed none of ours
// arriving (so a one-way failure kills it too). It is alive again on the
// first probe that proves both directions.
#pragma once
#include <array>
#include <cstdint>
#include <functional>

#include "clocksync/congestion.h"

namespace shunt::clocksync {

// One direction's delays since the path began, cumulative per upper bound
// (a Prometheus histogram: bucket i counts delays <= kDelayBucketsNs[i]).
inline constexpr std::array<double, 16> kDelayBucketsNs{1e3,  2.5e3, 5e3, 10e3,  25e3, 50e3,  100e3, 250e3,
                                                       500e3, 1e6,  2.5e6, 5e6, 10e6, 25e6, 100e6, 1e9};
struct DelayHistogram {
  std::array<uint64_t, kDelayBucketsNs.size()> le{};  // cumulative
  uint64_t count = 0;
  double sum_ns = 0;  // negative delays (a clock error) count as 0
  void add(double ns);
};

struct PathStats {
  bool alive = false;
  DelayHistogram fwd_hist, rev_hist;
  double fwd_p50_ns = -1, fwd_p99_ns = -1;  // us -> peer; -1 until the clock model exists
  double rev_p50_ns = -1, rev_p99_ns = -1;  // peer -> us
  double fwd_loss = 0, rev_loss = 0;        // fraction of probes lost in the window
  uint64_t sent = 0, received = 0;          // probes, since start
  int64_t last_heard_ns = 0;                // local time of the last proof of life
  // From the peer's newest feedback, since the path began: our probes up to
  // the newest it saw, and how many of them it got (two readings of these
  // give the loss between them, free of the window's length).
  uint64_t acked_sent = 0;
  uint64_t acked_rx = 0;
  uint32_t delay_samples = 0;
  CongestionState fwd_queue;  // queueing us -> peer, from the forward delays
};

class PathView {
 public:
  static constexpr int kRing = 256;
  explicit PathView(int64_t window_ns = 10'000'000'000) : window_(window_ns) {}

  void on_sent(int64_t now, uint64_t pair_seq);  // after a pair left
  void on_received(int64_t now, uint64_t pair_seq);  // a probe of the peer's arrived
  void on_peer_restart();  // the peer's pair numbers start over (reverse loss too)
  // The peer's cumulative count of our probes and the newest pair it saw.
  void on_feedback(int64_t now, uint32_t rx_count, uint64_t pair_seq);
  void add_delay(int64_t now, bool forward, double owd_ns);
  // A forward delay for the queue detector, from any pair (queued or not),
  // raw (receiver's clock minus sender's), and the peer's clock offset at a
  // given local time where the clock model exists (else null). Raw delays
  // are taken until the model appears; then the detector's delays are
  // rebased on it, once, with its offset at each one's time (the base
  // learned so far, a seed from the rail path among it, carries over), and
  // raw samples after that (the model lost for a while) are not taken.
  void add_queue_sample(int64_t now, double raw_ns, const std::function<double(int64_t)>* offset);
  // Re-evaluates liveness; returns true when it changed. An alive path's
  // proofs of life count from `since` at the earliest (the peer heard again
  // after a silence of its whole host: every path has its dead time anew).
  bool update_liveness(int64_t now, int64_t dead_ns, int64_t since = 0);
  // When an alive path turns dead unless proof of life arrives first
  // (INT64_MAX for a dead one: only an arriving probe can revive it).
  int64_t dead_at(int64_t dead_ns, int64_t since = 0) const;
  PathStats stats(int64_t now) const;
  bool alive() const { return alive_; }
  // A new path's forward queue starts from `o`'s base and noise
  // (CongestionDetector::seed_from), in `o`'s terms: a base already on the
  // clock model is not rebased on it again (it was, and every new source
  // path then saw the peer's clock offset, hundreds of ms on the guests, as
  // its queue).
  void seed_queue(int64_t now, const PathView& o) {
    if (fwd_queue_.seed_from(now, o.fwd_queue_)) queue_on_model_ = o.queue_on_model_;
  }

 private:
  struct Delay {
    int64_t t;
    float owd;
  };
  struct Count {
    int64_t t;
    uint64_t sent_upto;  // our probes with pair seq <= the fed-back seq
    uint32_t rx;
  };
  int64_t window_;
  CongestionDetector fwd_queue_;
  bool queue_on_model_ = false;
  std::array<Delay, kRing> fwd_{}, rev_{};
  DelayHistogram fwd_hist_, rev_hist_;
  int nf_ = 0, nr_ = 0, hf_ = 0, hr_ = 0;
  std::array<Count, 64> fb_{};
  int nfb_ = 0, hfb_ = 0;
  uint64_t first_seq_ = ~0ull, sent_ = 0;
  uint64_t rx_ = 0, peer_first_seq_ = ~0ull, peer_last_seq_ = 0;
  // Reverse loss over the window: (time, peer seq, received so far).
  std::array<Count, 64> rc_{};
  int nrc_ = 0, hrc_ = 0;
  int64_t last_rx_ = 0, last_fb_progress_ = 0;
  uint32_t last_fb_count_ = 0;
  bool alive_ = false;
};

}  // namespace shunt::clocksync
