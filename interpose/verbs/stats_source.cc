// The verbs section of the process's snapshots (telemetry/stats_file.h):
// its calls, devices and QPs, its bundles, the paths of closed ones and
// their replays.
#include "interpose/verbs/stats_source.h"

#include <array>
#include <map>
#include <string>
#include <tuple>

#include "interpose/verbs/bundle.h"
#include "interpose/verbs/busy.h"
#include "interpose/verbs/registry.h"
#include "telemetry/rhythm.h"
#include "telemetry/stats_file.h"

namespace shunt::verbs {

namespace {
using nlohmann::json;

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

void write_stats(json& snap, telemetry::Detail detail) {
  json calls = json::object();
  json devices = json::array();
  json qps = json::array(), bundles = json::array();
  // Destroyed QPs' bundles, their paths summed per device, NIC and path: the
  // metrics' counters keep what they sent and how often they failed.
  std::map<std::tuple<std::string, std::string, std::string>, std::array<uint64_t, 3>> closed;
  uint64_t replays = 0;
  if (detail == telemetry::Detail::full) {
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
      q["last_steps"] = r.last_steps.load(std::memory_order_relaxed);
      json transfers = json::array();
      for (const auto& n : r.transfers) transfers.push_back(n.load(std::memory_order_relaxed));
      q["transfers"] = std::move(transfers);  // per telemetry::kTransferBucketsMs bound, then over all
      q["transfer_ms"] = r.transfer_ms.load(std::memory_order_relaxed);
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
  snap["verbs"] = {{"calls", std::move(calls)},
                  {"devices", std::move(devices)},
                  {"qps", std::move(qps)},
                  {"stale_completions_dropped", verbs::g_stale_wcs.load()},
                  {"step_ends", verbs::step_ends()}};
  snap["bundles"] = std::move(bundles);
  snap["closed_bundle_paths"] = std::move(closed_paths);
  snap["replays"] = replays;
  snap["step"] = telemetry::process_rhythm().view();  // null without a rhythm
}

}  // namespace

void register_stats() { telemetry::register_stats_source(write_stats); }

}  // namespace shunt::verbs
