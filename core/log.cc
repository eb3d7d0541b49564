#include "core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <mutex>
#include <set>

namespace shunt::log {

std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};

namespace {
constexpr size_t kMaxLineBytes = 4096;

// Logging may be used before this file's static initializers have run (the
// library constructor, or a wrapper called from another library's
// constructor), so its state is built on first use.
struct State {
  std::mutex mu;
  std::shared_ptr<spdlog::logger> logger;  // guarded by mu
  std::string pattern;
  std::set<std::string, std::less<>> once;
};
State& st() {
  static State* s = new State;  // never destroyed: wrappers may log during exit
  return *s;
}

spdlog::level::level_enum to_spd(LogLevel l) {
  switch (l) {
    case LogLevel::trace: return spdlog::level::trace;
    case LogLevel::debug: return spdlog::level::debug;
    case LogLevel::info: return spdlog::level::info;
    case LogLevel::warn: return spdlog::level::warn;
    case LogLevel::error: return spdlog::level::err;
    case LogLevel::off: return spdlog::level::off;
  }
  return spdlog::level::off;
}

// Builds the logger; caller holds g_mu. The logger is not registered with
// spdlog's global registry so that an application's own spdlog is untouched.
void open_locked(State& s) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  spdlog::sink_ptr sink;
  if (!s.pattern.empty()) {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(expand_pattern(s.pattern, getpid()));
    } catch (const std::exception& e) {
      fprintf(stderr, "%s:%d shunt: SHUNT_LOG_FILE: %s; logging to stderr\n", host, getpid(), e.what());
    }
  }
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  s.logger = std::make_shared<spdlog::logger>("shunt", sink);
  s.logger->set_pattern(std::string(host) + ":%P:%t shunt %l: %v");
  s.logger->set_level(spdlog::level::trace);
  s.logger->flush_on(spdlog::level::trace);
}
}  // namespace

void configure(LogLevel level, const std::string& file_pattern) {
  State& s = st();
  std::lock_guard lk(s.mu);
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
  s.pattern = file_pattern;
  s.logger.reset();
}

void write(LogLevel level, std::string_view msg) {
  // One event, one line: a value with a newline in it must not forge a second.
  std::string line = printable(msg, kMaxLineBytes);
  State& s = st();
  std::lock_guard lk(s.mu);
  if (!s.logger) open_locked(s);
  s.logger->log(to_spd(level), line);
}

// Holding the mutex across fork() means no other thread is inside a sink,
// so the child inherits every spdlog mutex unlocked.
void prepare_fork() { st().mu.lock(); }
void after_fork_parent() { st().mu.unlock(); }
void after_fork_child() {
  State& s = st();
  if (s.pattern.find("%p") != std::string::npos) s.logger.reset();
  s.mu.unlock();
}

void once(LogLevel level, std::string_view key, std::string_view msg) {
  {
    State& s = st();
    std::lock_guard lk(s.mu);
    if (!s.once.emplace(key).second) return;
  }
  if (enabled(level)) write(level, msg);
}

}  // namespace shunt::log
