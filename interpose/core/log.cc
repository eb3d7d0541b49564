#include "interpose/core/log.h"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <mutex>
#include <set>

namespace shunt::log {

std::atomic<int> g_level{static_cast<int>(LogLevel::warn)};

namespace {
std::mutex g_mu;
std::shared_ptr<spdlog::logger> g_logger;  // guarded by g_mu
std::string g_pattern;
std::set<std::string, std::less<>> g_once;

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
void open_locked() {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  spdlog::sink_ptr sink;
  if (!g_pattern.empty()) {
    try {
      sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(expand_pattern(g_pattern, getpid()));
    } catch (const std::exception& e) {
      fprintf(stderr, "%s:%d shunt: SHUNT_LOG_FILE: %s; logging to stderr\n", host, getpid(), e.what());
    }
  }
  if (!sink) sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  g_logger = std::make_shared<spdlog::logger>("shunt", sink);
  g_logger->set_pattern(std::string(host) + ":%P:%t shunt %l: %v");
  g_logger->set_level(spdlog::level::trace);
  g_logger->flush_on(spdlog::level::trace);
}
}  // namespace

void configure(LogLevel level, const std::string& file_pattern) {
  std::lock_guard lk(g_mu);
  g_level.store(static_cast<int>(level), std::memory_order_relaxed);
  g_pattern = file_pattern;
  g_logger.reset();
}

void write(LogLevel level, std::string_view msg) {
  std::lock_guard lk(g_mu);
  if (!g_logger) open_locked();
  g_logger->log(to_spd(level), msg);
}

// Holding g_mu across fork() means no other thread is inside a sink, so the
// child inherits every spdlog mutex unlocked.
void prepare_fork() { g_mu.lock(); }
void after_fork_parent() { g_mu.unlock(); }
void after_fork_child() {
  if (g_pattern.find("%p") != std::string::npos) g_logger.reset();
  g_mu.unlock();
}

void once(LogLevel level, std::string_view key, std::string_view msg) {
  {
    std::lock_guard lk(g_mu);
    if (!g_once.emplace(key).second) return;
  }
  if (enabled(level)) write(level, msg);
}

}  // namespace shunt::log
