// The two fences of a seqlock. A reader's second read of the sequence word
// must not move above its data reads, and a writer's odd sequence value
// must be visible before its data stores. Fences do that for free on x86.
// ThreadSanitizer does not model std::atomic_thread_fence (GCC refuses it
// under -fsanitize=thread), so its builds use a sequentially consistent
// load for the reader (a read-modify-write would fault on a read-only
// mapping, as clock readers have) and an exchange for the writer; every
// field under a seqlock here is itself atomic, so TSan sees no race either way.
#pragma once
#include <atomic>

namespace shunt {

template <typename T>
inline T seq_reread(const std::atomic<T>& seq) {
#if defined(__SANITIZE_THREAD__)
  return seq.load(std::memory_order_seq_cst);
#else
  std::atomic_thread_fence(std::memory_order_acquire);
  return seq.load(std::memory_order_relaxed);
#endif
}

template <typename T>
inline void seq_begin_write(std::atomic<T>& seq, T odd) {
#if defined(__SANITIZE_THREAD__)
  seq.exchange(odd, std::memory_order_acq_rel);
#else
  seq.store(odd, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
#endif
}

}  // namespace shunt
