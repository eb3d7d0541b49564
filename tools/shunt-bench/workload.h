// The collective patterns, written as steps of sends and receives over a
// Transport. Every rank runs the same sequence, so sizes, offsets and
// iteration numbers agree without further messages.
//
// Region layout (same on every rank, max = the largest size of the sweep):
//   [0, max)       send buffer
//   [max, 2 max)   receive buffer
//   [2 max, 3 max) scratch (allreduce: the chunk being reduced)
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tools/shunt-bench/options.h"
#include "tools/shunt-bench/transport.h"

namespace bench {

class Workload {
 public:
  Workload(int rank, int world, size_t max_bytes) : rank_(rank), world_(world), max_(max_bytes) {}
  virtual ~Workload() = default;

  virtual const char* type() const = 0;   // element type column
  virtual const char* redop() const = 0;  // reduction column
  virtual size_t elem_size() const = 0;
  // The size actually moved for a requested size (whole elements, divisible
  // by the number of chunks the pattern cuts it into); 0 = skip this size.
  virtual size_t round_bytes(size_t requested) const = 0;
  // busbw / algbw for this pattern and world size.
  virtual double bus_factor() const = 0;

  // Writes the check pattern for iteration `iter` into the send buffer.
  virtual void fill(Transport& t, size_t bytes, uint64_t iter) = 0;
  // The measured part: one collective of `bytes`.
  virtual void run(Transport& t, size_t bytes) = 0;
  // Counts wrong bytes (elements for reductions) in the receive buffer.
  virtual uint64_t verify(Transport& t, size_t bytes, uint64_t iter) = 0;
  // An offset in the send buffer whose byte reaches another rank.
  virtual size_t sent_offset(size_t bytes) const { return bytes / 2; }

  // Region a sweep up to max_bytes needs.
  size_t region_bytes() const { return 3 * max_; }
  size_t send_off() const { return 0; }
  size_t recv_off() const { return max_; }
  size_t scratch_off() const { return 2 * max_; }

 protected:
  int rank_, world_;
  size_t max_;
};

std::unique_ptr<Workload> make_workload(Pattern p, int rank, int world, size_t max_bytes);

// Test hook behind --corrupt: damages one byte that rank 0 sends.
void corrupt_one_byte(Transport& t, const Workload& w, size_t bytes, int rank);

}  // namespace bench
