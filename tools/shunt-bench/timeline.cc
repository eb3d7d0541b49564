#include "tools/shunt-bench/timeline.h"

#include <time.h>

#include <chrono>

namespace bench {

double wall_now() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

double steady_now() {
  using namespace std::chrono;
  return duration<double>(steady_clock::now().time_since_epoch()).count();
}

Timeline::Timeline(const Progress& prog, int interval_ms, FILE* live_out)
    : prog_(prog), interval_ms_(interval_ms), live_(live_out) {}

Timeline::~Timeline() { stop(); }

void Timeline::start() {
  start_wall_ = wall_now();
  start_steady_ = last_steady_ = steady_now();
  last_bytes_ = prog_.bytes.load(std::memory_order_relaxed);
  samples_.reserve(4096);
  if (live_) print_header(live_, interval_ms_);
  thread_ = std::thread([this] { loop(); });
}

void Timeline::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true, std::memory_order_relaxed);
  thread_.join();
  double now = steady_now();
  if (now - last_steady_ > 1e-3) take(now);
}

void Timeline::loop() {
  auto next = std::chrono::steady_clock::now();
  const auto step = std::chrono::milliseconds(interval_ms_);
  while (!stop_.load(std::memory_order_relaxed)) {
    next += step;
    std::this_thread::sleep_until(next);
    if (stop_.load(std::memory_order_relaxed)) break;
    take(steady_now());
  }
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  sampler_cpu_s_ = ts.tv_sec + ts.tv_nsec * 1e-9;
}

void Timeline::take(double now) {
  uint64_t b = prog_.bytes.load(std::memory_order_relaxed);
  Sample s;
  s.t = now - start_steady_;
  s.wall = start_wall_ + s.t;
  s.bytes = b - last_bytes_;
  s.gbps = s.bytes / (now - last_steady_) / 1e9;
  s.errors = prog_.errors.load(std::memory_order_relaxed);
  last_bytes_ = b;
  last_steady_ = now;
  samples_.push_back(s);
  if (live_) {
    print_row(live_, s);
    fflush(live_);
  }
}

void Timeline::print_header(FILE* out, int interval_ms) {
  fprintf(out, "#T timeline, one row per %d ms: delivered at this rank\n", interval_ms);
  fprintf(out, "#T %17s %9s %14s %9s %7s\n", "wall(s)", "t(s)", "bytes", "GB/s", "errors");
}

void Timeline::print_row(FILE* out, const Sample& s) {
  fprintf(out, "#T %17.3f %9.3f %14llu %9.3f %7llu\n", s.wall, s.t, static_cast<unsigned long long>(s.bytes),
          s.gbps, static_cast<unsigned long long>(s.errors));
}

}  // namespace bench
