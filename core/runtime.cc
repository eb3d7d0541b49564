#include "core/runtime.h"

#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "core/log.h"

extern char** environ;

namespace shunt {

std::atomic<int> g_mode{static_cast<int>(Mode::off)};

namespace {
// 0 = not started, 1 = running, 2 = done.
std::atomic<int> g_init_state{0};
Config* g_config = nullptr;  // leaked on purpose: wrappers may run during exit
std::string* g_off_reason = nullptr;  // set once by init, before g_init_state is 2
std::atomic<int> g_pid{0};
std::atomic<bool> g_forked{false};
std::mutex g_exit_mu;
std::vector<void (*)()>* g_exit_hooks = nullptr;

__attribute__((tls_model("initial-exec"))) thread_local bool tl_in_shunt = false;

void run_exit_hooks() {
  std::vector<void (*)()> hooks;
  {
    std::lock_guard lk(g_exit_mu);
    if (g_exit_hooks) hooks = *g_exit_hooks;
  }
  ReentryGuard g;
  for (auto fn : hooks) fn();
}

struct ForkHooks {
  void (*prepare)(), (*parent)(), (*child)();
};
ForkHooks g_fork_hooks[8];
std::atomic<int> g_fork_hook_count{0};

void on_fork_prepare() {
  log::prepare_fork();
  int n = g_fork_hook_count.load(std::memory_order_acquire);
  for (int i = 0; i < n; i++)
    if (g_fork_hooks[i].prepare) g_fork_hooks[i].prepare();
}
void on_fork_parent() {
  int n = g_fork_hook_count.load(std::memory_order_acquire);
  for (int i = n - 1; i >= 0; i--)
    if (g_fork_hooks[i].parent) g_fork_hooks[i].parent();
  log::after_fork_parent();
}
void on_fork_child() {
  g_pid.store(getpid(), std::memory_order_relaxed);
  g_forked.store(true, std::memory_order_relaxed);
  int n = g_fork_hook_count.load(std::memory_order_acquire);
  for (int i = n - 1; i >= 0; i--)
    if (g_fork_hooks[i].child) g_fork_hooks[i].child();
  log::after_fork_child();
}

void do_init() {
  ReentryGuard g;
  g_pid.store(getpid(), std::memory_order_relaxed);
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  auto* cfg = new Config(load_config([](const char* n) { return getenv(n); }, &errors, &warnings, environ));
  g_config = cfg;
  log::configure(static_cast<LogLevel>(cfg->num(Param::log_level)), cfg->str(Param::log_file));
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  for (auto& e : errors) {
    // Always on stderr, whatever the log level: the operator must see it.
    fprintf(stderr, "%s:%d shunt: %s; shunt is off for this process\n", host, getpid(), e.message.c_str());
    if (!cfg->str(Param::log_file).empty()) log::error("{}; shunt is off for this process", e.message);
  }
  if (!errors.empty()) {
    std::string more = errors.size() > 1 ? " (and " + std::to_string(errors.size() - 1) + " more)" : "";
    g_off_reason = new std::string(errors[0].message + more);
  }
  for (auto& w : warnings) log::warn("{}", w);
  pthread_atfork(on_fork_prepare, on_fork_parent, on_fork_child);
  atexit(run_exit_hooks);
  log::info("shunt {} mode {}", SHUNT_VERSION, cfg->str(Param::mode));
  g_mode.store(static_cast<int>(cfg->mode()), std::memory_order_release);
}
}  // namespace

void ensure_init() {
  if (g_init_state.load(std::memory_order_acquire) == 2) return;
  int expected = 0;
  if (g_init_state.compare_exchange_strong(expected, 1, std::memory_order_acq_rel)) {
    do_init();
    g_init_state.store(2, std::memory_order_release);
    return;
  }
  if (tl_in_shunt) return;  // re-entered from inside init on this thread
  while (g_init_state.load(std::memory_order_acquire) != 2) sched_yield();
}

bool initialized() { return g_init_state.load(std::memory_order_acquire) == 2; }

// (The fallbacks below are never destroyed, like all of shunt's state: its
// threads may read them while exit() runs the static destructors.)
const std::string& off_reason() {
  static const std::string& none = *new std::string;
  return initialized() && g_off_reason ? *g_off_reason : none;
}

const Config& config() {
  static const Config& defaults = *new Config;
  return g_config ? *g_config : defaults;
}

ReentryGuard::ReentryGuard() : was_(tl_in_shunt) { tl_in_shunt = true; }
ReentryGuard::~ReentryGuard() { tl_in_shunt = was_; }
bool in_shunt() { return tl_in_shunt; }

void* resolve_real(const char* name, const char* version, const char* lib, void* self) {
  void* p = version ? dlvsym(RTLD_NEXT, name, version) : nullptr;
  if (!p || p == self) p = dlsym(RTLD_NEXT, name);
  if (!p || p == self) {
    void* h = dlopen(lib, RTLD_LAZY | RTLD_NOLOAD);
    if (!h) h = dlopen(lib, RTLD_LAZY);
    if (h) {
      p = version ? dlvsym(h, name, version) : nullptr;
      if (!p) p = dlsym(h, name);
    }
  }
  if (p == self) p = nullptr;
  if (!p) {
    fprintf(stderr, "shunt: cannot resolve the real %s in %s; aborting\n", name, lib);
    abort();
  }
  return p;
}

int self_pid() {
  int p = g_pid.load(std::memory_order_relaxed);
  return p ? p : getpid();
}
bool is_forked_child() { return g_forked.load(std::memory_order_relaxed); }

void on_fork(void (*prepare)(), void (*parent)(), void (*child)()) {
  int i = g_fork_hook_count.load(std::memory_order_relaxed);
  if (i >= 8) abort();  // a build defect: more parts than slots
  g_fork_hooks[i] = {prepare, parent, child};
  g_fork_hook_count.store(i + 1, std::memory_order_release);
}

void at_exit(void (*fn)()) {
  std::lock_guard lk(g_exit_mu);
  if (!g_exit_hooks) g_exit_hooks = new std::vector<void (*)()>;
  g_exit_hooks->push_back(fn);
}

}  // namespace shunt
