// Typed registry of every SHUNT_* variable (see params.def) and the values
// in force for this process.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace shunt {

enum class ParamKind { Enum, Int, Str };
// What a bad value does (params.def): a Data variable decides what happens to
// the job's data, so shunt turns off; a Report one only what shunt logs and
// reports, so the value is ignored with a warning.
enum class ParamScope { Data, Report };

struct ParamSpec {
  const char* name;
  ParamKind kind;
  ParamScope scope;
  const char* def;
  long long min, max;
  const char* choices;  // "a|b|c" for Enum
  const char* help;
};

enum class Param : int {
#define SHUNT_PARAM(id, name, kind, scope, def, min, max, choices, help) id,
#include "core/params.def"
#undef SHUNT_PARAM
  count_
};
constexpr int kParamCount = static_cast<int>(Param::count_);

std::span<const ParamSpec> param_specs();
const ParamSpec& spec(Param p);
// Index of `value` among an Enum's choices in any case (for on|off also
// 1/0, true/false, yes/no), or -1.
int choice_index(const ParamSpec& s, std::string_view value);
// "a, b or c" for messages.
std::string describe_allowed(const ParamSpec& s);
// A decimal integer: optional sign, digits only (leading zeros are decimal).
// False for anything else; *overflow tells a number too large for long long.
bool parse_decimal(std::string_view text, long long* out, bool* overflow);
// `text` fit for one line of a message: control bytes escaped (\n, \xNN),
// cut to `max` bytes with its full length noted ("... (N bytes)").
std::string printable(std::string_view text, size_t max = 100);
// The same in single quotes, the note after them: how messages echo a value.
std::string quote(std::string_view text, size_t max = 100);

// The config file: read only when it is a regular file of at most this many
// bytes, without blocking (a FIFO or a device is refused, not read).
constexpr size_t kMaxConfFileBytes = 64 * 1024;

enum class Mode { off, observe, active };
enum class LogLevel { trace, debug, info, warn, error, off };

struct ConfigError {
  std::string name, value, message;  // message is the whole line to print
};

class Config {
 public:
  Config();  // every parameter at its default
  long long num(Param p) const { return num_[idx(p)]; }
  const std::string& str(Param p) const { return str_[idx(p)]; }
  // Where the value came from: "default", "env" or the config file's path.
  const std::string& source(Param p) const { return src_[idx(p)]; }
  Mode mode() const { return static_cast<Mode>(num(Param::mode)); }

  // Parses and sets one value; on error returns false and fills `err`.
  bool set(Param p, std::string_view value, const std::string& source, ConfigError* err);

 private:
  static int idx(Param p) { return static_cast<int>(p); }
  long long num_[kParamCount];
  std::string str_[kParamCount];
  std::string src_[kParamCount];
};

using Getenv = std::function<const char*(const char*)>;

// Builds the configuration: defaults, then the config file (SHUNT_CONF_FILE
// from the environment, else the default path; a missing default file is no
// error), then the environment; an empty word or number is unset. A bad value
// of a Data variable, a bad line, or a config file that is not a regular file
// of at most kMaxConfFileBytes is reported in `errors` and forces mode off; a
// bad value of a Report variable is ignored and reported in `warnings`, as
// are unknown SHUNT_* names.
Config load_config(const Getenv& getenv_fn, std::vector<ConfigError>* errors,
                   std::vector<std::string>* warnings, char** environ_list);

// Expands %h (host name) and %p (pid) in a file name pattern.
std::string expand_pattern(std::string_view pattern, int pid);

}  // namespace shunt
