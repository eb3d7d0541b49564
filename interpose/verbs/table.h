// A fixed-size, lock-free-for-readers open-addressing map from a 64-bit key
// to a pointer. Writers (create/destroy, the control path) take a mutex;
// readers on the hot path only load atomics. Removed slots become
// tombstones so probe chains stay intact.
#pragma once
#include <atomic>
#include <cstdint>
#include <mutex>

namespace shunt {

template <typename V, unsigned kLog2 = 14>
class PtrTable {
 public:
  static constexpr uint64_t kEmpty = 0, kTomb = 1;
  static constexpr unsigned kCap = 1u << kLog2;

  V* find(uint64_t key) const {
    unsigned i = slot(key);
    for (unsigned n = 0; n < kCap; n++, i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_acquire);
      if (k == key) return vals_[i].load(std::memory_order_acquire);
      if (k == kEmpty) return nullptr;
    }
    return nullptr;
  }

  // Returns false when full (the caller then leaves the object untracked).
  bool insert(uint64_t key, V* v) {
    std::lock_guard lk(mu_);
    if (used_ + 1 >= kCap - kCap / 8) return false;
    unsigned i = slot(key);
    for (;; i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_relaxed);
      if (k == kEmpty || k == kTomb || k == key) {
        vals_[i].store(v, std::memory_order_release);
        if (k != key) {
          keys_[i].store(key, std::memory_order_release);
          if (k == kEmpty) used_++;
        }
        return true;
      }
    }
  }

  void erase(uint64_t key) {
    std::lock_guard lk(mu_);
    unsigned i = slot(key);
    for (unsigned n = 0; n < kCap; n++, i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_relaxed);
      if (k == key) {
        keys_[i].store(kTomb, std::memory_order_release);
        return;
      }
      if (k == kEmpty) return;
    }
  }

 private:
  static unsigned slot(uint64_t key) {
    return static_cast<unsigned>((key * 0x9E3779B97F4A7C15ull) >> (64 - kLog2));
  }
  std::atomic<uint64_t> keys_[kCap]{};
  std::atomic<V*> vals_[kCap]{};
  std::mutex mu_;
  unsigned used_ = 0;  // slots ever filled (tombstones included)
};

}  // namespace shunt
