#include "core/config.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace shunt {

namespace {
constexpr ParamSpec kSpecs[] = {
#define SHUNT_PARAM(id, name, kind, scope, def, min, max, choices, help) \
  {name, ParamKind::kind, ParamScope::scope, def, min, max, choices, help},
#include "core/params.def"
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

bool same_word(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); i++)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// A choice of exactly on and off: a switch, which takes the usual spellings.
bool is_switch(const std::vector<std::string_view>& c) {
  return c.size() == 2 && ((c[0] == "on" && c[1] == "off") || (c[0] == "off" && c[1] == "on"));
}

// Escapes control bytes of the first `max` bytes (never cutting a UTF-8
// sequence); *cut tells whether anything was left out.
std::string escape_controls(std::string_view text, size_t max, bool* cut) {
  size_t n = text.size();
  if (n > max) {
    n = max;
    while (n > 0 && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) n--;
  }
  *cut = n < text.size();
  std::string out;
  out.reserve(n + 16);
  for (size_t i = 0; i < n; i++) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c == '\r') out += "\\r";
    else if (c < 0x20 || c == 0x7f) {
      char hex[8];
      snprintf(hex, sizeof hex, "\\x%02x", c);
      out += hex;
    } else
      out += static_cast<char>(c);
  }
  return out;
}

const char* file_kind(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

enum class ConfRead { ok, absent, refused };

// Reads the config file into `text`. Anything but a regular file is refused
// before it is opened (a FIFO would block, a device never end), and the read
// stops at kMaxConfFileBytes; `why` says what was wrong.
ConfRead read_conf_file(const std::string& path, std::string* text, std::string* why) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    *why = std::strerror(errno);
    return ConfRead::absent;
  }
  auto refuse = [&](const std::string& what) {
    *why = what;
    return ConfRead::refused;
  };
  auto not_regular = [&](mode_t m) {
    return refuse(std::string("is ") + file_kind(m) + ", not a regular file");
  };
  auto too_large = [&](long long bytes) {
    return refuse("has " + std::to_string(bytes) + " bytes, more than the " + std::to_string(kMaxConfFileBytes) +
                  " shunt reads of a file");
  };
  if (!S_ISREG(st.st_mode)) return not_regular(st.st_mode);
  if (st.st_size > static_cast<off_t>(kMaxConfFileBytes)) return too_large(st.st_size);
  int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *why = std::strerror(errno);
    return ConfRead::absent;
  }
  // The file may have been replaced since stat(): check what was opened.
  ConfRead r = ConfRead::ok;
  text->assign(kMaxConfFileBytes + 1, '\0');
  size_t got = 0;
  if (fstat(fd, &st) != 0) r = refuse(std::string("cannot be examined: ") + std::strerror(errno));
  else if (!S_ISREG(st.st_mode)) r = not_regular(st.st_mode);
  else
    while (got < text->size()) {
      ssize_t n = read(fd, text->data() + got, text->size() - got);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        r = refuse(std::string("cannot be read: ") + std::strerror(errno));
        break;
      }
      if (n == 0) break;
      got += static_cast<size_t>(n);
    }
  close(fd);
  if (r == ConfRead::ok && got > kMaxConfFileBytes) r = too_large(static_cast<long long>(got));
  text->resize(r == ConfRead::ok ? got : 0);
  return r;
}

// SHUNT_JOB_KEY from the first line of SHUNT_JOB_KEY_FILE, where the key
// itself is not set: the file is shared by the nodes of a job launched on
// each node apart. A file that gives no key is a bad value of a Data
// variable: without the job's key the host's bundles and probes fail.
void read_job_key_file(Config* cfg, std::vector<ConfigError>* errors) {
  const std::string path = cfg->str(Param::job_key_file);
  if (path.empty() || !cfg->str(Param::job_key).empty()) return;
  std::string text, why;
  ConfRead r = read_conf_file(path, &text, &why);
  std::string_view key = trim(std::string_view(text).substr(0, text.find('\n')));
  if (r == ConfRead::ok && key.empty()) why = "has no key on its first line";
  if (r != ConfRead::ok || key.empty()) {
    errors->push_back({"SHUNT_JOB_KEY_FILE", path, "SHUNT_JOB_KEY_FILE=" + quote(path) + " " +
                                                       (r == ConfRead::absent ? "cannot be read: " : "") + why});
    return;
  }
  ConfigError e;
  cfg->set(Param::job_key, key, path, &e);
}
}  // namespace

std::span<const ParamSpec> param_specs() { return kSpecs; }
const ParamSpec& spec(Param p) { return kSpecs[static_cast<int>(p)]; }

int choice_index(const ParamSpec& s, std::string_view value) {
  auto c = split_choices(s.choices);
  for (size_t i = 0; i < c.size(); i++)
    if (same_word(c[i], value)) return static_cast<int>(i);
  if (!is_switch(c)) return -1;
  std::string_view word;
  for (const char* w : {"1", "true", "yes"})
    if (same_word(value, w)) word = "on";
  for (const char* w : {"0", "false", "no"})
    if (same_word(value, w)) word = "off";
  for (size_t i = 0; i < c.size() && !word.empty(); i++)
    if (c[i] == word) return static_cast<int>(i);
  return -1;
}

bool parse_decimal(std::string_view t, long long* out, bool* overflow) {
  *overflow = false;
  bool neg = !t.empty() && t.front() == '-';
  if (!t.empty() && (t.front() == '-' || t.front() == '+')) t.remove_prefix(1);
  if (t.empty()) return false;
  const unsigned long long limit = neg ? static_cast<unsigned long long>(LLONG_MAX) + 1 : LLONG_MAX;
  unsigned long long mag = 0;
  for (char ch : t) {
    if (ch < '0' || ch > '9') return false;
    unsigned d = static_cast<unsigned>(ch - '0');
    if (mag > (limit - d) / 10) *overflow = true;
    else if (!*overflow) mag = mag * 10 + d;
  }
  if (*overflow) return false;
  *out = neg ? static_cast<long long>(0 - mag) : static_cast<long long>(mag);
  return true;
}

std::string printable(std::string_view text, size_t max) {
  bool cut = false;
  std::string out = escape_controls(text, max, &cut);
  if (cut) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string quote(std::string_view text, size_t max) {
  bool cut = false;
  std::string out = "'" + escape_controls(text, max, &cut) + "'";
  if (cut) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string describe_allowed(const ParamSpec& s) {
  switch (s.kind) {
    case ParamKind::Enum: {
      auto c = split_choices(s.choices);
      if (is_switch(c)) return "on or off (or 1/0, true/false, yes/no)";
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
    err->message = std::string(s.name) + "=" + quote(value) + " " +
                   (source == "env" ? "" : "(from " + printable(source) + ") ") + why + ": expected " +
                   describe_allowed(s);
    return false;
  };
  switch (s.kind) {
    case ParamKind::Enum: {
      int c = choice_index(s, trim(value));
      if (c < 0) return fail("is not a known value");
      num_[i] = c;
      str_[i] = split_choices(s.choices)[c];  // the word as the registry spells it
      src_[i] = source;
      return true;
    }
    case ParamKind::Int: {
      std::string_view v = trim(value);
      if (v.empty()) return fail("is empty");
      long long n = 0;
      bool overflow = false;
      if (!parse_decimal(v, &n, &overflow)) return fail(overflow ? "is out of range" : "is not a decimal number");
      if (n < s.min || n > s.max) return fail("is out of range");
      num_[i] = n;
      str_[i] = std::to_string(n);  // 07472 reads as 7472
      src_[i] = source;
      return true;
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
  auto apply = [&](int p, std::string_view value, const std::string& source) {
    const ParamSpec& s = kSpecs[p];
    if (s.kind != ParamKind::Str && trim(value).empty()) return;  // an empty word or number is unset
    ConfigError e;
    if (cfg.set(static_cast<Param>(p), value, source, &e)) return;
    if (s.scope == ParamScope::Report)
      warnings->push_back(e.message + "; using " + quote(cfg.str(static_cast<Param>(p))) + " instead");
    else
      errors->push_back(std::move(e));
  };
  const char* conf_env = getenv_fn("SHUNT_CONF_FILE");
  std::string conf = conf_env ? conf_env : spec(Param::conf_file).def;
  std::string text, why;
  ConfRead read = conf.empty() ? ConfRead::absent : read_conf_file(conf, &text, &why);
  if (read == ConfRead::refused)
    errors->push_back({"SHUNT_CONF_FILE", conf, "SHUNT_CONF_FILE=" + quote(conf) + " " + why + ": not read"});
  else if (read == ConfRead::absent && conf_env && !conf.empty())
    warnings->push_back("SHUNT_CONF_FILE=" + quote(conf) + " cannot be read: " + why);
  std::string_view rest = text;
  for (int lineno = 1; !rest.empty(); lineno++) {
    size_t nl = rest.find('\n');
    std::string_view l = trim(rest.substr(0, nl));
    rest.remove_prefix(nl == std::string_view::npos ? rest.size() : nl + 1);
    if (l.empty() || l.front() == '#') continue;
    auto eq = l.find('=');
    std::string where = conf + ":" + std::to_string(lineno);
    if (eq == std::string_view::npos) {
      errors->push_back({"", std::string(l), printable(where) + ": expected NAME=value, got " + quote(l)});
      continue;
    }
    std::string_view name = trim(l.substr(0, eq));
    int p = find_param(name);
    if (p < 0) {
      warnings->push_back(printable(where) + ": unknown variable " + printable(name) + " ignored");
      continue;
    }
    apply(p, trim(l.substr(eq + 1)), where);
  }
  for (int i = 0; i < kParamCount; i++)
    if (const char* v = getenv_fn(kSpecs[i].name)) apply(i, v, "env");
  for (char** e = environ_list; e && *e; e++) {
    std::string_view kv(*e);
    if (kv.rfind("SHUNT_", 0) != 0) continue;
    std::string_view name = kv.substr(0, kv.find('='));
    if (find_param(name) < 0) warnings->push_back("unknown variable " + printable(name) + " ignored");
  }
  read_job_key_file(&cfg, errors);
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
