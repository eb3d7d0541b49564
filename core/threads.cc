#include "core/threads.h"

#include <unistd.h>

#include <atomic>
#include <list>
#include <mutex>
#include <string>
#include <system_error>
#include <thread>

#include "core/log.h"
#include "core/runtime.h"

namespace shunt {
namespace {

struct Owned {
  std::thread t;
  std::atomic<bool> returned{false};
};

std::mutex g_mu;
std::list<Owned>* g_threads = nullptr;  // stable addresses; never destroyed
pid_t g_owner = 0;                      // the process the list's threads run in

struct ForkSafety {  // the child must not inherit g_mu held by another thread
  ForkSafety() {
    on_fork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });
  }
} g_fork_safety;

// Joins the threads that returned. Under g_mu.
void reap() {
  pid_t me = getpid();
  if (!g_threads || g_owner != me) {
    // A forked child holds its parent's list, of threads that do not run
    // here: it is left as it is (a joinable std::thread may not be destroyed).
    g_threads = new std::list<Owned>;
    g_owner = me;
    return;
  }
  for (auto it = g_threads->begin(); it != g_threads->end();)
    if (it->returned.load(std::memory_order_acquire)) {
      it->t.join();  // it has returned: this waits only for its exit
      it = g_threads->erase(it);
    } else {
      ++it;
    }
}

}  // namespace

bool start_thread(const char* what, std::function<void()> body, std::function<void(const std::string&)> on_throw) {
  std::lock_guard l(g_mu);
  reap();
  Owned& o = g_threads->emplace_back();
  try {
    o.t = std::thread([&o, what, body = std::move(body), on_throw = std::move(on_throw)] {
      contained(what, body, [&](const std::string& why) {
        if (on_throw) on_throw(why);
      });
      o.returned.store(true, std::memory_order_release);
    });
  } catch (const std::system_error& e) {
    g_threads->pop_back();
    log::once(LogLevel::error, std::string("start ") + what,
              std::string("cannot start the thread of the ") + what + ": " + e.what() + "; shunt goes on without it");
    return false;
  }
  return true;
}

size_t live_threads() {
  std::lock_guard l(g_mu);
  return g_threads && g_owner == getpid() ? g_threads->size() : 0;
}

}  // namespace shunt
