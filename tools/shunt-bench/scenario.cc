#include "tools/shunt-bench/scenario.h"

#include <limits.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tools/shunt-bench/net.h"

namespace bench {

int run_scenario(const char* argv0, const ScenarioArgs& s) {
  char self[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  std::string dir = n > 0 ? std::string(self, n) : std::string(argv0);
  dir = dir.substr(0, dir.rfind('/') + 1);
  std::string script = dir + "shunt-bench-scenario";
  std::vector<std::string> args{script, s.name};
  for (const auto& a : s.passthrough) args.push_back(a);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  setenv("SHUNT_BENCH", (dir + "shunt-bench").c_str(), 1);
  execv(script.c_str(), argv.data());
  throw BenchError("cannot run " + script + ": " + errno_text(errno));
}

}  // namespace bench
