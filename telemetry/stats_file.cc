#include "telemetry/stats_file.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "core/event_log.h"
#include "core/identity.h"
#include "core/json_text.h"
#include "core/log.h"
#include "core/runtime.h"
#include "interpose/socket/fd_table.h"
#include "interpose/socket/mptcp_info.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/registry.h"

namespace shunt::telemetry {

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

const char* qp_type_name(ibv_qp_type t) {
  switch (t) {
    case IBV_QPT_RC: return "RC";
    case IBV_QPT_UC: return "UC";
    case IBV_QPT_UD: return "UD";
    case IBV_QPT_RAW_PACKET: return "RAW_PACKET";
    case IBV_QPT_XRC_SEND: return "XRC_SEND";
    case IBV_QPT_XRC_RECV: return "XRC_RECV";
    case IBV_QPT_DRIVER: return "DRIVER";
    default: return "OTHER";
  }
}

// A bundle's paths for the metrics: the application's QP first ("primary"),
// then each shadow; up, whether it carries the two-sided work (the
// bundle's "carrier": -1 the application's QP, else a shadow's index), the
// bytes posted on it and how often it failed; for a shadow also its share
// of split WRITEs and, when the probes know it, its forward queue.
json bundle_paths(const json& bj) {
  json out = json::array();
  const int carrier = bj.value("carrier", -1);
  const json& pr = bj["primary"];
  out.push_back({{"path", "primary"},
                 {"nic", bj.value("device", "")},
                 {"udp_sport", pr.contains("udp_sport") && pr["udp_sport"].is_number() ? pr["udp_sport"].get<uint64_t>() : 0},
                 {"up", !bj.value("primary_down", false)},
                 {"carrier", carrier == -1},
                 {"tx_bytes", pr.value("bytes", uint64_t{0})},
                 {"fails", pr.value("fails", uint64_t{0})}});
  int i = 0;
  for (const auto& p : bj["paths"]) {
    out.push_back({{"path", std::to_string(i)},
                   {"nic", p.value("device", bj.value("device", ""))},
                   {"udp_sport", p.value("udp_sport", 0)},
                   {"up", !p.value("down", false)},
                   {"carrier", carrier == i},
                   {"tx_bytes", p.value("bytes", uint64_t{0})},
                   {"fails", p.value("fails", uint64_t{0})},
                   {"share", p.value("share", 1.0)},
                   {"queue", p.contains("queue") ? p["queue"] : json(nullptr)}});
    i++;
  }
  return out;
}

json qp_stats(const verbs::QpStats& s) {
  using verbs::HotCounters;
  using verbs::total;
  json wrs = json::object(), errs = json::object();
  for (int op = 0; op < verbs::kWrOpcodes; op++)
    if (uint64_t n = total(s, [op](const HotCounters& h) -> auto& { return h.send_wrs[op]; }))
      wrs[verbs::wr_opcode_name(op)] = n;
  for (int st = 1; st < verbs::kWcStatuses; st++)
    if (uint64_t n = verbs::get(s.wc_status[st]))
      errs[ibv_wc_status_str(static_cast<ibv_wc_status>(st))] = n;
  return {{"send_wrs", wrs},
          {"send_bytes", total(s, [](const HotCounters& h) -> auto& { return h.send_bytes; })},
          {"send_post_errors", verbs::get(s.send_post_errors)},
          {"recv_wrs", total(s, [](const HotCounters& h) -> auto& { return h.recv_wrs; })},
          {"recv_post_errors", verbs::get(s.recv_post_errors)},
          {"completions", total(s, [](const HotCounters& h) -> auto& { return h.completions; })},
          {"recv_completions", total(s, [](const HotCounters& h) -> auto& { return h.recv_completions; })},
          {"recv_bytes", total(s, [](const HotCounters& h) -> auto& { return h.recv_bytes; })},
          {"signaled_sends", total(s, [](const HotCounters& h) -> auto& { return h.sig_sends; })},
          {"send_completions", total(s, [](const HotCounters& h) -> auto& { return h.send_done; })},
          {"errors", errs}};
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

void write_at_exit() {
  const Config& c = config();
  write_stats_file(c.str(Param::stats_file));
}
}  // namespace

json stats_json(Detail detail) {
  char host[256] = "unknown";
  gethostname(host, sizeof host - 1);
  json calls = json::object();
  json devices = json::array();
  json qps = json::array(), bundles = json::array();
  // Destroyed QPs' bundles, their paths summed per device, NIC and path: the
  // metrics' counters keep what they sent and how often they failed.
  std::map<std::tuple<std::string, std::string, std::string>, std::array<uint64_t, 3>> closed;
  uint64_t replays = 0;
  if (detail == Detail::full) {
    for (int i = 0; i < static_cast<int>(verbs::Call::count_); i++)
      if (uint64_t n = verbs::call_count(static_cast<verbs::Call>(i)))
        calls[verbs::call_name(static_cast<verbs::Call>(i))] = n;
    verbs::for_each_context([&](const verbs::ContextRecord& c) {
      devices.push_back({{"device", c.device},
                         {"open", c.ctx.load() != nullptr},
                         {"srq_recv_wrs", verbs::get(c.srq_recv_wrs)},
                         {"notify_calls", verbs::get(c.notify_calls)},
                         {"async_events", verbs::get(c.async_events)},
                         {"untracked_qps", qp_stats(c.untracked)}});
    });
    verbs::for_each_qp([&](const verbs::QpRecord& r) {
      json q = qp_stats(r.s);
      q["device"] = r.device;
      q["qpn"] = r.qpn;
      q["type"] = qp_type_name(r.type);
      q["extended"] = r.extended;
      q["destroyed"] = r.destroyed.load();
      if (r.shadow_of) q["shadow_of"] = r.primary_qpn;
      if (r.peer_addr[0]) {
        q["local"] = r.local_addr;
        q["peer"] = r.peer_addr;
      }
      q["busy_ms"] = r.busy_ms.load(std::memory_order_relaxed);
      if (auto bj = verbs::bundle_json(r); !bj.is_null()) {
        // up: every path in service; degraded: some failed (or the
        // application's QP was moved off); fallback: primary-only or given up
        bool degraded = bj.value("primary_down", false);
        for (const auto& pj : bj["paths"]) degraded |= pj.value("down", false);
        if (!r.destroyed.load()) {
          bundles.push_back({{"qpn", r.qpn},
                             {"device", r.device},
                             {"state", !bj.value("active", false) ? "fallback" : degraded ? "degraded" : "up"},
                             {"paths", bundle_paths(bj)}});
        } else {
          for (const auto& pj : bundle_paths(bj)) {
            auto& c = closed[{r.device, pj.value("nic", ""), pj.value("path", "")}];
            c[0]++;
            c[1] += pj.value("tx_bytes", uint64_t{0});
            c[2] += pj.value("fails", uint64_t{0});
          }
        }
        replays += bj.value("replayed", uint64_t{0});
        q["bundle"] = std::move(bj);
      }
      qps.push_back(std::move(q));
    });
  }
  json closed_paths = json::array();
  for (const auto& [k, c] : closed)
    closed_paths.push_back({{"device", std::get<0>(k)},
                            {"nic", std::get<1>(k)},
                            {"path", std::get<2>(k)},
                            {"bundles", c[0]},
                            {"tx_bytes", c[1]},
                            {"fails", c[2]}});
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
  const char* modes[] = {"off", "observe", "active"};
  return {{"version", SHUNT_VERSION},
          {"host", valid_utf8(host)},
          {"pid", getpid()},
          {"mode", modes[static_cast<int>(current_mode())]},
          {"forks", sock::fork_count()},
          {"verbs",
           {{"calls", calls},
            {"devices", devices},
            {"qps", qps},
            {"stale_completions_dropped", verbs::g_stale_wcs.load()}}},
          {"sockets", socks},
          {"closed_sockets", folded},
          {"sockets_untracked", ss.cap_refused},
          {"bundles", bundles},
          {"closed_bundle_paths", closed_paths},
          {"replays", replays},
          {"job", job_id()},
          {"rank", rank()},
          {"events", event_counts()},
          {"events_dropped", events_dropped()},
          {"event_log", valid_utf8(event_log_path())}};
}

bool write_stats_file(const std::string& pattern) {
  if (pattern.empty()) return false;
  std::string path = expand_pattern(pattern, getpid());
  if (is_forked_child() && pattern.find("%p") == std::string::npos) path += "." + std::to_string(getpid());
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  {
    std::ofstream out(tmp);
    if (!out) {
      log::error("SHUNT_STATS_FILE: cannot write {}", tmp);
      return false;
    }
    out << to_text(stats_json(), 2) << "\n";
    if (!out.good()) return false;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    log::error("SHUNT_STATS_FILE: cannot rename {} to {}", tmp, path);
    unlink(tmp.c_str());
    return false;
  }
  return true;
}

void install_stats_file() {
  if (!config().str(Param::stats_file).empty() && current_mode() != Mode::off) at_exit(write_at_exit);
}

}  // namespace shunt::telemetry
