#include "core/config.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <map>
#include <set>

using namespace shunt;

namespace {
struct Env {
  std::map<std::string, std::string> vars;
  Getenv fn() const {
    return [this](const char* n) -> const char* {
      auto it = vars.find(n);
      return it == vars.end() ? nullptr : it->second.c_str();
    };
  }
};

Config load(const Env& env, std::vector<ConfigError>* errors, std::vector<std::string>* warnings,
            char** environ_list = nullptr) {
  return load_config(env.fn(), errors, warnings, environ_list);
}

std::string temp_file(const std::string& text) {
  char name[] = "/tmp/shunt-conf-XXXXXX";
  int fd = mkstemp(name);
  EXPECT_GE(fd, 0);
  EXPECT_EQ(write(fd, text.data(), text.size()), static_cast<ssize_t>(text.size()));
  close(fd);
  return name;
}
}  // namespace

TEST(Config, EveryDefaultParsesAndNamesAreUnique) {
  Config c;  // aborts on a bad default
  std::set<std::string> names;
  for (auto& s : param_specs()) {
    EXPECT_TRUE(names.insert(s.name).second) << s.name;
    EXPECT_EQ(std::string(s.name).rfind("SHUNT_", 0), 0u) << s.name;
    EXPECT_GT(std::string(s.help).size(), 10u) << s.name;
  }
  EXPECT_EQ(c.mode(), Mode::active);
  EXPECT_EQ(c.source(Param::mode), "default");
}

// shuntctl config prints each help on one line; the longer text is the man page's (params_long.def).
TEST(Config, EveryHelpIsOneLineOfAtMost100Characters) {
  for (auto& s : param_specs()) {
    std::string help = s.help;
    EXPECT_LE(help.size(), 100u) << s.name << ": " << help;
    EXPECT_EQ(help.find_first_of("\r\n"), std::string::npos) << s.name;
  }
}

TEST(Config, EnvironmentSetsEnum) {
  Env env{{{"SHUNT_MODE", "observe"}, {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(c.mode(), Mode::observe);
  EXPECT_EQ(c.source(Param::mode), "env");
}

TEST(Config, UnknownWordNamesVariableAndChoicesAndTurnsOff) {
  Env env{{{"SHUNT_MODE", "fast"}, {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message, "SHUNT_MODE='fast' is not a known value: expected one of off, observe or active");
  EXPECT_EQ(c.mode(), Mode::off);
}

TEST(Config, BadValueOfAReportVariableIsIgnoredWithOneWarning) {
  Env env{{{"SHUNT_LOG_LEVEL", "loud"}, {"SHUNT_METRICS_INTERVAL_MS", "often"}, {"SHUNT_MODE", "active"},
           {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  ASSERT_EQ(warnings.size(), 2u);
  EXPECT_EQ(warnings[0],
            "SHUNT_LOG_LEVEL='loud' is not a known value: expected one of trace, debug, info, warn, error or off; "
            "using 'warn' instead");
  EXPECT_NE(warnings[1].find("SHUNT_METRICS_INTERVAL_MS='often'"), std::string::npos) << warnings[1];
  EXPECT_EQ(static_cast<LogLevel>(c.num(Param::log_level)), LogLevel::warn);
  EXPECT_EQ(c.num(Param::metrics_interval_ms), 5000);
  EXPECT_EQ(c.mode(), Mode::active);
}

TEST(Config, BadValueOfADataVariableTurnsOff) {
  Env env{{{"SHUNT_PATHS_PER_RAIL", "many"}, {"SHUNT_LOG_LEVEL", "debug"}, {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("SHUNT_PATHS_PER_RAIL='many'"), std::string::npos);
  EXPECT_EQ(c.mode(), Mode::off);
}

TEST(Config, OnlyReportingVariablesAreReportScope) {
  // A variable that shapes the data path must never be silently defaulted.
  for (auto& s : param_specs()) {
    std::string n = s.name;
    bool reporting = n.find("LOG") != std::string::npos || n.find("METRICS") != std::string::npos ||
                     n.find("STATS") != std::string::npos || n == "SHUNT_JOB_ID" ||
                     n == "SHUNT_REPORT_INTERVAL_MS";
    EXPECT_EQ(s.scope == ParamScope::Report, reporting) << n;
  }
}

TEST(Config, IntegersAreRangeChecked) {
  int checked = 0;
  for (int i = 0; i < kParamCount; i++) {
    const ParamSpec& s = param_specs()[i];
    if (s.kind != ParamKind::Int) continue;
    checked++;
    Config c;
    ConfigError e;
    EXPECT_TRUE(c.set(static_cast<Param>(i), std::to_string(s.max), "env", &e));
    EXPECT_EQ(c.num(static_cast<Param>(i)), s.max);
    EXPECT_FALSE(c.set(static_cast<Param>(i), std::to_string(s.max + 1), "env", &e));
    EXPECT_NE(e.message.find("out of range: expected an integer from " + std::to_string(s.min) + " to " +
                             std::to_string(s.max)),
              std::string::npos)
        << e.message;
    EXPECT_FALSE(c.set(static_cast<Param>(i), std::to_string(s.min - 1), "env", &e));
    EXPECT_FALSE(c.set(static_cast<Param>(i), "12abc", "env", &e));
    EXPECT_NE(e.message.find("is not a decimal number"), std::string::npos);
    EXPECT_FALSE(c.set(static_cast<Param>(i), "", "env", &e));
    EXPECT_EQ(c.num(static_cast<Param>(i)), s.max) << "a rejected value must not change the setting";
  }
  EXPECT_GT(checked, 0) << "the registry has integer variables";
}

TEST(Config, FileIsReadAndEnvironmentWins) {
  std::string path = temp_file("# comment\nSHUNT_MODE = observe\nSHUNT_LOG_LEVEL=debug\n\n");
  Env env{{{"SHUNT_CONF_FILE", path}, {"SHUNT_LOG_LEVEL", "error"}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(c.mode(), Mode::observe);
  EXPECT_EQ(c.source(Param::mode), path + ":2");
  EXPECT_EQ(static_cast<LogLevel>(c.num(Param::log_level)), LogLevel::error);
  unlink(path.c_str());
}

TEST(Config, BadFileLineIsAnErrorUnknownNameAWarning) {
  std::string path = temp_file("SHUNT_MODE=sideways\nSHUNT_NOPE=1\njunk\n");
  Env env{{{"SHUNT_CONF_FILE", path}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  ASSERT_EQ(errors.size(), 2u);
  EXPECT_NE(errors[0].message.find("(from " + path + ":1)"), std::string::npos) << errors[0].message;
  EXPECT_NE(errors[1].message.find("expected NAME=value"), std::string::npos);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("SHUNT_NOPE"), std::string::npos);
  EXPECT_EQ(c.mode(), Mode::off);
  unlink(path.c_str());
}

TEST(Config, MissingDefaultFileIsFineMissingNamedFileWarns) {
  Env env{{{"SHUNT_CONF_FILE", "/nonexistent/shunt.conf"}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  ASSERT_EQ(warnings.size(), 1u);
}

TEST(Config, UnknownShuntVariableInEnvironmentWarns) {
  char a[] = "SHUNT_MDOE=active", b[] = "PATH=/bin", c[] = "SHUNT_MODE=observe";
  char* list[] = {a, b, c, nullptr};
  Env env{{{"SHUNT_MODE", "observe"}, {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  load(env, &errors, &warnings, list);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_EQ(warnings[0], "unknown variable SHUNT_MDOE ignored");
}

TEST(Config, ExpandPattern) {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  EXPECT_EQ(expand_pattern("/tmp/x-%h-%p.log", 42), std::string("/tmp/x-") + host + "-42.log");
  EXPECT_EQ(expand_pattern("a%%b%", 1), "a%b%");
}

namespace {
// Loads with only `vars` set and no config file.
Config load_env(std::map<std::string, std::string> vars, std::vector<ConfigError>* errors,
                std::vector<std::string>* warnings) {
  vars.emplace("SHUNT_CONF_FILE", "");
  Env env{vars};
  return load(env, errors, warnings);
}

// Runs load_config in a child bounded to 5 s and 1 GiB: a config file that
// blocks or never ends fails the test instead of hanging or exhausting it.
// The child exits 0 when the file was refused with `want` in the message.
void expect_conf_refused_in_time(const std::string& path, const std::string& want) {
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    alarm(5);
#ifndef __SANITIZE_ADDRESS__
    rlimit lim{1ull << 30, 1ull << 30};
    setrlimit(RLIMIT_AS, &lim);
#endif
    Env env{{{"SHUNT_CONF_FILE", path}}};
    std::vector<ConfigError> errors;
    std::vector<std::string> warnings;
    Config c = load(env, &errors, &warnings);
    bool ok = errors.size() == 1 && errors[0].message.find(want) != std::string::npos && c.mode() == Mode::off;
    if (!ok) fprintf(stderr, "errors: %zu, first: %s\n", errors.size(), errors.empty() ? "" : errors[0].message.c_str());
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << path << ": killed by signal " << WTERMSIG(status) << " (hung or ran out of memory)";
  EXPECT_EQ(WEXITSTATUS(status), 0) << path << ": not refused with '" << want << "'";
}
}  // namespace

TEST(ConfigInt, LeadingZerosAreDecimal) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load_env({{"SHUNT_PEER_PORT", "07472"}}, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(c.num(Param::peer_port), 7472);  // not 3898 (octal)
  EXPECT_EQ(c.str(Param::peer_port), "7472");
}

TEST(ConfigInt, HexIsNotANumber) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load_env({{"SHUNT_PEER_PORT", "0x1d30"}}, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message,
            "SHUNT_PEER_PORT='0x1d30' is not a decimal number: expected an integer from 1 to 65535");
  EXPECT_EQ(c.num(Param::peer_port), 7472);
}

TEST(ConfigInt, TrailingOrInnerJunkIsNotANumber) {
  for (const char* v : {"7472x", "74 72", "1e3", "7472.0", "+", "-", "--1", "٣"}) {
    Config c;
    ConfigError e;
    EXPECT_FALSE(c.set(Param::peer_port, v, "env", &e)) << v;
    EXPECT_NE(e.message.find("is not a decimal number"), std::string::npos) << e.message;
  }
}

TEST(ConfigInt, SignsAndSurroundingBlanksAreAccepted) {
  Config c;
  ConfigError e;
  EXPECT_TRUE(c.set(Param::test_shadow_limit, "-1", "env", &e)) << e.message;
  EXPECT_EQ(c.num(Param::test_shadow_limit), -1);
  EXPECT_TRUE(c.set(Param::peer_port, " +80\t", "env", &e)) << e.message;
  EXPECT_EQ(c.num(Param::peer_port), 80);
}

TEST(ConfigInt, NumberTooLargeForAnyTypeIsOutOfRange) {
  for (const char* v : {"99999999999999999999", "-99999999999999999999", "9223372036854775808"}) {
    Config c;
    ConfigError e;
    EXPECT_FALSE(c.set(Param::peer_port, v, "env", &e)) << v;
    EXPECT_NE(e.message.find("is out of range: expected an integer from 1 to 65535"), std::string::npos) << e.message;
  }
  long long n = 0;
  bool overflow = false;
  EXPECT_TRUE(parse_decimal("-9223372036854775808", &n, &overflow));
  EXPECT_EQ(n, LLONG_MIN);
  EXPECT_TRUE(parse_decimal("9223372036854775807", &n, &overflow));
  EXPECT_EQ(n, LLONG_MAX);
}

TEST(ConfigEnum, WordsMatchInAnyCase) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load_env({{"SHUNT_LOG_LEVEL", "INFO"}, {"SHUNT_MODE", "Observe"}, {"SHUNT_SPREAD", "sPlIt"}}, &errors,
                      &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(c.mode(), Mode::observe);
  EXPECT_EQ(static_cast<LogLevel>(c.num(Param::log_level)), LogLevel::info);
  EXPECT_EQ(c.str(Param::mode), "observe");  // as the registry spells it
  EXPECT_EQ(c.str(Param::spread), "split");
}

TEST(ConfigEnum, SwitchTakesOneZeroTrueFalseYesNo) {
  const int on = choice_index(spec(Param::agent), "on"), off = choice_index(spec(Param::agent), "off");
  for (const char* v : {"1", "true", "TRUE", "yes", "Yes", "on", "ON"}) {
    Config c;
    ConfigError e;
    ASSERT_TRUE(c.set(Param::agent, v, "env", &e)) << v << ": " << e.message;
    EXPECT_EQ(c.num(Param::agent), on) << v;
    EXPECT_EQ(c.str(Param::agent), "on");
  }
  for (const char* v : {"0", "false", "False", "no", "NO", "off", "Off"}) {
    Config c;
    ConfigError e;
    ASSERT_TRUE(c.set(Param::agent, v, "env", &e)) << v << ": " << e.message;
    EXPECT_EQ(c.num(Param::agent), off) << v;
  }
  for (const char* v : {"2", "y", "enable", "00"}) {
    Config c;
    ConfigError e;
    EXPECT_FALSE(c.set(Param::agent, v, "env", &e)) << v;
    EXPECT_NE(e.message.find("expected on or off (or 1/0, true/false, yes/no)"), std::string::npos) << e.message;
  }
  // Only switches: 0 is not a word of SHUNT_MODE.
  Config c;
  ConfigError e;
  EXPECT_FALSE(c.set(Param::mode, "0", "env", &e));
}

TEST(ConfigEmpty, EmptyWordOrNumberIsUnset) {
  std::string path = temp_file("SHUNT_MODE=observe\nSHUNT_PEER_PORT=9000\n");
  Env env{{{"SHUNT_CONF_FILE", path}, {"SHUNT_MODE", ""}, {"SHUNT_PEER_PORT", " "}, {"SHUNT_AGENT", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(c.mode(), Mode::observe);  // the file's value stands
  EXPECT_EQ(c.num(Param::peer_port), 9000);
  EXPECT_EQ(c.str(Param::agent), "on");
  unlink(path.c_str());
  // Text keeps empty as a value: SHUNT_METRICS_ADDR= means no endpoint.
  c = load_env({{"SHUNT_METRICS_ADDR", ""}}, &errors, &warnings);
  EXPECT_EQ(c.str(Param::metrics_addr), "");
}

TEST(ConfigMessage, ControlCharactersInAValueAreEscaped) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  load_env({{"SHUNT_MODE", "act\nive\x1b[2J"}}, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].message.find('\n'), std::string::npos);
  EXPECT_EQ(errors[0].message.find('\x1b'), std::string::npos);
  EXPECT_NE(errors[0].message.find("SHUNT_MODE='act\\nive\\x1b[2J'"), std::string::npos) << errors[0].message;
}

TEST(ConfigMessage, LongValueIsCutAndItsLengthGiven) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  load_env({{"SHUNT_MODE", std::string(51200, 'x')}}, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_LT(errors[0].message.size(), 300u);
  EXPECT_NE(errors[0].message.find("SHUNT_MODE='" + std::string(100, 'x') + "'... (51200 bytes) is not a known value"),
            std::string::npos)
      << errors[0].message;
  // Cut on a character, not inside one.
  EXPECT_EQ(printable(std::string(99, 'a') + "\xc3\xa9z", 100), std::string(99, 'a') + "... (102 bytes)");
}

TEST(ConfigFile, DirectoryIsRefused) {
  char dir[] = "/tmp/shunt-conf-dir-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  expect_conf_refused_in_time(dir, std::string("SHUNT_CONF_FILE='") + dir + "' is a directory, not a regular file");
  rmdir(dir);
}

TEST(ConfigFile, FifoIsRefusedWithoutBlocking) {
  std::string path = "/tmp/shunt-conf-fifo-" + std::to_string(getpid());
  ASSERT_EQ(mkfifo(path.c_str(), 0600), 0);
  expect_conf_refused_in_time(path, "is a FIFO, not a regular file");
  unlink(path.c_str());
}

TEST(ConfigFile, EndlessDeviceIsRefused) {
  expect_conf_refused_in_time("/dev/zero", "SHUNT_CONF_FILE='/dev/zero' is a character device");
  expect_conf_refused_in_time("/dev/urandom", "is a character device");
}

TEST(ConfigFile, FileOverTheSizeCapIsRefused) {
  std::string big;
  while (big.size() <= kMaxConfFileBytes) big += "# a comment line\n";
  std::string path = temp_file(big);
  expect_conf_refused_in_time(path, "has " + std::to_string(big.size()) + " bytes, more than the 65536");
  unlink(path.c_str());
  // At the cap it is read to its last line.
  std::string last = "SHUNT_MODE=observe\n";
  std::string full = std::string(kMaxConfFileBytes - last.size() - 1, '#') + "\n" + last;
  ASSERT_EQ(full.size(), kMaxConfFileBytes);
  path = temp_file(full);
  Env env{{{"SHUNT_CONF_FILE", path}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty()) << errors[0].message;
  EXPECT_EQ(c.mode(), Mode::observe);
  unlink(path.c_str());
}

TEST(ConfigFile, BadReportValueInTheFileIsIgnoredWithItsLine) {
  std::string path = temp_file("SHUNT_MODE=observe\nSHUNT_LOG_LEVEL=chatty\n");
  Env env{{{"SHUNT_CONF_FILE", path}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  EXPECT_TRUE(errors.empty());
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("SHUNT_LOG_LEVEL='chatty' (from " + path + ":2)"), std::string::npos) << warnings[0];
  EXPECT_EQ(c.mode(), Mode::observe);
  unlink(path.c_str());
}

// SHUNT_JOB_KEY_FILE: the nodes of a job launched on each node apart share
// one key through a file.
TEST(Config, JobKeyFileGivesTheKey) {
  std::string f = temp_file("  0123abcd  \nsecond line ignored\n");
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(Env{{{"SHUNT_CONF_FILE", ""}, {"SHUNT_JOB_KEY_FILE", f}}}, &errors, &warnings);
  EXPECT_TRUE(errors.empty()) << errors[0].message;
  EXPECT_EQ(c.str(Param::job_key), "0123abcd");
  EXPECT_EQ(c.source(Param::job_key), f);
  EXPECT_EQ(c.mode(), Mode::active);
  unlink(f.c_str());
}

TEST(Config, JobKeyWinsOverTheKeyFile) {
  std::string f = temp_file("from-file\n");
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(Env{{{"SHUNT_CONF_FILE", ""}, {"SHUNT_JOB_KEY_FILE", f}, {"SHUNT_JOB_KEY", "from-env"}}}, &errors,
                  &warnings);
  EXPECT_TRUE(errors.empty());
  EXPECT_EQ(c.str(Param::job_key), "from-env");
  unlink(f.c_str());
}

TEST(Config, BadJobKeyFileIsANamedErrorAndTurnsShuntOff) {
  std::string empty = temp_file("\nkey on the second line is none\n");
  for (const std::string& path : {std::string("/nonexistent/shunt-key"), empty, std::string("/tmp")}) {
    std::vector<ConfigError> errors;
    std::vector<std::string> warnings;
    Config c = load(Env{{{"SHUNT_CONF_FILE", ""}, {"SHUNT_JOB_KEY_FILE", path}}}, &errors, &warnings);
    ASSERT_EQ(errors.size(), 1u) << path;
    EXPECT_EQ(errors[0].name, "SHUNT_JOB_KEY_FILE");
    EXPECT_EQ(errors[0].message.rfind("SHUNT_JOB_KEY_FILE='" + path + "' ", 0), 0u) << errors[0].message;
    EXPECT_EQ(c.mode(), Mode::off) << path;
    EXPECT_EQ(c.str(Param::job_key), "");
  }
  unlink(empty.c_str());
}
