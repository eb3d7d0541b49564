// Observe-mode counters of one QP (or of a context's QPs shunt did not see
// created). The per-WR counters are sharded by thread: each of the first
// kShards posting threads owns a shard and adds with a plain load and store
// (no locked instruction on the hot path); later threads share one more
// shard with atomic adds. Readers sum the shards. Exact in every case.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

namespace shunt::verbs {

constexpr int kWrOpcodes = 16;   // enum ibv_wr_opcode is below this
constexpr int kWcStatuses = 32;  // enum ibv_wc_status is below this
constexpr int kShards = 8;

struct alignas(64) HotCounters {
  std::atomic<uint64_t> send_wrs[kWrOpcodes]{};
  std::atomic<uint64_t> send_bytes{0};
  std::atomic<uint64_t> sig_sends{0};  // signaled send WRs posted (busy.h)
  std::atomic<uint64_t> send_done{0};  // successful send completions
  std::atomic<uint64_t> recv_wrs{0};
  std::atomic<uint64_t> completions{0};
  std::atomic<uint64_t> recv_completions{0};
  std::atomic<uint64_t> recv_bytes{0};
};

struct QpStats {
  HotCounters hot[kShards + 1];  // [kShards] is the shared one
  std::atomic<uint64_t> send_post_errors{0};
  std::atomic<uint64_t> recv_post_errors{0};
  std::atomic<uint64_t> wc_status[kWcStatuses]{};  // errors only; [0] unused
};

// This thread's shard: 0..kShards-1 owned by it alone, or kShards (shared).
int thread_shard();

// Adds to a counter of the given shard: plain store when the shard is this
// thread's own, atomic add on the shared one.
inline void bump(std::atomic<uint64_t>& c, uint64_t n, bool exclusive) {
  if (exclusive)
    c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
  else
    c.fetch_add(n, std::memory_order_relaxed);
}
inline void add(std::atomic<uint64_t>& c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }
inline uint64_t get(const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); }

// Sum of one hot counter over the shards, e.g.
//   total(s, [](const HotCounters& h) -> auto& { return h.send_bytes; })
template <typename F>
uint64_t total(const QpStats& s, F field) {
  uint64_t t = 0;
  for (const auto& h : s.hot) t += get(field(h));
  return t;
}

const char* wr_opcode_name(int op);

}  // namespace shunt::verbs
