// Threads of shunt's own. Each starts here and runs its body inside
// contained() (what it throws ends the thread, never the process: on_throw
// runs with the reason, the thread names itself in its body), and is
// owned by this registry: joined by the next start after it returned,
// never detached. At exit the threads still running are left to the end of
// the process (the registry is never destroyed); a forked child forgets
// its parent's (they do not exist in it).
#pragma once
#include <cstddef>
#include <functional>
#include <string>

namespace shunt {

// false: no thread could be made (the reason is logged once); the caller
// goes on without it.
// `what` names it in the log.
bool start_thread(const char* what, std::function<void()> body,
                  std::function<void(const std::string&)> on_throw = nullptr);

// Threads started and not joined yet (running, or returned since the last start).
size_t live_threads();

}  // namespace shunt
