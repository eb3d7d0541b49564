// shunt's own threads (core/threads.h): owned and joined, never
// detached; what one throws ends it, not the process.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/threads.h"

namespace shunt {
namespace {

// Waits (5 s at most) until pred holds.
template <class P>
bool eventually(P pred) {
  for (int i = 0; i < 500 && !pred(); i++) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return pred();
}

TEST(Threads, AThreadThatReturnedIsJoinedByTheNextStart) {
  std::atomic<int> ran{0};
  ASSERT_TRUE(start_thread("test thread", [&] { ran++; }));
  ASSERT_TRUE(eventually([&] { return ran.load() == 1; }));
  const size_t before = live_threads();
  ASSERT_GE(before, 1u);
  // Each start joins those that returned: many short threads never pile up.
  for (int i = 0; i < 200; i++) {
    std::atomic<bool> done{false};
    ASSERT_TRUE(start_thread("test thread", [&] { done = true; }));
    ASSERT_TRUE(eventually([&] { return done.load(); }));
  }
  EXPECT_LE(live_threads(), before + 5);  // (not 200: other parts may start a few meanwhile)
}

TEST(Threads, WhatABodyThrowsEndsTheThreadAndIsHandedToOnThrow) {
  std::atomic<bool> told{false};
  std::string why;
  ASSERT_TRUE(start_thread(
      "throwing thread", [] { throw std::runtime_error("a peer's odd reply"); },
      [&](const std::string& w) {
        why = w;
        told = true;
      }));
  ASSERT_TRUE(eventually([&] { return told.load(); }));
  EXPECT_EQ(why, "a peer's odd reply");
  // The process goes on, and so do other threads.
  std::atomic<bool> after{false};
  ASSERT_TRUE(start_thread("test thread", [&] { after = true; }));
  EXPECT_TRUE(eventually([&] { return after.load(); }));
}

TEST(Threads, AThreadStillRunningStaysOwnedUntilItReturns) {
  std::atomic<bool> go{false}, done{false};
  ASSERT_TRUE(start_thread("waiting thread", [&] {
    while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = true;
  }));
  const size_t running = live_threads();
  ASSERT_TRUE(start_thread("test thread", [] {}));
  EXPECT_GE(live_threads(), running);  // the waiting one is not joined while it runs
  go = true;
  ASSERT_TRUE(eventually([&] { return done.load(); }));
  std::atomic<bool> last{false};
  ASSERT_TRUE(start_thread("test thread", [&] { last = true; }));
  ASSERT_TRUE(eventually([&] { return last.load(); }));
  EXPECT_LE(live_threads(), running + 5);
}

}  // namespace
}  // namespace shunt
