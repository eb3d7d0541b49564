// What every instance answers on the audit port, the driver's own
// included: its facts and counters, path discovery, and the RC endpoints
// of the measurements the driver sets up (one request at a time, on the
// peer channel listener's thread).
#pragma once
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "clocksync/engine.h"
#include "peer/wire.h"
#include "tools/shunt-audit/facts.h"
#include "tools/shunt-audit/options.h"
#include "tools/shunt-audit/rc.h"

namespace audit {

using nlohmann::json;

// What every instance answers on the audit port (the driver's own too).
// At most kMaxEndpoints measurement endpoints are open at once, and at most
// kMaxMeshPaths source paths probed on kMaxMeshRails rails: whoever holds
// the key cannot make it pin unbounded memory or sockets.
constexpr size_t kMaxEndpoints = 16;
constexpr size_t kMaxMeshPaths = 4096, kMaxMeshRails = 64;
class Server {
 public:
  // probe_key: the probe mesh's (clocksync::derive_probe_key of the job's key).
  Server(const Options& o, const shunt::peer::Key& key, const shunt::clocksync::Key& probe_key,
         int rank)
      : o_(o), key_(key), rank_(rank), probe_key_(probe_key) {}
  json handle(const json& req) {
    try {
      return dispatch(req);
    } catch (const std::exception& e) {
      return {{"error", e.what()}};
    }
  }
  // Until the driver says done (its verdict) or the timeout.
  int wait_done() {
    std::unique_lock lk(mu_);
    if (!cv_.wait_for(lk, std::chrono::seconds(o_.timeout_s), [&] { return done_; })) return -1;
    return status_;
  }

 private:
  json dispatch(const json& req);
  // The probe mesh: this host's probe engine to every other host, on every
  // rail both ends probe, and from the source ports the driver names.
  json mesh_start(const json& req);
  json mesh_report() const;
  const audit::PortRef& rail(int r) {
    if (rails_.empty()) rails_ = audit::rails(audit::host_facts(o_.devices));
    if (r < 0 || r >= static_cast<int>(rails_.size()))
      throw std::runtime_error("no rail " + std::to_string(r));
    return rails_[r];
  }
  audit::RcEndpoint& endpoint(const json& req) {
    auto it = eps_.find(req.at("id").get<int>());
    if (it == eps_.end()) throw std::runtime_error("no endpoint " + req.at("id").dump());
    return *it->second;
  }

  const Options& o_;
  shunt::peer::Key key_;
  int rank_;
  std::vector<audit::PortRef> rails_;
  std::map<int, std::unique_ptr<audit::RcEndpoint>> eps_;  // only the listener thread touches these
  shunt::clocksync::Key probe_key_;
  std::unique_ptr<shunt::clocksync::ProbeEngine> mesh_;  // the listener thread's too
  struct MeshSource {
    int peer, rail, port, id;
    std::string router;  // two hops out, as discovery found it for the probes' destination port
  };
  std::vector<MeshSource> mesh_sources_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  int status_ = 0;
  std::string verdict_;

 public:
  // The driver's verdict line, once wait_done() returned it.
  std::string verdict() {
    std::lock_guard lk(mu_);
    return verdict_;
  }
};

}  // namespace audit
