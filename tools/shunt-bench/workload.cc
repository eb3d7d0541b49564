#include "tools/shunt-bench/workload.h"

#include <cstring>

#include "tools/shunt-bench/check.h"

namespace bench {
namespace {

// Every rank sends chunk j of its send buffer to rank j and receives chunk i
// from rank i into slot i of its receive buffer: bytes = n chunks.
class AllToAll final : public Workload {
 public:
  using Workload::Workload;
  const char* type() const override { return "uint8"; }
  const char* redop() const override { return "none"; }
  size_t elem_size() const override { return 1; }
  size_t round_bytes(size_t b) const override { return b / world_ * world_; }
  double bus_factor() const override { return double(world_ - 1) / world_; }
  size_t sent_offset(size_t bytes) const override {
    size_t c = bytes / world_;
    return c * (world_ > 1 ? 1 : 0) + c / 2;  // the chunk for rank 1
  }

  void fill(Transport& t, size_t bytes, uint64_t iter) override {
    size_t c = bytes / world_;
    for (int j = 0; j < world_; j++) fill_bytes(t.base() + send_off() + j * c, c, rank_, j, iter);
  }

  void run(Transport& t, size_t bytes) override {
    size_t c = bytes / world_;
    sends_.clear();
    recvs_.clear();
    // Start with the next rank so every rank is not hitting rank 0 at once.
    for (int k = 1; k < world_; k++) {
      int to = (rank_ + k) % world_, from = (rank_ - k + world_) % world_;
      sends_.push_back({to, send_off() + to * c, c, recv_off() + rank_ * c});
      recvs_.push_back({from, recv_off() + from * c, c});
    }
    std::memcpy(t.base() + recv_off() + rank_ * c, t.base() + send_off() + rank_ * c, c);
    t.exchange(sends_, recvs_);
  }

  uint64_t verify(Transport& t, size_t bytes, uint64_t iter) override {
    size_t c = bytes / world_;
    uint64_t wrong = 0;
    for (int i = 0; i < world_; i++)
      wrong += count_wrong_bytes(t.base() + recv_off() + i * c, c, i, rank_, iter);
    return wrong;
  }

 private:
  std::vector<SendOp> sends_;
  std::vector<RecvOp> recvs_;
};

// Every rank sends its whole buffer to the next rank and receives the
// previous rank's.
class SendRecv final : public Workload {
 public:
  using Workload::Workload;
  const char* type() const override { return "uint8"; }
  const char* redop() const override { return "none"; }
  size_t elem_size() const override { return 1; }
  size_t round_bytes(size_t b) const override { return world_ > 1 ? b : 0; }
  double bus_factor() const override { return 1.0; }

  void fill(Transport& t, size_t bytes, uint64_t iter) override {
    fill_bytes(t.base() + send_off(), bytes, rank_, next(), iter);
  }
  void run(Transport& t, size_t bytes) override {
    t.exchange({{next(), send_off(), bytes, recv_off()}}, {{prev(), recv_off(), bytes}});
  }
  uint64_t verify(Transport& t, size_t bytes, uint64_t iter) override {
    return count_wrong_bytes(t.base() + recv_off(), bytes, prev(), rank_, iter);
  }

 private:
  int next() const { return (rank_ + 1) % world_; }
  int prev() const { return (rank_ - 1 + world_) % world_; }
};

// Ring allreduce (sum of floats): n-1 reduce-scatter steps into the scratch
// chunk, then n-1 allgather steps straight into the neighbour's result.
class AllReduce final : public Workload {
 public:
  using Workload::Workload;
  const char* type() const override { return "float"; }
  const char* redop() const override { return "sum"; }
  size_t elem_size() const override { return sizeof(float); }
  size_t round_bytes(size_t b) const override {
    size_t unit = sizeof(float) * world_;
    return b / unit * unit;
  }
  double bus_factor() const override { return 2.0 * (world_ - 1) / world_; }

  void fill(Transport& t, size_t bytes, uint64_t iter) override {
    fill_floats(reinterpret_cast<float*>(t.base() + send_off()), bytes / sizeof(float), rank_, iter);
  }

  void run(Transport& t, size_t bytes) override {
    char* base = t.base();
    size_t c = bytes / world_;
    int next = (rank_ + 1) % world_, prev = (rank_ - 1 + world_) % world_;
    auto chunk = [&](int i) { return static_cast<size_t>(((i % world_) + world_) % world_) * c; };
    std::memcpy(base + recv_off(), base + send_off(), bytes);
    for (int s = 0; s < world_ - 1; s++) {
      size_t out = chunk(rank_ - s), in = chunk(rank_ - s - 1);
      t.exchange({{next, recv_off() + out, c, scratch_off()}}, {{prev, scratch_off(), c}});
      float* acc = reinterpret_cast<float*>(base + recv_off() + in);
      const float* add = reinterpret_cast<const float*>(base + scratch_off());
      for (size_t k = 0; k < c / sizeof(float); k++) acc[k] += add[k];
    }
    for (int s = 0; s < world_ - 1; s++) {
      size_t out = chunk(rank_ + 1 - s), in = chunk(rank_ - s);
      t.exchange({{next, recv_off() + out, c, recv_off() + out}}, {{prev, recv_off() + in, c}});
    }
  }

  uint64_t verify(Transport& t, size_t bytes, uint64_t iter) override {
    return count_wrong_floats(reinterpret_cast<const float*>(t.base() + recv_off()), bytes / sizeof(float),
                              world_, iter);
  }
};

}  // namespace

std::unique_ptr<Workload> make_workload(Pattern p, int rank, int world, size_t max_bytes) {
  switch (p) {
    case Pattern::alltoall: return std::make_unique<AllToAll>(rank, world, max_bytes);
    case Pattern::sendrecv: return std::make_unique<SendRecv>(rank, world, max_bytes);
    case Pattern::allreduce: return std::make_unique<AllReduce>(rank, world, max_bytes);
  }
  return nullptr;
}

void corrupt_one_byte(Transport& t, const Workload& w, size_t bytes, int rank) {
  if (rank != 0 || bytes == 0) return;
  t.base()[w.send_off() + w.sent_offset(bytes)] ^= 0x5a;
}

}  // namespace bench
