// When a probed bundle's failover worker asks the host agent what the
// probes of its paths' source ports say (`bundle-paths-stats`: which paths'
// probes are lost, which came back). Asking is a request to the agent; made
// every 100 ms by every bundle, it cost a fifth of the throughput of a
// soft-RoCE guest with one CPU. The agent's probe engine counts the liveness
// changes of its source paths in the clock segment (SHUNT_CLOCK_SHM), so the
// worker asks when that count moved, when it registered new ports (a renewed
// shadow's), and every 5 s regardless (a change it may have missed: a new
// agent's segment; once a second, the worker's thread alone took 4-6% of a
// one-CPU soft-RoCE guest running a probed job, 3% after). Where the count
// cannot be read it asks every 100 ms.
#pragma once
#include <cstdint>
#include <optional>

namespace shunt::verbs {

class ProbeAsk {
 public:
  static constexpr int64_t kEveryMs = 100;    // without the count
  static constexpr int64_t kAnywayMs = 5000;  // with it

  // Whether to ask now, given the engine's count (nullopt: not readable).
  // A yes is taken as asked.
  bool due(int64_t now_ms, std::optional<uint64_t> count) {
    bool moved = count && (!seen_ || *count != *seen_);
    if (now_ms < next_ && !new_ports_ && !moved) return false;
    next_ = now_ms + (count ? kAnywayMs : kEveryMs);
    seen_ = count;
    new_ports_ = false;
    return true;
  }
  // The agent did not answer: again soon, whatever the count says.
  void unanswered(int64_t now_ms) { next_ = now_ms + kEveryMs; }
  // New ports were registered: their first verdicts are wanted.
  void ports_registered() { new_ports_ = true; }
  // Whether the regular ask is due (also when to look for a new segment).
  bool regular(int64_t now_ms) const { return now_ms >= next_; }

 private:
  int64_t next_ = 0;
  std::optional<uint64_t> seen_;
  bool new_ports_ = false;
};

}  // namespace shunt::verbs
