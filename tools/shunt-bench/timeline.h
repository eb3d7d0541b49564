// Throughput over wall time. A sampler thread reads the transport's relaxed
// byte counter every interval; the hot path only ever does the atomic add.
#pragma once
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "tools/shunt-bench/transport.h"

namespace bench {

struct Sample {
  double wall;     // seconds since the epoch, end of the interval
  double t;        // seconds since the timeline started
  uint64_t bytes;  // delivered in the interval
  double gbps;     // bytes / interval / 1e9
  uint64_t errors; // cumulative transport errors
};

class Timeline {
 public:
  // live: print each row as it is taken (prefixed "#T") to `out`.
  Timeline(const Progress& prog, int interval_ms, FILE* live_out);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  void start();
  void stop();  // takes a last, partial sample
  double start_wall() const { return start_wall_; }
  int interval_ms() const { return interval_ms_; }
  const std::vector<Sample>& samples() const { return samples_; }  // after stop()
  // CPU time the sampler thread used: an upper bound on what --timeline costs.
  double sampler_cpu_s() const { return sampler_cpu_s_; }

  static void print_header(FILE* out, int interval_ms);
  static void print_row(FILE* out, const Sample& s);

 private:
  void loop();
  void take(double t_now_steady);

  const Progress& prog_;
  int interval_ms_;
  FILE* live_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  std::vector<Sample> samples_;
  double start_wall_ = 0, start_steady_ = 0, last_steady_ = 0;
  uint64_t last_bytes_ = 0;
  double sampler_cpu_s_ = 0;
};

double wall_now();
double steady_now();

}  // namespace bench
