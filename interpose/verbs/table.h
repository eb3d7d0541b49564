// A fixed-size open-addressing map from a 64-bit key to a pointer, lock-free
// for readers. Writers (create/destroy, the control path) take a mutex.
// Removed slots become tombstones so probe chains stay intact; when
// tombstones would fill the table, the writer compacts it in place under a
// sequence counter, and a reader that overlapped a compaction looks again.
// So any number of create/destroy cycles fit as long as the live entries do.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "core/seqlock.h"

namespace shunt {

template <typename V, unsigned kLog2 = 14>
class PtrTable {
 public:
  static constexpr uint64_t kEmpty = 0, kTomb = 1;  // never valid keys
  static constexpr unsigned kCap = 1u << kLog2;
  static constexpr unsigned kLimit = kCap - kCap / 8;

  V* find(uint64_t key) const {
    for (;;) {
      uint64_t v1 = seq_.load(std::memory_order_acquire);
      if (v1 & 1) continue;  // a compaction is running: it is short
      V* r = probe(key);
      if (seq_reread(seq_) == v1) return r;
    }
  }

  // Returns false when the live entries fill the table.
  bool insert(uint64_t key, V* v) {
    std::lock_guard lk(mu_);
    unsigned i = slot(key), tomb = kCap;
    for (unsigned n = 0; n < kCap; n++, i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_relaxed);
      if (k == key) {
        vals_[i].store(v, std::memory_order_release);
        return true;
      }
      if (k == kTomb && tomb == kCap) tomb = i;
      if (k == kEmpty) break;
    }
    if (tomb != kCap) {  // reuse the first tombstone on the chain
      put(tomb, key, v);
      live_++;
      return true;
    }
    if (live_ + 1 > kLimit) return false;
    if (filled_ + 1 > kLimit) compact();
    i = slot(key);
    while (keys_[i].load(std::memory_order_relaxed) > kTomb) i = (i + 1) & (kCap - 1);
    if (keys_[i].load(std::memory_order_relaxed) == kEmpty) filled_++;
    put(i, key, v);
    live_++;
    return true;
  }

  void erase(uint64_t key) {
    std::lock_guard lk(mu_);
    unsigned i = slot(key);
    for (unsigned n = 0; n < kCap; n++, i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_relaxed);
      if (k == key) {
        keys_[i].store(kTomb, std::memory_order_release);
        live_--;
        return;
      }
      if (k == kEmpty) return;
    }
  }

 private:
  static unsigned slot(uint64_t key) {
    return static_cast<unsigned>((key * 0x9E3779B97F4A7C15ull) >> (64 - kLog2));
  }
  V* probe(uint64_t key) const {
    unsigned i = slot(key);
    for (unsigned n = 0; n < kCap; n++, i = (i + 1) & (kCap - 1)) {
      uint64_t k = keys_[i].load(std::memory_order_acquire);
      if (k == key) return vals_[i].load(std::memory_order_acquire);
      if (k == kEmpty) return nullptr;
    }
    return nullptr;
  }
  void put(unsigned i, uint64_t key, V* v) {
    vals_[i].store(v, std::memory_order_release);
    keys_[i].store(key, std::memory_order_release);
  }
  // Drops every tombstone; caller holds mu_. Readers retry meanwhile.
  void compact() {
    std::vector<std::pair<uint64_t, V*>> live;
    for (unsigned i = 0; i < kCap; i++) {
      uint64_t k = keys_[i].load(std::memory_order_relaxed);
      if (k > kTomb) live.emplace_back(k, vals_[i].load(std::memory_order_relaxed));
    }
    seq_.fetch_add(1, std::memory_order_acq_rel);  // odd: compaction running
    for (unsigned i = 0; i < kCap; i++) keys_[i].store(kEmpty, std::memory_order_relaxed);
    for (auto& [k, v] : live) {
      unsigned i = slot(k);
      while (keys_[i].load(std::memory_order_relaxed) != kEmpty) i = (i + 1) & (kCap - 1);
      put(i, k, v);
    }
    filled_ = static_cast<unsigned>(live.size());
    seq_.fetch_add(1, std::memory_order_release);
  }

  std::atomic<uint64_t> keys_[kCap]{};
  std::atomic<V*> vals_[kCap]{};
  std::atomic<uint64_t> seq_{0};
  std::mutex mu_;
  unsigned live_ = 0;    // keys present
  unsigned filled_ = 0;  // slots not empty (keys and tombstones)
};

}  // namespace shunt
