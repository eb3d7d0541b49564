// The Prometheus text exposition format (0.0.4), written here because no
// client library is packaged in Debian 12: families in declaration order,
// each with HELP and TYPE, label values and help text escaped, counters
// printed as exact integers. Samples with the same labels are merged (summed,
// or the largest kept), so series are aggregates, one per label set.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shunt::telemetry {

using Labels = std::vector<std::pair<std::string, std::string>>;

class Exposition {
 public:
  // Declares a metric family (type: counter, gauge, histogram, untyped).
  // Declaring a family twice keeps the first declaration.
  void family(std::string_view name, std::string_view type, std::string_view help);
  // Adds one sample to a declared family (undeclared: dropped, false); a
  // sample whose labels are already there is added to it.
  bool add(std::string_view name, const Labels& labels, double value);
  bool add(std::string_view name, const Labels& labels, uint64_t value);
  // As add, but the larger value stays (a gauge aggregated by its maximum).
  bool add_max(std::string_view name, const Labels& labels, double value);
  // A sample named family + suffix (a histogram's _bucket, _sum, _count).
  bool add_part(std::string_view name, std::string_view suffix, const Labels& labels, double value);
  bool add_part(std::string_view name, std::string_view suffix, const Labels& labels, uint64_t value);
  bool add(std::string_view name, const Labels& labels, int64_t value) {
    return value >= 0 ? add(name, labels, static_cast<uint64_t>(value)) : add(name, labels, double(value));
  }
  bool add(std::string_view name, const Labels& labels, int value) { return add(name, labels, int64_t{value}); }
  bool add(std::string_view name, const Labels& labels, bool value) { return add(name, labels, uint64_t{value}); }
  // The whole exposition; every family, even one without samples.
  std::string text() const;
  bool has(std::string_view name) const;

 private:
  struct Sample {
    std::string series;  // name and labels, as written
    bool exact;          // an integer count, printed as one
    uint64_t n;
    double d;
  };
  struct Family {
    std::string name, type, help;
    std::vector<Sample> samples;
    std::map<std::string, size_t, std::less<>> index;  // series -> samples[i]
  };
  enum class Merge { sum, max };
  Family* find(std::string_view name);
  bool put(std::string_view name, std::string_view suffix, const Labels& labels, bool exact, uint64_t n, double d,
           Merge m);
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
