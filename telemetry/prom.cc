#include "telemetry/prom.h"

#include <charconv>
#include <cmath>

#include "interpose/core/json_text.h"

namespace shunt::telemetry {

// Label values and help are UTF-8 in the format: bytes from the environment
// or a report that are not become U+FFFD first.
std::string escape_label_value(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : valid_utf8(v)) {
    if (c == '\\') out += "\\\\";
    else if (c == '"') out += "\\\"";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string escape_help(std::string_view v) {
  std::string out;
  for (char c : valid_utf8(v)) {
    if (c == '\\') out += "\\\\";
    else if (c == '\n') out += "\\n";
    else out += c;
  }
  return out;
}

std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

bool valid_metric_name(std::string_view n) {
  if (n.empty()) return false;
  for (size_t i = 0; i < n.size(); i++) {
    char c = n[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    if (!alpha && !(i > 0 && c >= '0' && c <= '9')) return false;
  }
  return true;
}

bool valid_label_name(std::string_view n) {
  return valid_metric_name(n) && n.find(':') == std::string_view::npos && !n.starts_with("__");
}

Exposition::Family* Exposition::find(std::string_view name) {
  for (auto& f : families_)
    if (f.name == name) return &f;
  return nullptr;
}

bool Exposition::has(std::string_view name) const {
  for (auto& f : families_)
    if (f.name == name) return true;
  return false;
}

void Exposition::family(std::string_view name, std::string_view type, std::string_view help) {
  if (find(name) || !valid_metric_name(name)) return;
  families_.push_back({std::string(name), std::string(type), escape_help(help), ""});
}

bool Exposition::add_line(std::string_view name, const Labels& labels, const std::string& value) {
  Family* f = find(name);
  if (!f) return false;
  std::string& l = f->lines;
  l += name;
  bool first = true;
  for (auto& [k, v] : labels) {
    if (!valid_label_name(k)) continue;
    l += first ? '{' : ',';
    first = false;
    l += k;
    l += "=\"";
    l += escape_label_value(v);
    l += '"';
  }
  if (!first) l += '}';
  l += ' ';
  l += value;
  l += '\n';
  return true;
}

bool Exposition::add(std::string_view name, const Labels& labels, double value) {
  return add_line(name, labels, format_value(value));
}

bool Exposition::add(std::string_view name, const Labels& labels, uint64_t value) {
  return add_line(name, labels, std::to_string(value));
}

std::string Exposition::text() const {
  std::string out;
  for (auto& f : families_) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    out += f.lines;
  }
  return out;
}

}  // namespace shunt::telemetry
