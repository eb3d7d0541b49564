#include "telemetry/report_json.h"

namespace shunt::telemetry::reports {

using nlohmann::json;

std::string host_of(const std::string& addr) {  // "1.2.3.4:80" or "[::1]:80" -> the address
  size_t c = addr.rfind(':');
  std::string h = c == std::string::npos ? addr : addr.substr(0, c);
  if (h.size() >= 2 && h.front() == '[') h = h.substr(1, h.size() - 2);
  return h;
}

// The reports are other processes' JSON, read without trusting a type: a
// field that is missing or of another type reads as empty, never throws.
const json& at(const json& j, const char* key) {
  static const json* none = new json;
  if (!j.is_object()) return *none;
  auto it = j.find(key);
  return it == j.end() ? *none : *it;
}

uint64_t count(const json& v) {
  if (v.is_number_unsigned()) return v.get<uint64_t>();
  if (v.is_number_integer()) return v.get<int64_t>() < 0 ? 0 : v.get<uint64_t>();
  if (!v.is_number_float()) return 0;
  double d = v.get<double>();
  return d >= 1.8e19 ? UINT64_MAX : d >= 0 ? static_cast<uint64_t>(d) : 0;  // NaN: 0
}

uint64_t u64(const json& j, const char* key) { return count(at(j, key)); }

std::string str(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_string() ? v.get<std::string>() : "";
}

bool flag(const json& j, const char* key) {
  const json& v = at(j, key);
  return v.is_boolean() && v.get<bool>();
}

double real(const json& j, const char* key, double dflt) {
  const json& v = at(j, key);
  return v.is_number() ? v.get<double>() : dflt;
}

// The members of an array, or nothing.
const json& list(const json& j, const char* key) {
  static const json* empty = new json(json::array());
  const json& v = at(j, key);
  return v.is_array() ? v : *empty;
}

// The (key, value) pairs of an object, or nothing.
const json& dict(const json& j, const char* key) {
  static const json* empty = new json(json::object());
  const json& v = at(j, key);
  return v.is_object() ? v : *empty;
}

}  // namespace shunt::telemetry::reports
