// The set-up's messages: addresses, paths and rkeys as JSON, written and read.
#include "interpose/verbs/bundle/parts.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>

#include "core/mono.h"
#include "core/runtime.h"
#include "peer/channel.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

// This host's IPv4 addresses (up, not loopback): the peer's shim reaches
// this process on any of them when the rail behind the GID is down.
json local_addrs() {
  json out = json::array();
  ifaddrs* ifs = nullptr;
  if (getifaddrs(&ifs) != 0) return out;
  for (ifaddrs* i = ifs; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
      continue;
    char s[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr, s, sizeof s);
    if (out.size() < 16) out.push_back(s);
  }
  freeifaddrs(ifs);
  return out;
}

void read_addrs(Bundle* b, const json& msg) {
  if (!msg.contains("addrs") || !msg["addrs"].is_array()) return;
  b->peer_addrs.clear();
  for (const auto& a : msg["addrs"]) {
    in_addr x;
    if (a.is_string() && inet_pton(AF_INET, a.get<std::string>().c_str(), &x) == 1 && b->peer_addrs.size() < 16)
      b->peer_addrs.push_back(a.get<std::string>());
  }
}

json path_json(const Bundle* b, const Path& p) {
  json x = {{"qpn", p.qpn}, {"psn", p.psn}};
  if (p.rail) x["gid"] = gid_hex(b->rails[p.rail].lgid);  // another NIC: its address
  return x;
}

json paths_json(const Bundle* b) {
  json out = json::array();
  for (const auto& p : b->paths) out.push_back(path_json(b, p));
  return out;
}

// The peer's halves from a join request or reply (null entries: none);
// false when the list is missing, empty, longer than `max` or malformed.
bool parse_paths(const json& ps, size_t max, std::vector<Half>* out) {
  if (!ps.is_array() || ps.empty() || ps.size() > max) return false;
  out->clear();
  for (const auto& p : ps) {
    Half h;
    if (p.is_null()) {
      h.none = true;
      out->push_back(h);
      continue;
    }
    if (!p.is_object() || !p.value("qpn", json()).is_number_unsigned() ||
        !p.value("psn", json()).is_number_unsigned())
      return false;
    h.qpn = p["qpn"].get<uint32_t>() & 0xffffff;
    h.psn = p["psn"].get<uint32_t>() & 0xffffff;
    if (p.contains("gid")) {
      std::string ip;
      if (!p["gid"].is_string() || !parse_gid(p["gid"].get<std::string>(), &h.gid) || !gid_v4(h.gid, &ip)) return false;
      h.rail = true;
    }
    out->push_back(h);
  }
  return true;
}

// The peer's rkeys on its other NICs: {"rails": [{"gid", "rkeys": [[app, rail], ...]}]}.
json rkeys_json(const Bundle* b, const std::vector<uint32_t>* only) {
  json out = json::array();
  for (size_t k = 1; k < b->rails.size(); k++) {
    json m = json::array();
    for (auto [a, x] : rkey_map(b->pqp->pd, b->rails[k].r, only ? SIZE_MAX : 1024))
      if (!only || std::find(only->begin(), only->end(), a) != only->end()) m.push_back({a, x});
    out.push_back({{"gid", gid_hex(b->rails[k].lgid)}, {"rkeys", m}});
  }
  return out;
}

// Under b->lk.
void read_rkeys(Bundle* b, const json& msg) {
  if (!msg.contains("rails") || !msg["rails"].is_array()) return;
  for (const auto& r : msg["rails"]) {
    if (!r.is_object() || !r.contains("rkeys") || !r["rkeys"].is_array()) continue;
    std::string g = r.value("gid", "");
    for (size_t k = 1; k < b->rails.size(); k++) {
      if (gid_hex(b->rails[k].rgid) != g) continue;
      for (const auto& e : r["rkeys"])
        if (e.is_array() && e.size() == 2 && e[0].is_number_unsigned() && e[1].is_number_unsigned() &&
            b->rails[k].rkeys.size() < 65536)
          b->rails[k].rkeys[e[0].get<uint32_t>()] = e[1].get<uint32_t>();
    }
  }
}

namespace {

// Whether the route to `peer` leaves through rail k (no rail path over
// another NIC's route: its traffic would share the failure it is for).
bool routes_through(Bundle* b, size_t k, const ibv_gid& peer) {
  std::string ip, err;
  if (!gid_v4(peer, &ip)) return false;
  Rail* r = rail_toward(ip, b->gid_type, &err);
  return r && r == b->rails[k].r;
}

}  // namespace

// The peer's answer to our join: its halves, in our order; ours without a
// half (no NIC of the peer's routes to that rail) go. Under b->mu.
bool read_paths(Bundle* b, const json& reply, std::string* err) {
  std::vector<Half> remote;
  if (!parse_paths(reply.contains("paths") ? reply["paths"] : json(), b->paths.size(), &remote) ||
      remote.size() != b->paths.size()) {
    *err = "the peer's shim sent no usable paths";
    return false;
  }
  std::vector<Path> keep;
  for (size_t i = 0; i < remote.size(); i++) {
    Path& p = b->paths[i];
    const Half& h = remote[i];
    bool ok = !h.none && h.rail == (p.rail != 0);
    if (ok && p.rail) {
      BundleRail& br = b->rails[p.rail];
      static const ibv_gid zero{};
      if (memcmp(br.rgid.raw, zero.raw, 16) == 0) {
        if (routes_through(b, p.rail, h.gid)) br.rgid = h.gid;
        else event_rail_unrouted(b, br.device, h.gid);
      }
      ok = memcmp(br.rgid.raw, h.gid.raw, 16) == 0;
    }
    if (!ok) {
      ibv_destroy_qp(p.qp);
      continue;
    }
    p.remote_qpn = h.qpn;
    p.remote_psn = h.psn;
    keep.push_back(std::move(p));
  }
  if (keep.empty()) {
    *err = "the peer's shim matched none of the paths";
    return false;
  }
  b->paths = std::move(keep);
  std::lock_guard l(b->lk);
  read_rkeys(b, reply);
  return true;
}

namespace {

constexpr const char* kMsgNames[kMsgs] = {
    "bundle-join",    "bundle-activate", "bundle-abort", "bundle-give-up", "carrier-down", "carrier-prepare",
    "carrier-commit", "path-renew",      "path-down",    "steer-view",     "bundle-rkeys", "renew-now",
};

}  // namespace

const char* msg_name(Msg m) { return kMsgNames[static_cast<int>(m)]; }

bool msg_of(const std::string& name, Msg* m) {
  for (int i = 0; i < kMsgs; i++)
    if (name == kMsgNames[i]) {
      *m = static_cast<Msg>(i);
      return true;
    }
  return false;
}

json locate_request(const Bundle* b) { return {{"cmd", "locate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}; }

json request(const Bundle* b, Msg m, json fields) {
  fields["cmd"] = msg_name(m);
  fields["gid"] = gid_hex(b->rgid);
  fields["qpn"] = b->rqpn;
  return fields;
}

// Asks the peer's shim until total_ms, on all of its addresses (its other
// rails: the one behind its GID may be the one that failed), trying again
// on new connections (new source ports, so where a spine is dead another
// chance of an ECMP path around it). Every try carries the same request id:
// a peer that executed the request but whose answer was lost answers the
// same again.
std::optional<json> ask_peer(Bundle* b, json req, int total_ms, std::string* err) {
  std::vector<std::string> ips(1);
  if (!gid_v4(b->rgid, &ips[0])) return std::nullopt;
  {
    std::lock_guard g(b->mu);
    for (const auto& a : b->peer_addrs)
      if (a != ips[0]) ips.push_back(a);
  }
  uint64_t rid = 0;
  if (getrandom(&rid, sizeof rid, 0) != sizeof rid) rid = static_cast<uint64_t>(mono_ns());
  req["rid"] = rid & 0xffffffffffffull;
  const peer::Key key = peer::job_key_from(config().str(Param::job_key));
  int64_t deadline = mono_ms() + total_ms;
  while (mono_ms() < deadline) {
    int port;
    {
      std::lock_guard g(b->mu);
      port = b->peer_port;
    }
    size_t k = 0;
    if (!port) {  // the peer's process listener, through its host agent
      auto r = peer::race(ips, static_cast<int>(config().num(Param::peer_port)), key, locate_request(b), 1000,
                          &k, err);
      if (r && r->value("port", 0) > 0) {
        port = r->value("port", 0);
        std::lock_guard g(b->mu);
        b->peer_port = port;
      }
    }
    if (port) {
      auto r = peer::race(ips, port, key, req, 1000, &k, err);
      if (r) return r;
    }
    usleep(20 * 1000);
  }
  return std::nullopt;
}

std::optional<json> ask(const std::string& ip, int port, const json& req, std::string* err) {
  return peer::call(ip, port, peer::job_key_from(config().str(Param::job_key)), req, 3000, err);
}

}  // namespace shunt::verbs::bundle
