#include "interpose/core/config.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

namespace shunt {

namespace {
constexpr ParamSpec kSpecs[] = {
#define SHUNT_PARAM(id, name, kind, def, min, max, choices, help) \
  {name, ParamKind::kind, def, min, max, choices, help},
#include "interpose/core/params.def"
#undef SHUNT_PARAM
};
static_assert(sizeof(kSpecs) / sizeof(kSpecs[0]) == kParamCount);

std::vector<std::string_view> split_choices(const char* choices) {
  std::vector<std::string_view> out;
  std::string_view s(choices);
  while (!s.empty()) {
    auto bar = s.find('|');
    out.push_back(s.substr(0, bar));
    if (bar == std::string_view::npos) break;
    s.remove_prefix(bar + 1);
  }
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

int find_param(std::string_view name) {
  for (int i = 0; i < kParamCount; i++)
    if (name == kSpecs[i].name) return i;
  return -1;
}
}  // namespace

std::span<const ParamSpec> param_specs() { return kSpecs; }
const ParamSpec& spec(Param p) { return kSpecs[static_cast<int>(p)]; }

int choice_index(const ParamSpec& s, std::string_view value) {
  auto c = split_choices(s.choices);
  for (size_t i = 0; i < c.size(); i++)
    if (c[i] == value) return static_cast<int>(i);
  return -1;
}

std::string describe_allowed(const ParamSpec& s) {
  switch (s.kind) {
    case ParamKind::Enum: {
      auto c = split_choices(s.choices);
      std::string out = "one of ";
      for (size_t i = 0; i < c.size(); i++) {
        if (i) out += i + 1 == c.size() ? " or " : ", ";
        out += c[i];
      }
      return out;
    }
    case ParamKind::Int:
      return "an integer from " + std::to_string(s.min) + " to " + std::to_string(s.max);
    case ParamKind::Str:
      return "any text";
  }
  return "";
}

Config::Config() {
  for (int i = 0; i < kParamCount; i++) {
    ConfigError ignored;
    bool ok = set(static_cast<Param>(i), kSpecs[i].def, "default", &ignored);
    if (!ok) std::abort();  // a bad default is a build defect; tests catch it
  }
}

bool Config::set(Param p, std::string_view value, const std::string& source, ConfigError* err) {
  const ParamSpec& s = spec(p);
  int i = idx(p);
  auto fail = [&](const std::string& why) {
    err->name = s.name;
    err->value = std::string(value);
    err->message = std::string(s.name) + "='" + std::string(value) + "' " +
                   (source == "env" ? "" : "(from " + source + ") ") + why + ": expected " +
                   describe_allowed(s);
    return false;
  };
  switch (s.kind) {
    case ParamKind::Enum: {
      int c = choice_index(s, trim(value));
      if (c < 0) return fail("is not a known value");
      num_[i] = c;
      break;
    }
    case ParamKind::Int: {
      std::string v(trim(value));
      if (v.empty()) return fail("is empty");
      errno = 0;
      char* end = nullptr;
      long long n = std::strtoll(v.c_str(), &end, 0);
      if (errno == ERANGE || *end != '\0') return fail("is not a number");
      if (n < s.min || n > s.max) return fail("is out of range");
      num_[i] = n;
      break;
    }
    case ParamKind::Str:
      break;
  }
  str_[i] = std::string(trim(value));
  src_[i] = source;
  return true;
}

Config load_config(const Getenv& getenv_fn, std::vector<ConfigError>* errors,
                   std::vector<std::string>* warnings, char** environ_list) {
  Config cfg;
  const char* conf_env = getenv_fn("SHUNT_CONF_FILE");
  std::string conf = conf_env ? conf_env : spec(Param::conf_file).def;
  if (!conf.empty()) {
    std::ifstream in(conf);
    if (!in) {
      if (conf_env)
        warnings->push_back("SHUNT_CONF_FILE='" + conf + "' cannot be read: " + std::strerror(errno));
    } else {
      std::string line;
      int lineno = 0;
      while (std::getline(in, line)) {
        lineno++;
        std::string_view l = trim(line);
        if (l.empty() || l.front() == '#') continue;
        auto eq = l.find('=');
        std::string where = conf + ":" + std::to_string(lineno);
        if (eq == std::string_view::npos) {
          errors->push_back({"", std::string(l), where + ": expected NAME=value, got '" + std::string(l) + "'"});
          continue;
        }
        std::string_view name = trim(l.substr(0, eq));
        int p = find_param(name);
        if (p < 0) {
          warnings->push_back(where + ": unknown variable " + std::string(name) + " ignored");
          continue;
        }
        ConfigError e;
        if (!cfg.set(static_cast<Param>(p), trim(l.substr(eq + 1)), where, &e)) errors->push_back(e);
      }
    }
  }
  for (int i = 0; i < kParamCount; i++) {
    const char* v = getenv_fn(kSpecs[i].name);
    if (!v) continue;
    ConfigError e;
    if (!cfg.set(static_cast<Param>(i), v, "env", &e)) errors->push_back(e);
  }
  for (char** e = environ_list; e && *e; e++) {
    std::string_view kv(*e);
    if (kv.rfind("SHUNT_", 0) != 0) continue;
    std::string_view name = kv.substr(0, kv.find('='));
    if (find_param(name) < 0)
      warnings->push_back("unknown variable " + std::string(name) + " ignored");
  }
  if (!errors->empty()) {
    ConfigError ignored;
    cfg.set(Param::mode, "off", "fallback after a bad value", &ignored);
  }
  return cfg;
}

std::string expand_pattern(std::string_view pattern, int pid) {
  std::string out;
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  for (size_t i = 0; i < pattern.size(); i++) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      char c = pattern[i + 1];
      if (c == 'h') { out += host; i++; continue; }
      if (c == 'p') { out += std::to_string(pid); i++; continue; }
      if (c == '%') { out += '%'; i++; continue; }
    }
    out += pattern[i];
  }
  return out;
}

}  // namespace shunt
