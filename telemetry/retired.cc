#include "telemetry/retired.h"

#include <map>
#include <string>
#include <vector>

#include "telemetry/report_json.h"
#include "telemetry/rhythm.h"

namespace shunt::telemetry {

namespace {
using nlohmann::json;
using namespace reports;

uint64_t plus(uint64_t a, uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

void sum_field(json& into, const json& from, const char* key) { into[key] = plus(u64(into, key), u64(from, key)); }

// {name: count} added name by name (new names while there is room).
void sum_counts(json& into, const json& from) {
  if (!into.is_object()) into = json::object();
  if (!from.is_object()) return;
  for (auto& [k, n] : from.items())
    if (into.contains(k) || into.size() < kMaxRetiredKeys) into[k] = plus(u64(into, k.c_str()), count(n));
}

void fold_qp(json& into, const json& q) {
  for (const char* k : {"send_bytes", "recv_bytes", "recv_wrs", "completions", "send_post_errors", "recv_post_errors"})
    sum_field(into, q, k);
  sum_counts(into["send_wrs"], dict(q, "send_wrs"));
  sum_counts(into["errors"], dict(q, "errors"));
}

// The entries of a list by the values of some of their fields.
class Keyed {
 public:
  Keyed(json& list, std::vector<const char*> fields) : list_(list), fields_(std::move(fields)) {
    if (!list_.is_array()) list_ = json::array();
    for (size_t i = 0; i < list_.size(); i++) {
      std::vector<std::string> values;
      for (const char* f : fields_) values.push_back(str(list_[i], f));
      index_.emplace(key(values), i);
    }
  }
  // The entry with these values, added when there is none and room.
  json* get(const std::vector<std::string>& values) {
    const std::string k = key(values);
    if (auto it = index_.find(k); it != index_.end()) return &list_[it->second];
    if (list_.size() >= kMaxRetiredKeys) return nullptr;
    json e = json::object();
    for (size_t i = 0; i < fields_.size(); i++) e[fields_[i]] = values[i];
    index_.emplace(k, list_.size());
    list_.push_back(std::move(e));
    return &list_.back();
  }

 private:
  static std::string key(const std::vector<std::string>& values) {
    std::string k;
    for (const auto& v : values) k += v, k += '\0';
    return k;
  }
  json& list_;
  std::vector<const char*> fields_;
  std::map<std::string, size_t> index_;
};

// A socket end with any port, as a process writes its summed closed ones.
std::string any_port(const std::string& addr) {
  const std::string h = host_of(addr);
  return h.find(':') != std::string::npos ? "[" + h + "]:*" : h + ":*";
}
}  // namespace

void fold_exited(json& retired, const json& m) {
  if (!retired.is_array()) retired = json::array();
  const std::string job = str(m, "job"), rank = str(m, "rank");
  json* r = nullptr;
  for (auto& e : retired)
    if (str(e, "job") == job && str(e, "rank") == rank) r = &e;
  if (!r) {
    if (retired.size() >= kMaxRetired) return;
    retired.push_back({{"job", job}, {"rank", rank}, {"final", true}, {"retired", true}, {"processes", 0}});
    r = &retired.back();
  }
  json& e = *r;
  e["processes"] = u64(e, "processes") + 1;
  if (const json& v = at(m, "verbs"); v.is_object()) {
    json& rv = e["verbs"];
    if (!rv.is_object()) rv = json::object();
    sum_counts(rv["calls"], dict(v, "calls"));
    // Counters per device and type; transfer times per pair.
    Keyed qps(rv["qps"], {"device", "type"}), transfers(e["transfers"], {"local", "peer"});
    for (auto& q : list(v, "qps")) {
      if (json* t = qps.get({str(q, "device"), str(q, "type")})) {
        fold_qp(*t, q);
        (*t)["destroyed"] = true;
      }
      const json& counts = at(q, "transfers");
      if (!counts.is_array() || counts.size() != kTransferBucketsMs.size() + 1) continue;
      if (str(q, "local").empty() || str(q, "peer").empty()) continue;
      json* t = transfers.get({str(q, "local"), str(q, "peer")});
      if (!t) continue;
      json& c = (*t)["transfers"];
      if (!c.is_array() || c.size() != counts.size()) c = json(counts.size(), uint64_t{0});
      for (size_t i = 0; i < counts.size(); i++) c[i] = plus(count(c[i]), count(counts[i]));
      sum_field(*t, q, "transfer_ms");
    }
    Keyed devices(rv["devices"], {"device"});
    for (auto& d : list(v, "devices"))
      if (json* t = devices.get({str(d, "device")})) fold_qp((*t)["untracked_qps"], at(d, "untracked_qps"));
  }
  // Every socket, open at the end or not, becomes a closed one summed by
  // role and the two hosts; an MPTCP one keeps its bytes per path.
  Keyed socks(e["closed_sockets"], {"role", "local", "peer", "kind"});
  for (const char* key : {"sockets", "closed_sockets"}) {
    const bool summed = key[0] == 'c';
    for (auto& s : list(m, key)) {
      const bool mptcp = at(s, "paths").is_array();
      json* t = socks.get({str(s, "role"), any_port(str(s, "local")), any_port(str(s, "peer")), mptcp ? "mptcp" : "tcp"});
      if (!t) continue;
      (*t)["sockets"] = plus(u64(*t, "sockets"), summed ? u64(s, "sockets") : 1);
      for (const char* k : {"tx_bytes", "rx_bytes", "accepts"}) sum_field(*t, s, k);
      if (!mptcp) continue;
      Keyed paths((*t)["paths"], {"local", "remote"});
      for (auto& p : list(s, "paths"))
        if (json* u = paths.get({str(p, "local"), str(p, "remote")}))
          for (const char* k : {"tx_bytes", "rx_bytes"}) sum_field(*u, p, k);
    }
  }
  Keyed paths(e["closed_bundle_paths"], {"device", "nic", "path"});
  for (auto& b : list(m, "bundles"))
    for (auto& q : list(b, "paths"))
      if (json* t = paths.get({str(b, "device"), str(q, "nic"), str(q, "path")})) {
        (*t)["bundles"] = u64(*t, "bundles") + 1;
        for (const char* k : {"tx_bytes", "fails"}) sum_field(*t, q, k);
      }
  for (auto& q : list(m, "closed_bundle_paths"))
    if (json* t = paths.get({str(q, "device"), str(q, "nic"), str(q, "path")}))
      for (const char* k : {"bundles", "tx_bytes", "fails"}) sum_field(*t, q, k);
  sum_counts(e["events"], dict(m, "events"));
  for (const char* k : {"replays", "events_dropped"}) sum_field(e, m, k);
}

}  // namespace shunt::telemetry
