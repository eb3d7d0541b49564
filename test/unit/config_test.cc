#include "interpose/core/config.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>

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

TEST(Config, BadValueOfAnyVariableTurnsOff) {
  Env env{{{"SHUNT_LOG_LEVEL", "loud"}, {"SHUNT_MODE", "active"}, {"SHUNT_CONF_FILE", ""}}};
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load(env, &errors, &warnings);
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_NE(errors[0].message.find("SHUNT_LOG_LEVEL='loud'"), std::string::npos);
  EXPECT_NE(errors[0].message.find("trace, debug, info, warn, error or off"), std::string::npos);
  EXPECT_EQ(c.mode(), Mode::off);
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
    EXPECT_NE(e.message.find("is not a number"), std::string::npos);
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
