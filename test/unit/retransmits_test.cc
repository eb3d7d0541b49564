// The stall watch's view of a port's retransmissions, on a fake sysfs tree.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "interpose/verbs/retransmits.h"

using namespace shunt::verbs;
namespace fs = std::filesystem;

namespace {
struct Tree {
  fs::path root = fs::temp_directory_path() / ("shunt-retx-" + std::to_string(getpid()));
  Tree() { fs::create_directories(root / "rxe0/ports/1/hw_counters"); }
  ~Tree() { fs::remove_all(root); }
  void set(const std::string& name, uint64_t v) {
    std::ofstream(root / "rxe0/ports/1/hw_counters" / name) << v << "\n";
  }
};
}  // namespace

TEST(Retransmits, ReadsRxesOrMlx5sCounterAndNothingElse) {
  Tree t;
  EXPECT_FALSE(port_retransmits("rxe0", 1, t.root.string()));
  t.set("local_ack_timeout_err", 5);
  EXPECT_EQ(port_retransmits("rxe0", 1, t.root.string()), 5u);
  t.set("completer_retry_err", 9);
  EXPECT_EQ(port_retransmits("rxe0", 1, t.root.string()), 9u);
  EXPECT_FALSE(port_retransmits("rxe0", 2, t.root.string()));
}

TEST(Retransmits, ARiseIsDatedByTheReadThatSawIt) {
  Tree t;
  t.set("completer_retry_err", 3);
  RetransmitWatch w(t.root.string());
  EXPECT_EQ(w.last_rise_ms("rxe0", 1, 100), -1);  // the first read is the baseline
  EXPECT_EQ(w.last_rise_ms("rxe0", 1, 600), -1);
  t.set("completer_retry_err", 4);
  EXPECT_EQ(w.last_rise_ms("rxe0", 1, 1100), 1100);
  EXPECT_EQ(w.last_rise_ms("rxe0", 1, 1600), 1100);
  // A port without a counter: the stall alone decides.
  EXPECT_EQ(w.last_rise_ms("rxe1", 1, 2000), 2000);
}

TEST(Retransmits, TheCounterFileStaysOpenAndIsReadAfresh) {
  Tree t;
  t.set("completer_retry_err", 1);
  auto fds = [] { return std::distance(fs::directory_iterator("/proc/self/fd"), fs::directory_iterator{}); };
  const auto before = fds();
  {
    RetransmitWatch w(t.root.string());
    w.last_rise_ms("rxe0", 1, 0);
    EXPECT_EQ(fds(), before + 1);  // held, not opened and closed at every read
    for (int i = 1; i <= 5; i++) {
      t.set("completer_retry_err", 1 + i);  // rewritten in place, as sysfs shows a new count
      EXPECT_EQ(w.last_rise_ms("rxe0", 1, 100 * i), 100 * i);
    }
    EXPECT_EQ(fds(), before + 1);
  }
  EXPECT_EQ(fds(), before);  // closed with the watch
}
