#include "telemetry/prom.h"

#include <charconv>
#include <cmath>

#include "core/json_text.h"

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
  families_.push_back({std::string(name), std::string(type), escape_help(help), {}, {}});
}

bool Exposition::put(std::string_view name, std::string_view suffix, const Labels& labels, bool exact, uint64_t n,
                     double d, Merge m) {
  Family* f = find(name);
  if (!f) return false;
  std::string series(name);
  series += suffix;
  bool first = true;
  for (auto& [k, v] : labels) {
    if (!valid_label_name(k)) continue;
    series += first ? '{' : ',';
    first = false;
    series += k;
    series += "=\"";
    series += escape_label_value(v);
    series += '"';
  }
  if (!first) series += '}';
  auto it = f->index.find(series);
  if (it == f->index.end()) {
    f->index.emplace(series, f->samples.size());
    f->samples.push_back({std::move(series), exact, n, d});
    return true;
  }
  Sample& s = f->samples[it->second];
  if (m == Merge::max) {
    if ((exact ? double(n) : d) > (s.exact ? double(s.n) : s.d)) s.exact = exact, s.n = n, s.d = d;
    return true;
  }
  if (s.exact && exact) {
    s.n = n > UINT64_MAX - s.n ? UINT64_MAX : s.n + n;
  } else {
    s.d = (s.exact ? double(s.n) : s.d) + (exact ? double(n) : d);
    s.exact = false;
  }
  return true;
}

bool Exposition::add(std::string_view name, const Labels& labels, double value) {
  return put(name, "", labels, false, 0, value, Merge::sum);
}

bool Exposition::add(std::string_view name, const Labels& labels, uint64_t value) {
  return put(name, "", labels, true, value, 0, Merge::sum);
}

bool Exposition::add_max(std::string_view name, const Labels& labels, double value) {
  return put(name, "", labels, false, 0, value, Merge::max);
}

bool Exposition::add_part(std::string_view name, std::string_view suffix, const Labels& labels, double value) {
  return put(name, suffix, labels, false, 0, value, Merge::sum);
}

bool Exposition::add_part(std::string_view name, std::string_view suffix, const Labels& labels, uint64_t value) {
  return put(name, suffix, labels, true, value, 0, Merge::sum);
}

std::string Exposition::text() const {
  std::string out;
  for (auto& f : families_) {
    out += "# HELP " + f.name + " " + f.help + "\n";
    out += "# TYPE " + f.name + " " + f.type + "\n";
    for (auto& s : f.samples) {
      out += s.series;
      out += ' ';
      out += s.exact ? std::to_string(s.n) : format_value(s.d);
      out += '\n';
    }
  }
  return out;
}

}  // namespace shunt::telemetry
