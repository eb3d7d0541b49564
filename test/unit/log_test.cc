#include "core/log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <stdexcept>
#include <string>
#include <thread>

using namespace shunt;

namespace {
std::string read_all(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
}  // namespace

TEST(Log, MessageWithNewlinesStaysOneLine) {
  std::string path = "/tmp/shunt-log-test-" + std::to_string(getpid());
  log::configure(LogLevel::info, path);
  log::warn("value '{}' refused", "first\nhost:1:1 shunt error: forged");
  log::configure(LogLevel::warn, "");
  std::string text = read_all(path);
  unlink(path.c_str());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.find('\n'), text.size() - 1) << text;
  EXPECT_NE(text.find("value 'first\\nhost:1:1 shunt error: forged' refused"), std::string::npos)
      << text;
}

TEST(Log, HugeMessageIsCutWithItsLength) {
  std::string path = "/tmp/shunt-log-test-" + std::to_string(getpid());
  log::configure(LogLevel::info, path);
  log::warn("{}", std::string(1 << 20, 'v'));
  log::configure(LogLevel::warn, "");
  std::string text = read_all(path);
  unlink(path.c_str());
  EXPECT_LT(text.size(), 4096u + 200u);
  EXPECT_NE(text.find("... (1048576 bytes)"), std::string::npos);
}

TEST(Contained, AThrowingThreadBodyEndsThereWithItsReason) {
  std::string seen;
  std::thread t([&] {
    contained("test thread", [] { throw std::runtime_error("a reply of the wrong shape"); },
              [&](const std::string& why) { seen = why; });
  });
  t.join();  // an exception escaping the thread would have called std::terminate
  EXPECT_EQ(seen, "a reply of the wrong shape");
  bool ran = false, threw = false;
  contained("test body", [&] { ran = true; }, [&](const std::string&) { threw = true; });
  EXPECT_TRUE(ran);
  EXPECT_FALSE(threw);
  contained("test int", [] { throw 5; }, [&](const std::string& why) { seen = why; });
  EXPECT_EQ(seen, "an unknown exception");
}
