// Observe-mode counters of one QP (or of a context's QPs shunt did not see
// created). Relaxed atomics: exact under any number of posting threads.
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>

namespace shunt::verbs {

constexpr int kWrOpcodes = 16;  // enum ibv_wr_opcode is below this
constexpr int kWcStatuses = 32;  // enum ibv_wc_status is below this

struct QpStats {
  std::atomic<uint64_t> send_wrs[kWrOpcodes]{};
  std::atomic<uint64_t> send_bytes{0};
  std::atomic<uint64_t> send_post_errors{0};
  std::atomic<uint64_t> recv_wrs{0};
  std::atomic<uint64_t> recv_post_errors{0};
  std::atomic<uint64_t> completions{0};
  std::atomic<uint64_t> recv_completions{0};
  std::atomic<uint64_t> recv_bytes{0};
  std::atomic<uint64_t> wc_status[kWcStatuses]{};  // errors only; [0] unused
};

inline void add(std::atomic<uint64_t>& c, uint64_t n) { c.fetch_add(n, std::memory_order_relaxed); }
inline uint64_t get(const std::atomic<uint64_t>& c) { return c.load(std::memory_order_relaxed); }

const char* wr_opcode_name(int op);

}  // namespace shunt::verbs
