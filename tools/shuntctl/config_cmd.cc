#include "tools/shuntctl/config_cmd.h"

#include <cstdlib>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/json_text.h"

extern char** environ;

namespace shunt::ctl {

namespace {
std::string kind_name(const ParamSpec& s) {
  switch (s.kind) {
    case ParamKind::Enum: return "enum";
    case ParamKind::Int: return "int";
    case ParamKind::Str: return "string";
  }
  return "";
}

std::string allowed(const ParamSpec& s) {
  switch (s.kind) {
    case ParamKind::Enum: {
      std::string c = s.choices;
      for (auto& ch : c)
        if (ch == '|') ch = ',';
      return c;
    }
    case ParamKind::Int: return std::to_string(s.min) + ".." + std::to_string(s.max);
    case ParamKind::Str: return "text";
  }
  return "";
}

// The man pages' text after the one-line help (params_long.def); a duplicate or
// unknown id does not compile.
const char* long_help(Param p) {
  switch (p) {
#define SHUNT_PARAM_LONG(id, text) \
  case Param::id: return text;
#include "core/params_long.def"
#undef SHUNT_PARAM_LONG
    default: return "";
  }
}

// What a bad value of the variable does.
std::string on_bad(const ParamSpec& s) { return s.scope == ParamScope::Data ? "shunt off" : "ignored, warning"; }
std::string scope_name(const ParamSpec& s) { return s.scope == ParamScope::Data ? "data" : "report"; }

// roff: escape backslashes and a leading dot or quote.
std::string roff(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '\\') out += "\\e";
    else if (c == '-') out += "\\-";
    else out += c;
  }
  if (!out.empty() && (out[0] == '.' || out[0] == '\'')) out = "\\&" + out;
  // mdoc wants each sentence on its own line.
  for (size_t p = 0; (p = out.find(". ", p)) != std::string::npos;) out.replace(p, 2, ".\n"), p += 2;
  return out;
}
}  // namespace

int print_config(std::ostream& out, ConfigFormat fmt) {
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config cfg = load_config([](const char* n) { return getenv(n); }, &errors, &warnings, environ);
  auto specs = param_specs();
  switch (fmt) {
    case ConfigFormat::json: {
      nlohmann::json j = nlohmann::json::array();
      for (int i = 0; i < kParamCount; i++) {
        const ParamSpec& s = specs[i];
        j.push_back({{"name", s.name}, {"type", kind_name(s)}, {"default", s.def},
                     {"value", cfg.str(static_cast<Param>(i))}, {"source", cfg.source(static_cast<Param>(i))},
                     {"allowed", allowed(s)}, {"scope", scope_name(s)}, {"help", s.help}});
      }
      nlohmann::json doc = {{"variables", j}, {"errors", nlohmann::json::array()}, {"warnings", warnings}};
      for (auto& e : errors) doc["errors"].push_back(e.message);
      out << shunt::to_text(doc, 2) << "\n";  // values from the environment: any bytes
      break;
    }
    case ConfigFormat::markdown:
      out << "| variable | default | allowed | bad value | meaning |\n|---|---|---|---|---|\n";
      for (auto& s : specs)
        out << "| `" << s.name << "` | " << (*s.def ? "`" + std::string(s.def) + "`" : "(empty)") << " | "
            << allowed(s) << " | " << (s.kind == ParamKind::Str ? "" : on_bad(s)) << " | " << s.help << " |\n";
      break;
    case ConfigFormat::man:
      for (int i = 0; i < kParamCount; i++) {
        const ParamSpec& s = specs[i];
        out << ".It Ev " << s.name << "\n" << roff(s.help) << "\n";
        if (*long_help(static_cast<Param>(i))) out << roff(long_help(static_cast<Param>(i))) << "\n";
        out << ".Pp\nType " << kind_name(s);
        if (s.kind != ParamKind::Str) out << ", allowed " << roff(allowed(s));
        out << ", default " << (*s.def ? "\\(lq" + roff(s.def) + "\\(rq" : std::string("empty")) << ".\n";
        if (s.kind != ParamKind::Str)
          out << (s.scope == ParamScope::Data ? "A bad value turns shunt off for the process.\n"
                                              : "A bad value is ignored with a warning.\n");
      }
      break;
    case ConfigFormat::table:
      for (int i = 0; i < kParamCount; i++) {
        const ParamSpec& s = specs[i];
        Param p = static_cast<Param>(i);
        out << s.name << "=" << cfg.str(p) << "  (" << cfg.source(p) << "; default '" << s.def << "'; "
            << kind_name(s) << " " << allowed(s) << (s.kind == ParamKind::Str ? "" : "; bad value: " + on_bad(s))
            << ")\n    " << s.help << "\n";
      }
      for (auto& w : warnings) out << "warning: " << w << "\n";
      for (auto& e : errors) out << "error: " << e.message << "; shunt would be off\n";
      break;
  }
  return errors.empty() ? 0 : 1;
}

}  // namespace shunt::ctl
