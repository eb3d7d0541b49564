// The host agent's control socket as a client sees it: one request line in,
// one answer line out (the agent's own handler), and the run directory's
// checks. Malformed requests are answered with an error and leave the
// agent serving.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

#include "agent/agent.h"
#include "peer/control.h"

using nlohmann::json;
using shunt::agent::control_answer_for_test;
using shunt::agent::store_report_for_test;

namespace {
json ask(const std::string& line, unsigned uid = getuid()) {
  std::string a = control_answer_for_test(line, uid);
  EXPECT_FALSE(a.empty());
  EXPECT_EQ(a.back(), '\n');
  return json::parse(a);
}

json member(const json& status, long pid) {
  for (const auto& m : status["members"])
    if (m["pid"] == pid) return m;
  return nullptr;
}

std::string temp_dir() {
  char t[] = "/tmp/shunt-unit.XXXXXX";
  EXPECT_NE(mkdtemp(t), nullptr);
  return t;
}
}  // namespace

TEST(AgentControl, MalformedReportsAreRefusedAndStatusStillAnswers) {
  for (const char* line : {
           R"({"cmd":"report","pid":101,"snapshot":5})",
           R"({"cmd":"report","pid":102,"snapshot":{},"seq":"x"})",
           R"({"cmd":"report","pid":103,"snapshot":{},"final":"yes"})",
           R"({"cmd":"report","pid":104,"snapshot":{},"born":"then"})",
           R"({"cmd":"report","pid":105,"snapshot":{"sockets":[{"peer":5}]}})",
           R"({"cmd":"report","pid":106,"snapshot":{"sockets":[5]}})",
           R"({"cmd":"report","pid":107,"snapshot":{"sockets":[{"open":"yes"}]}})",
           R"({"cmd":"report","pid":108,"snapshot":{"verbs":5}})",
           R"({"cmd":"report","pid":109,"snapshot":{"verbs":{"qps":5}}})",
           R"({"cmd":"report","pid":110,"snapshot":{"mode":7}})",
           R"({"cmd":"report","pid":"111","snapshot":{}})",
           R"({"cmd":"report","pid":-1,"snapshot":{}})",
           R"({"cmd":"report","pid":1e3,"snapshot":{}})",
       }) {
    json a = ask(line);
    EXPECT_TRUE(a.contains("error")) << line << " -> " << a;
  }
  json st = ask(R"({"cmd":"status"})");
  ASSERT_FALSE(st.contains("error")) << st;
  for (long pid = 101; pid <= 111; pid++) EXPECT_TRUE(member(st, pid).is_null()) << pid;
  EXPECT_FALSE(ask(R"({"cmd":"members"})").contains("error"));
}

TEST(AgentControl, WellFormedReportIsTaken) {
  json a = ask(R"({"cmd":"report","pid":120,"seq":1,"born":7,"final":false,)"
               R"("snapshot":{"mode":"observe","verbs":{"qps":[{},{}]},)"
               R"("sockets":[{"peer":"10.0.0.1:5","local":"10.0.0.2:6","open":true,"upgraded":false,"tx_bytes":1,"rx_bytes":2}]}})");
  EXPECT_EQ(a, json({{"ok", true}}));
  json m = member(ask(R"({"cmd":"status"})"), 120);
  EXPECT_EQ(m["mode"], "observe");
  EXPECT_EQ(m["qps"], 2);
  EXPECT_EQ(m["sockets"], 1);
  // An older report of the same process is stale.
  EXPECT_EQ(ask(R"({"cmd":"report","pid":120,"seq":1,"born":7,"snapshot":{}})")["stale"], true);
}

TEST(AgentControl, ReportFromAnotherUserIsRefused) {
  json a = ask(R"({"cmd":"report","pid":130,"snapshot":{}})", getuid() + 4242);
  EXPECT_TRUE(a.contains("error")) << a;
  EXPECT_TRUE(member(ask(R"({"cmd":"status"})"), 130).is_null());
}

TEST(AgentControl, StatusReadsMembersOfAnyShape) {
  // Members the agent did not check (its own report is stored as made).
  store_report_for_test("140", {{"verbs", 5}, {"sockets", "x"}, {"mode", 7}, {"final", "yes"}, {"reported_ms", "z"}});
  store_report_for_test("141", json::array({1, 2}));
  store_report_for_test("142", {{"verbs", {{"qps", "many"}}}});
  json st = ask(R"({"cmd":"status"})");
  ASSERT_FALSE(st.contains("error")) << st;
  json m = member(st, 140);
  EXPECT_EQ(m["mode"], "");
  EXPECT_EQ(m["qps"], 0);
  EXPECT_EQ(m["sockets"], 0);
  EXPECT_EQ(m["exited"], false);
  EXPECT_EQ(member(st, 141)["qps"], 0);
  EXPECT_EQ(member(st, 142)["qps"], 0);
}

TEST(AgentControl, AnswerWithBytesThatAreNotUtf8IsWritten) {
  store_report_for_test("150", {{"job", std::string("job-\xff\xfe")}, {"mode", "observe"}});
  std::string a = control_answer_for_test(R"({"cmd":"members"})", getuid());
  ASSERT_NE(a.find("job-\xEF\xBF\xBD"), std::string::npos) << a.substr(0, 300);  // U+FFFD
  EXPECT_FALSE(json::parse(a).contains("error"));
}

TEST(AgentControl, DeeplyNestedRequestIsRefused) {
  // Copying or writing out a value this deep would overflow the stack.
  const int depth = 200'000;
  std::string line = R"({"cmd":"report","pid":160,"snapshot":{"x":)" + std::string(depth, '[') +
                     std::string(depth, ']') + "}}";
  EXPECT_TRUE(ask(line).contains("error"));
  EXPECT_TRUE(ask(R"({"cmd":"status","x":")" + std::string(depth, '[') + R"("})").contains("agent_pid"))
      << "brackets inside a string are no nesting";
}

TEST(AgentControl, ThrowingListenerDoesNotEndTheRequest) {
  shunt::agent::on_report([](const std::string& pid, const json&) {
    if (pid == "170") throw std::runtime_error("listener trouble");
  });
  EXPECT_EQ(ask(R"({"cmd":"report","pid":170,"snapshot":{}})"), json({{"ok", true}}));
  EXPECT_FALSE(member(ask(R"({"cmd":"status"})"), 170).is_null());
}

// Processes that come and go all week under the preload: the agent keeps
// the last reports of the latest 256 that exited, counts the rest, and
// keeps every running one.
TEST(AgentControl, ExitedProcessesBeyondTheBoundGoOldestFirst) {
  ASSERT_EQ(ask(R"({"cmd":"report","pid":180,"snapshot":{"mode":"observe"}})"), json({{"ok", true}}));  // running
  const uint64_t before = ask(R"({"cmd":"status"})")["exited_dropped"].get<uint64_t>();
  for (int pid = 200'000; pid < 200'400; pid++) {
    json r = {{"cmd", "report"},
              {"pid", pid},
              {"final", true},
              {"seq", 1},
              {"snapshot", {{"mode", "observe"}, {"job", "bound"}, {"rank", "0"}, {"events", {{"failover", 1}}}}}};
    ASSERT_EQ(ask(r.dump()), json({{"ok", true}})) << pid;
  }
  json st = ask(R"({"cmd":"status"})");
  size_t exited = 0;
  for (const auto& m : st["members"]) exited += m["exited"].get<bool>();
  EXPECT_EQ(exited, 256u);
  EXPECT_GE(st["exited_dropped"].get<uint64_t>() - before, 144u);
  EXPECT_TRUE(member(st, 200'000).is_null()) << "the oldest went";
  EXPECT_FALSE(member(st, 200'399).is_null()) << "the latest stays";
  EXPECT_FALSE(member(st, 180).is_null()) << "a running process stays";
  // What went is still counted: its counters, summed for its job and rank.
  uint64_t failovers = 0;
  for (const auto& r : shunt::agent::retired())
    if (r.value("job", "") == "bound") failovers = r["events"].value("failover", uint64_t{0});
  EXPECT_EQ(failovers, 400 - exited);
}

TEST(AgentControl, BadRequestsGetErrors) {
  for (const char* line : {"{not json", R"({"cmd":5})", R"({"cmd":"nope"})", R"([1,2])", R"("status")", ""})
    EXPECT_TRUE(ask(line).contains("error")) << line;
}

TEST(RunDir, PrivateDirectoryIsTaken) {
  std::string d = temp_dir(), why;
  EXPECT_TRUE(shunt::peer::private_dir(d, &why)) << why;
  std::string refused = "x";
  EXPECT_EQ(shunt::peer::run_dir(d, &refused), d);
  EXPECT_EQ(refused, "");
  std::string sub = d + "/run";  // created 0700 when missing
  EXPECT_EQ(shunt::peer::run_dir(sub, &refused), sub);
  struct stat st;
  ASSERT_EQ(stat(sub.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  rmdir(sub.c_str());
  rmdir(d.c_str());
}

TEST(RunDir, WritableByOthersIsRefusedForTheRuntimeDir) {
  std::string d = temp_dir(), xdg = temp_dir(), why;
  chmod(d.c_str(), 0777);
  EXPECT_FALSE(shunt::peer::private_dir(d, &why));
  EXPECT_NE(why.find("writable by other users (mode 0777)"), std::string::npos) << why;
  setenv("XDG_RUNTIME_DIR", xdg.c_str(), 1);
  std::string refused;
  EXPECT_EQ(shunt::peer::run_dir(d, &refused), xdg + "/shunt");
  EXPECT_NE(refused.find("run directory " + d + " refused"), std::string::npos) << refused;
  EXPECT_NE(refused.find("using " + xdg + "/shunt instead"), std::string::npos) << refused;
  EXPECT_EQ(shunt::peer::agent_dir(d), xdg + "/shunt");  // a reader finds the same one
  // No private runtime directory: no run directory at all.
  chmod(xdg.c_str(), 0777);
  EXPECT_EQ(shunt::peer::run_dir(d, &refused), "");
  EXPECT_NE(refused.find("no host agent"), std::string::npos) << refused;
  unsetenv("XDG_RUNTIME_DIR");
  EXPECT_EQ(shunt::peer::run_dir(d, &refused), "");
  EXPECT_NE(refused.find("XDG_RUNTIME_DIR is not set"), std::string::npos) << refused;
  rmdir((xdg + "/shunt").c_str());
  rmdir(xdg.c_str());
  rmdir(d.c_str());
}

TEST(RunDir, SymlinkAndOtherOwnerAreRefused) {
  std::string d = temp_dir(), why;
  std::string link = d + "/link";
  ASSERT_EQ(symlink(d.c_str(), link.c_str()), 0);
  EXPECT_FALSE(shunt::peer::private_dir(link, &why));
  EXPECT_EQ(why, "a symbolic link");
  unlink(link.c_str());
  if (geteuid() == 0) {  // only root can give a directory away
    ASSERT_EQ(chown(d.c_str(), 65534, 65534), 0);
    EXPECT_FALSE(shunt::peer::private_dir(d, &why));
    EXPECT_NE(why.find("owned by uid 65534"), std::string::npos) << why;
  }
  rmdir(d.c_str());
}
