// Logging: spdlog behind a small interface so that only log.cc pays for it.
// Lines are prefixed "host:pid:tid shunt"; a message is written on one line
// (control bytes escaped) of at most 4 KiB. Never call from the hot path.
#pragma once
#include <fmt/format.h>

#include <atomic>
#include <string>
#include <string_view>

#include "core/config.h"

namespace shunt::log {

extern std::atomic<int> g_level;  // a LogLevel

inline bool enabled(LogLevel l) { return static_cast<int>(l) >= g_level.load(std::memory_order_relaxed); }

// Sets level and destination (file pattern with %h/%p, empty = stderr).
void configure(LogLevel level, const std::string& file_pattern);
void write(LogLevel level, std::string_view msg);
// pthread_atfork handlers; the child re-opens a %p-named log file.
void prepare_fork();
void after_fork_parent();
void after_fork_child();

template <typename... A>
void at(LogLevel l, fmt::format_string<A...> f, A&&... a) {
  if (enabled(l)) write(l, fmt::format(f, std::forward<A>(a)...));
}
template <typename... A>
void debug(fmt::format_string<A...> f, A&&... a) { at(LogLevel::debug, f, std::forward<A>(a)...); }
template <typename... A>
void info(fmt::format_string<A...> f, A&&... a) { at(LogLevel::info, f, std::forward<A>(a)...); }
template <typename... A>
void warn(fmt::format_string<A...> f, A&&... a) { at(LogLevel::warn, f, std::forward<A>(a)...); }
template <typename... A>
void error(fmt::format_string<A...> f, A&&... a) { at(LogLevel::error, f, std::forward<A>(a)...); }

// Logs `msg` at `level` the first time `key` is seen in this process.
void once(LogLevel level, std::string_view key, std::string_view msg);

}  // namespace shunt::log

namespace shunt {

// Runs the body of one of shunt's threads so that nothing it throws (a
// peer's reply of an unexpected shape read with json::value(), a failed
// allocation) ends the application's process, as an uncaught exception in
// any thread would: it is logged once under `what`, and `on_throw` runs.
template <typename F, typename G>
void contained(std::string_view what, F&& body, G&& on_throw) noexcept {
  std::string why;
  try {
    body();
    return;
  } catch (const std::exception& e) {
    try {
      why = e.what();
    } catch (...) {
    }
  } catch (...) {
    why = "an unknown exception";
  }
  try {
    log::once(LogLevel::error, what, std::string(what) + " stopped: " + why);
    on_throw(why);
  } catch (...) {
  }
}

}  // namespace shunt
