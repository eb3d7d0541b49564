// Data that proves itself: every byte a rank sends is a function of
// (source rank, destination rank, iteration, offset), so the receiver can
// recompute it and count each byte that differs.
#pragma once
#include <cstddef>
#include <cstdint>

namespace bench {

// Byte streams (alltoall, sendrecv); offsets are relative to the chunk start.
void fill_bytes(char* p, size_t len, int src, int dst, uint64_t iter);
uint64_t count_wrong_bytes(const char* p, size_t len, int src, int dst, uint64_t iter);

// Float vectors summed across ranks (allreduce). Values are small integers,
// so every partial sum is exact in any order and the result can be checked
// for equality.
void fill_floats(float* p, size_t count, int rank, uint64_t iter);
uint64_t count_wrong_floats(const float* p, size_t count, int world, uint64_t iter);

}  // namespace bench
