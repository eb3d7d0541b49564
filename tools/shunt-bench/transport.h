// What a pattern asks of the network: move byte ranges of one registered
// region between ranks. A pattern describes one step as the sends and
// receives of this rank; exchange() returns when all of them have completed.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "tools/shunt-bench/options.h"

namespace bench {

class Bootstrap;

struct SendOp {
  int peer;
  size_t local_off;   // source, in this rank's region
  size_t len;
  size_t remote_off;  // destination, in the peer's region (one-sided verbs)
};

struct RecvOp {
  int peer;
  size_t local_off;  // destination, in this rank's region
  size_t len;        // must equal the matching SendOp's len
};

// Read by the timeline sampler while the transport runs. The transport's
// thread is the only writer of `bytes`, so counting is a relaxed load and
// store (no locked instruction): the hot path pays one plain add per
// completed chunk, with or without a timeline.
struct Progress {
  std::atomic<uint64_t> bytes{0};   // bytes delivered (tcp: received; verbs: acknowledged)
  std::atomic<uint64_t> errors{0};  // failed operations (completions in error, socket errors)
  void delivered(uint64_t n) { bytes.store(bytes.load(std::memory_order_relaxed) + n, std::memory_order_relaxed); }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual char* base() = 0;
  virtual size_t region_bytes() const = 0;
  // Throws BenchError on a transport failure (after counting it in Progress).
  virtual void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) = 0;
  virtual std::string describe() const = 0;
};

std::unique_ptr<Transport> make_tcp_transport(const Options& o, Bootstrap& bs, size_t region,
                                              Progress& prog);
std::unique_ptr<Transport> make_verbs_transport(const Options& o, Bootstrap& bs, size_t region,
                                                Progress& prog);

}  // namespace bench
