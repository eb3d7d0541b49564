// The Prometheus text exposition format (0.0.4), written here because no
// client library is packaged in Debian 12: families in declaration order,
// each with HELP and TYPE, label values and help text escaped, counters
// printed as exact integers.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shunt::telemetry {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Exposition {
 public:
  // Declares a metric family (type: counter, gauge, untyped). Declaring a
  // family twice keeps the first declaration.
  void family(std::string_view name, std::string_view type, std::string_view help);
  // Adds one sample to a declared family (undeclared: dropped, false).
  bool add(std::string_view name, const Labels& labels, double value);
  bool add(std::string_view name, const Labels& labels, uint64_t value);
  bool add(std::string_view name, const Labels& labels, int64_t value) {
    return value >= 0 ? add(name, labels, static_cast<uint64_t>(value)) : add(name, labels, double(value));
  }
  bool add(std::string_view name, const Labels& labels, int value) { return add(name, labels, int64_t{value}); }
  bool add(std::string_view name, const Labels& labels, bool value) { return add(name, labels, uint64_t{value}); }
  // The whole exposition; every family, even one without samples.
  std::string text() const;
  bool has(std::string_view name) const;

 private:
  struct Family {
    std::string name, type, help, lines;
  };
  Family* find(std::string_view name);
  bool add_line(std::string_view name, const Labels& labels, const std::string& value);
  std::vector<Family> families_;
};

std::string escape_label_value(std::string_view v);
std::string escape_help(std::string_view v);
std::string format_value(double v);
// Whether `name` is a valid metric or label name ([a-zA-Z_:][a-zA-Z0-9_:]*,
// labels without ':').
bool valid_metric_name(std::string_view name);
bool valid_label_name(std::string_view name);

}  // namespace shunt::telemetry
