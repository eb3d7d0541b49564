// A bounded multi-producer, single-consumer ring of fixed-size entries: any
// thread pushes without a lock or an allocation (one compare-and-swap on the
// shared position, then a copy into its slot); one thread pops. When full, a
// push fails at once (the caller counts the drop) instead of waiting.
// Each slot's sequence number says whose turn it is: equal to a producer's
// position when free for it, position + 1 once filled, position + N once
// the consumer has emptied it for the next lap.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>

namespace shunt::telemetry {

template <typename T, size_t N>
class MpscRing {
  static_assert(N >= 2 && (N & (N - 1)) == 0, "N is a power of two");

 public:
  MpscRing() {
    for (size_t i = 0; i < N; i++) slots_[i].seq.store(i, std::memory_order_relaxed);
  }
  MpscRing(const MpscRing&) = delete;
  MpscRing& operator=(const MpscRing&) = delete;

  // fill(T&) writes the entry in place. False when the ring is full.
  template <typename F>
  bool push(F&& fill) {
    size_t pos = head_.load(std::memory_order_relaxed);
    for (;;) {
      Slot& s = slots_[pos & (N - 1)];
      size_t seq = s.seq.load(std::memory_order_acquire);
      auto dif = static_cast<intptr_t>(seq) - static_cast<intptr_t>(pos);
      if (dif == 0) {
        if (head_.compare_exchange_weak(pos, pos + 1, std::memory_order_relaxed)) {
          fill(s.value);
          s.seq.store(pos + 1, std::memory_order_release);
          return true;
        }
      } else if (dif < 0) {
        return false;  // the consumer has not emptied this slot yet: full
      } else {
        pos = head_.load(std::memory_order_relaxed);
      }
    }
  }

  // Consumer only: hands the oldest entry to use(const T&). False if empty.
  template <typename F>
  bool pop(F&& use) {
    Slot& s = slots_[tail_ & (N - 1)];
    if (s.seq.load(std::memory_order_acquire) != tail_ + 1) return false;
    use(static_cast<const T&>(s.value));
    s.seq.store(tail_ + N, std::memory_order_release);
    tail_++;
    return true;
  }

  // In a forked child only (no other thread): forget entries in flight.
  void reset() {
    for (size_t i = 0; i < N; i++) slots_[i].seq.store(i, std::memory_order_relaxed);
    head_.store(0, std::memory_order_relaxed);
    tail_ = 0;
  }

 private:
  struct Slot {
    std::atomic<size_t> seq;
    T value;
  };
  Slot slots_[N];
  alignas(64) std::atomic<size_t> head_{0};
  alignas(64) size_t tail_ = 0;
};

}  // namespace shunt::telemetry
