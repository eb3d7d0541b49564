#include "tools/shunt-bench/check.h"

#include <cstring>

namespace bench {
namespace {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline uint64_t stream_seed(int src, int dst, uint64_t iter) {
  return mix64((static_cast<uint64_t>(src) << 48) ^ (static_cast<uint64_t>(dst) << 32) ^ iter);
}

inline float float_value(int rank, uint64_t iter, size_t idx) {
  uint64_t h = mix64(iter * 0x100000001b3ull ^ idx);
  int base = static_cast<int>(h % 61) - 30;
  int per_rank = static_cast<int>((static_cast<uint64_t>(rank) * 7 + idx) % 13);
  return static_cast<float>(base + per_rank);
}

}  // namespace

void fill_bytes(char* p, size_t len, int src, int dst, uint64_t iter) {
  uint64_t seed = stream_seed(src, dst, iter);
  size_t words = len / 8;
  for (size_t i = 0; i < words; i++) {
    uint64_t w = mix64(seed + i);
    std::memcpy(p + i * 8, &w, 8);
  }
  if (len % 8) {
    uint64_t w = mix64(seed + words);
    std::memcpy(p + words * 8, &w, len % 8);
  }
}

uint64_t count_wrong_bytes(const char* p, size_t len, int src, int dst, uint64_t iter) {
  uint64_t seed = stream_seed(src, dst, iter);
  uint64_t wrong = 0;
  size_t words = len / 8;
  for (size_t i = 0; i <= words; i++) {
    size_t n = i < words ? 8 : len % 8;
    if (n == 0) break;
    uint64_t want = mix64(seed + i), got = 0;
    std::memcpy(&got, p + i * 8, n);
    if (n < 8) want &= (1ull << (n * 8)) - 1;
    if (got == want) continue;
    for (uint64_t d = got ^ want; d; d >>= 8) wrong += (d & 0xff) != 0;
  }
  return wrong;
}

void fill_floats(float* p, size_t count, int rank, uint64_t iter) {
  for (size_t i = 0; i < count; i++) p[i] = float_value(rank, iter, i);
}

uint64_t count_wrong_floats(const float* p, size_t count, int world, uint64_t iter) {
  uint64_t wrong = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0;
    for (int r = 0; r < world; r++) want += float_value(r, iter, i);
    wrong += p[i] != want;
  }
  return wrong;
}

}  // namespace bench
