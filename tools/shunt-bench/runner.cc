#include "tools/shunt-bench/runner.h"

#include <algorithm>
#include <cstring>
#include <string>

#include <unistd.h>

#include "tools/shunt-bench/bootstrap.h"
#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/timeline.h"
#include "tools/shunt-bench/transport.h"
#include "tools/shunt-bench/workload.h"

namespace bench {
namespace {

struct RankStats {
  double avg_s;
  uint64_t wrong;
  uint64_t iters;
};

// In duration mode rank 0 alone decides when to stop, so every rank runs
// the same number of iterations. It also says how many iterations to run
// before asking again (about every kAskEveryS, and so that the last stride
// ends at the deadline), so the question costs a bootstrap round trip per
// half second rather than per iteration. The question is outside the timed
// part, but it lines the ranks up: rank 0 starts the next iteration as it
// answers, the others a one-way TCP delay later, and rank 0's iteration
// waits for them. Asked every 20 ms, that was every iteration of a 1 MiB
// sendrecv on soft-RoCE guests (75 ms each; the bootstrap connection's
// round trip 1.4-4.4 ms there, by `ss`): a percent or more of every timed
// iteration was that connection's latency, and whatever slowed it (MPTCP
// subflows, a busy guest) read as slower RDMA.
constexpr double kAskEveryS = 0.5;
uint64_t keep_going(Bootstrap& bs, double deadline, double per_iter_s, const std::string& stop_file) {
  uint64_t next = 0;
  if (bs.rank() == 0 && (stop_file.empty() || access(stop_file.c_str(), F_OK) != 0)) {
    double left = deadline - steady_now();
    if (left > 0) {
      double stride = per_iter_s > 0 ? std::min(kAskEveryS, left) / per_iter_s : 1;
      next = static_cast<uint64_t>(std::clamp(stride, 1.0, 1000.0));
    }
  }
  auto all = bs.allgather(std::string(reinterpret_cast<const char*>(&next), sizeof next));
  if (all[0].size() != sizeof next) throw BenchError("bootstrap: bad stop message");
  std::memcpy(&next, all[0].data(), sizeof next);
  return next;
}

}  // namespace

std::vector<size_t> sweep_sizes(const Options& o) {
  std::vector<size_t> out;
  if (o.min_bytes > o.max_bytes) throw BenchError("-b must not exceed -e");
  if (o.min_bytes == o.max_bytes) return {o.min_bytes};
  if (o.factor <= 1) throw BenchError("-f must be > 1 when -b < -e");
  for (double s = static_cast<double>(o.min_bytes); s <= static_cast<double>(o.max_bytes) * (1 + 1e-12); s *= o.factor)
    out.push_back(static_cast<size_t>(s));
  return out;
}

void run_sweep(const Options& o, Bootstrap& bs, Transport& t, Workload& w, RunSummary& sum,
               const std::function<void(const SizeResult&)>& on_row) {
  uint64_t iter = 0;  // the same sequence on every rank: seeds the check pattern
  for (size_t requested : sweep_sizes(o)) {
    size_t bytes = w.round_bytes(requested);
    if (bytes == 0) continue;
    for (int i = 0; i < o.warmup; i++, iter++) w.run(t, bytes);
    bs.barrier();

    double busy = 0;
    uint64_t wrong = 0, n = 0;
    double deadline = steady_now() + o.duration_s, started = steady_now();
    uint64_t until = 0;  // duration mode: iterations agreed so far
    for (;; n++, iter++) {
      if (o.duration_s > 0) {
        if (n == until) {
          uint64_t more = keep_going(bs, deadline, n ? (steady_now() - started) / n : 0, o.stop_file);
          if (more == 0) break;
          until += more;
        }
      } else if (n >= static_cast<uint64_t>(o.iters)) {
        break;
      }
      if (o.check) {
        w.fill(t, bytes, iter);
        if (o.corrupt) corrupt_one_byte(t, w, bytes, bs.rank());
      }
      double t0 = steady_now();
      w.run(t, bytes);
      busy += steady_now() - t0;
      if (o.check) wrong += w.verify(t, bytes, iter);
      if (o.compute_ms > 0) usleep(static_cast<useconds_t>(o.compute_ms) * 1000);
    }

    RankStats mine{n ? busy / n : 0, wrong, n};
    auto all = bs.allgather(std::string(reinterpret_cast<const char*>(&mine), sizeof mine));
    SizeResult r;
    r.bytes = bytes;
    r.count = bytes / w.elem_size();
    r.iters = n;
    double slowest = 0;
    for (const auto& b : all) {
      RankStats s;
      if (b.size() != sizeof s) throw BenchError("bootstrap: bad stats blob");
      std::memcpy(&s, b.data(), sizeof s);
      slowest = std::max(slowest, s.avg_s);
      r.wrong += s.wrong;
    }
    r.time_us = slowest * 1e6;
    r.algbw = slowest > 0 ? bytes / slowest / 1e9 : 0;
    r.busbw = r.algbw * w.bus_factor();
    sum.rows.push_back(r);
    on_row(r);
  }
}

}  // namespace bench
