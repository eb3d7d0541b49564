// Process-wide state of the preloaded library: lazy initialization, the mode
// in force, the re-entry guard and real-symbol resolution.
#pragma once
#include <atomic>
#include <string>

#include "core/config.h"

namespace shunt {

// Mode in force; Mode::off until init has run. Read on every wrapped call.
extern std::atomic<int> g_mode;
inline Mode current_mode() { return static_cast<Mode>(g_mode.load(std::memory_order_relaxed)); }

// Runs initialization once (constructor, or the first wrapper called before
// it, e.g. from another library's constructor). Safe to call from anywhere;
// a call that re-enters from inside initialization returns at once.
void ensure_init();
const Config& config();
bool initialized();
// Why shunt turned itself off for this process at start (the first bad
// setting's message), or "" when it did not.
const std::string& off_reason();

// Thread-local re-entry guard: wrappers that find it set pass straight to the
// real function, so shunt's own sockets, logging and allocation never loop.
struct ReentryGuard {
  ReentryGuard();
  ~ReentryGuard();
  ReentryGuard(const ReentryGuard&) = delete;
  ReentryGuard& operator=(const ReentryGuard&) = delete;
  bool nested() const { return was_; }

 private:
  bool was_;
};
bool in_shunt();

// The next definition of `name` after libshunt (the real one): RTLD_NEXT by
// version, then unversioned, then the named library directly (for when
// libshunt was dlopen'd without RTLD_GLOBAL). Never returns libshunt's own.
void* resolve_real(const char* name, const char* version, const char* lib, void* self);

// Lazily resolved pointer to the real function; resolution is idempotent, so
// racing threads just store the same value.
template <typename F>
F* real_fn(std::atomic<void*>& slot, const char* name, const char* version, const char* lib,
           void* self) {
  void* p = slot.load(std::memory_order_acquire);
  if (__builtin_expect(p == nullptr, 0)) {
    p = resolve_real(name, version, lib, self);
    slot.store(p, std::memory_order_release);
  }
  return reinterpret_cast<F*>(p);
}

// The real `fn` of library `lib` (default version `ver`, or null), resolved
// once per call site; the exports.cc files each name their library.
#define SHUNT_REAL_IN(lib, fn, ver)                                                                   \
  ([]() {                                                                                             \
    static std::atomic<void*> slot{nullptr};                                                          \
    return ::shunt::real_fn<decltype(fn)>(slot, #fn, ver, lib, reinterpret_cast<void*>(&(fn)));       \
  }())

// Process identity, refreshed in a forked child.
int self_pid();
bool is_forked_child();  // true in a child of a process where shunt ran

// Registers fork handlers of a part (run after the logger's in prepare,
// before it in parent/child). Safe from static initializers: the table is
// constant-initialized. At most 8.
void on_fork(void (*prepare)(), void (*parent)(), void (*child)());

// Registers a hook run at exit (stats file writers). Called in init order.
void at_exit(void (*fn)());

}  // namespace shunt
