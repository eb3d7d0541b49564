// The socket section of the process's snapshots (telemetry/stats_file.h):
// its TCP sockets (with what each MPTCP connection's subflows carried),
// the older closed ones summed, and its forks.
#include "interpose/socket/stats_source.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <map>
#include <mutex>
#include <set>
#include <string>

#include "core/runtime.h"
#include "interpose/socket/fd_table.h"
#include "interpose/socket/mptcp_info.h"
#include "telemetry/stats_file.h"

namespace shunt::sock {

namespace {
using nlohmann::json;

// any_port: a port 0 is written "*" (folded sockets' ephemeral end).
std::string addr_str(const sockaddr_storage& a, socklen_t len, bool any_port = false) {
  if (len == 0) return "";
  auto port = [&](uint16_t p) { return any_port && p == 0 ? std::string("*") : std::to_string(ntohs(p)); };
  char buf[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + port(s->sin_port);
  }
  if (a.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + port(s->sin6_port);
  }
  return "";
}

const char* role_name(sock::Role r) {
  switch (r) {
    case sock::Role::client: return "client";
    case sock::Role::listener: return "listener";
    case sock::Role::accepted: return "accepted";
    default: return "unknown";
  }
}

std::string host_part(const std::string& addr) {  // "1.2.3.4:80" or "[::1]:80" -> the address
  std::string h = addr.substr(0, addr.rfind(':'));
  return h.size() >= 2 && h.front() == '[' ? h.substr(1, h.size() - 2) : h;
}

// What each MPTCP connection's subflows carried, kept across reports: the
// kernel lists live subflows only, so a subflow closed with its rail would
// take its bytes along, and the connection's main addresses (its first
// subflow's) say nothing of the rail that carries it now.
struct SubflowBytes {
  std::string local, remote;  // addresses, no ports
  uint64_t tx = 0, rx = 0;
};
// socket (fd, local, peer) -> subflow ("local->remote", ports included) -> bytes;
// under g_subflows_mu. Built on first use and never freed: the agent's
// report can come before this library's static initializers ran (a socket
// opened in another library's constructor starts the agent) and after its
// static destructors.
using SubflowMap = std::map<std::string, std::map<std::string, SubflowBytes>>;
std::mutex g_subflows_mu;
SubflowMap& subflows() {
  static auto* m = new SubflowMap;
  return *m;
}
struct SubflowsForkSafety {  // a fork while a report holds the lock
  SubflowsForkSafety() {
    on_fork([] { g_subflows_mu.lock(); }, [] { g_subflows_mu.unlock(); }, [] { g_subflows_mu.unlock(); });
  }
} g_subflows_fork_safety;

// The connection's bytes per pair of addresses its subflows used (tx acked,
// rx received), or null for a socket whose subflows were never seen.
json subflow_paths(const std::string& key, const json& mptcp) {
  std::lock_guard<std::mutex> lk(g_subflows_mu);
  auto& seen = subflows()[key];
  if (mptcp.is_object() && mptcp.contains("subflow"))
    for (const auto& f : mptcp["subflow"]) {
      if (!f.contains("local") || !f.contains("remote")) continue;
      std::string l = f["local"].get<std::string>(), r = f["remote"].get<std::string>();
      SubflowBytes& b = seen[l + "->" + r];
      b.local = host_part(l);
      b.remote = host_part(r);
      b.tx = std::max(b.tx, f.value("bytes_acked", uint64_t{0}));
      b.rx = std::max(b.rx, f.value("bytes_received", uint64_t{0}));
    }
  if (seen.empty()) {
    subflows().erase(key);
    return nullptr;
  }
  std::map<std::pair<std::string, std::string>, std::pair<uint64_t, uint64_t>> sum;
  for (const auto& [k, b] : seen) {
    auto& t = sum[{b.local, b.remote}];
    t.first += b.tx;
    t.second += b.rx;
  }
  json out = json::array();
  for (const auto& [ends, t] : sum)
    out.push_back({{"local", ends.first}, {"remote", ends.second}, {"tx_bytes", t.first}, {"rx_bytes", t.second}});
  return out;
}

// Drops what is kept for sockets no longer listed.
void forget_subflows(const std::set<std::string>& listed) {
  std::lock_guard<std::mutex> lk(g_subflows_mu);
  std::erase_if(subflows(), [&](const auto& e) { return !listed.count(e.first); });
}

void write_stats(json& snap, telemetry::Detail) {
  json socks = json::array(), folded = json::array();
  sock::Snapshot ss = sock::snapshot();
  std::set<std::string> listed;
  for (const sock::SocketInfo& r : ss.sockets) {
    json mptcp = r.mptcp && r.open ? sock::mptcp_json(r.fd) : json(nullptr);
    const std::string local = addr_str(r.local, r.local_len), peer = addr_str(r.peer, r.peer_len);
    json paths = nullptr;
    if (r.mptcp) {
      const std::string key = std::to_string(r.fd) + " " + local + " " + peer;
      listed.insert(key);
      paths = subflow_paths(key, mptcp);
    }
    socks.push_back({{"fd", r.fd},
                     {"family", r.family == AF_INET6 ? "inet6" : "inet"},
                     {"role", role_name(r.role)},
                     {"local", local},
                     {"peer", peer},
                     {"paths", std::move(paths)},
                     {"tx_bytes", r.tx_bytes},
                     {"rx_bytes", r.rx_bytes},
                     {"accepts", r.accepts},
                     {"open", r.open},
                     {"upgraded", r.mptcp},
                     {"mptcp", std::move(mptcp)}});
  }
  forget_subflows(listed);
  // Older closed sockets, summed per role and service end ("*": any port).
  for (const sock::FoldedInfo& f : ss.folded)
    folded.push_back({{"role", role_name(f.role)},
                      {"local", addr_str(f.local, f.local_len, true)},
                      {"peer", addr_str(f.peer, f.peer_len, true)},
                      {"sockets", f.sockets},
                      {"upgraded", f.upgraded},
                      {"tx_bytes", f.tx_bytes},
                      {"rx_bytes", f.rx_bytes},
                      {"accepts", f.accepts}});
  snap["sockets"] = std::move(socks);
  snap["closed_sockets"] = std::move(folded);
  snap["sockets_untracked"] = ss.cap_refused;
  snap["forks"] = sock::fork_count();
}

}  // namespace

void register_stats() { telemetry::register_stats_source(write_stats); }

}  // namespace shunt::sock
