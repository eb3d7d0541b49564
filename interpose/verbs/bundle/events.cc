// The bundle's events and log lines, all of them: its set-up, paths down, up and renewed, carrier moves, every path
// stalled, the data path's reports, steering, port events. No other part of the bundle logs.
#include "interpose/verbs/bundle/parts.h"

#include <algorithm>
#include <cstring>

#include "core/event_log.h"
#include "core/log.h"

namespace shunt::verbs::bundle {

namespace {

void down_event(Bundle* b, int pi, int st) {
  int sport;
  std::string router;
  {
    std::lock_guard l(b->lk);
    sport = static_cast<int>(path_sport(P(b, pi)));
    router = P(b, pi).router;
  }
  const std::string flap =
      fmt::format("flapping: its work was held up {} times within {} stall times", kFlapHiccups, kFlapWindows);
  const char* why = st >= 0            ? ibv_wc_status_str(static_cast<ibv_wc_status>(st))
                    : st == kStalled   ? "stalled: nothing completed while the device retransmitted"
                    : st == kPortDown ? "its port went down: async event"
                    : st == kProbesLost ? "its own probes are lost: silent loss on its route"
                    : st == kFlapping   ? flap.c_str()
                    : st == kUnanswered ? "unanswered: its probe after a failure went unanswered while others answered"
                                       : "the peer saw it fail";
  log::warn("{} QP {}: path {} failed ({})", b->ctx->device, b->pqp->qp_num,
            pi == kPrimary ? std::string("primary") : std::to_string(pi), why);
  telemetry::event("path_down", {{"device", static_cast<const char*>(b->ctx->device)},
                                 {"qpn", b->pqp->qp_num},
                                 {"path", pi},
                                 {"udp_sport", sport},
                                 {"router", router},
                                 {"status", st >= 0            ? why
                                            : st == kStalled   ? "stalled"
                                            : st == kPortDown ? "port_down"
                                            : st == kProbesLost ? "probes_lost"
                                            : st == kFlapping   ? "flapping"
                                            : st == kUnanswered ? "unanswered"
                                                               : "peer"}});
}

void up_event(Bundle* b, int i) {
  uint32_t port;
  std::string router;
  {
    std::lock_guard l(b->lk);
    port = path_sport(b->paths[i]);
    router = b->paths[i].router;
  }
  log::info("{} QP {}: path {} back in service on UDP source port {}", b->ctx->device, b->pqp->qp_num, i, port);
  telemetry::event("path_up", {{"device", static_cast<const char*>(b->ctx->device)},
                               {"qpn", b->pqp->qp_num},
                               {"path", i},
                               {"udp_sport", port},
                               {"router", router}});
}

}  // namespace

size_t report_mail(Bundle* b) {
  std::lock_guard m(b->mail_mu);
  Report r[Mailbox::kSlots];
  size_t n;
  uint64_t dropped;
  {
    std::lock_guard l(b->lk);
    if (b->mail.empty()) return 0;
    n = b->mail.take(r, &dropped);
  }
  for (size_t i = 0; i < n; i++) switch (r[i].kind) {
      case Report::Kind::path_down: down_event(b, r[i].path, r[i].status); break;
      case Report::Kind::path_up: up_event(b, r[i].path); break;
      case Report::Kind::held_failed:
        log::error("{} QP {}: a held WR could not be posted ({}); the application gets an error completion",
                   b->ctx->device, b->pqp->qp_num, strerror(r[i].status));
        break;
      case Report::Kind::spread_mode:
        log::info("{} QP {}: SHUNT_SPREAD=auto: large WRITEs {} now ({:.0f} ns/KiB split, {:.0f} ns/KiB pinned)",
                  b->ctx->device, b->pqp->qp_num, r[i].status ? "split" : "stay on the carrier", r[i].split_ns_kib,
                  r[i].pinned_ns_kib);
        break;
    }
  if (dropped)
    log::warn("{} QP {}: {} reports of its paths' changes and its data path were dropped (they waited for the "
              "failover worker past the mailbox's {} slots); the paths' states are current",
              b->ctx->device, b->pqp->qp_num, dropped, Mailbox::kSlots);
  return n + dropped;
}

void event_down(Bundle* b, const After& a) {
  report_mail(b);
  for (auto [pi, st] : a.down) down_event(b, pi, st);
}

void event_all_stalled(Bundle* b, size_t n) {
  report_mail(b);
  log::warn("{} QP {}: every usable path ({}) stalled at once while the device retransmitted: congestion, or a "
            "route they all share; none is failed for it (the device keeps retrying their work)",
            b->ctx->device, b->pqp->qp_num, n);
  telemetry::event("all_stalled", {{"device", static_cast<const char*>(b->ctx->device)},
                                   {"qpn", b->pqp->qp_num},
                                   {"paths", n}});
}

void event_moved(Bundle* b, int from, int to, const json& info, bool planned) {
  report_mail(b);
  if (planned) {
    {
      std::lock_guard l(b->lk);
      b->carrier_steers++;
    }
    log::info("{} QP {}: steering moved its work from {} (its queue is congested) to path {}: {} WRs posted again",
              b->ctx->device, b->pqp->qp_num,
              from == kPrimary ? std::string("the application's QP") : "path " + std::to_string(from), to,
              info.value("replayed", 0));
    // Why (the deciding side's event only): the carrier's queue in our
    // direction and the peer's verdict on its own (-1 not known, 0 clear,
    // 1 congested), the target's likewise, and the hold's window.
    const json why = info.contains("why") && info["why"].is_object() ? info["why"] : json::object();
    const json c = why.value("carrier", json::object()), t = why.value("to", json::object());
    telemetry::event("steer-carrier", {{"device", static_cast<const char*>(b->ctx->device)},
                                       {"qpn", b->pqp->qp_num},
                                       {"from", from},
                                       {"to", to},
                                       {"replayed", info.value("replayed", 0)},
                                       {"deciding", !why.empty()},
                                       {"from_queue_us", c.value("queue_us", 0.0)},
                                       {"from_own", c.value("own", -1)},
                                       {"from_peer", c.value("peer", -1)},
                                       {"to_queue_us", t.value("queue_us", 0.0)},
                                       {"to_recent_us", t.value("recent_us", -1.0)},
                                       {"to_peer", t.value("peer", -1)},
                                       {"hold_window_ms", why.value("hold_window_ms", 0)}});
    return;
  }
  log::warn("{} QP {}: two-sided work moved from {} to path {}: {} WRs replayed, {} completions owed", b->ctx->device,
            b->pqp->qp_num, from == kPrimary ? std::string("the application's QP") : "path " + std::to_string(from),
            to, info.value("replayed", 0), info.value("completed", 0));
  // The deciding side's: how long each part took (-1 on the answering side).
  const json took = info.value("took_ms", json::object());
  telemetry::event("failover", {{"device", static_cast<const char*>(b->ctx->device)},
                                {"qpn", b->pqp->qp_num},
                                {"from", from},
                                {"to", to},
                                {"replayed", info.value("replayed", 0)},
                                {"completed", info.value("completed", 0)},
                                {"wait_ms", took.value("wait", -1)},
                                {"stop_ms", took.value("stop", -1)},
                                {"probe_ms", took.value("probe", -1)},
                                {"prepare_ms", took.value("prepare", -1)},
                                {"commit_ms", took.value("commit", -1)}});
}

void event_renewed(Bundle* b, int i, bool probation) {
  if (!probation) return event_up(b, i);  // trusted without a probe
  report_mail(b);
  uint32_t port;
  {
    std::lock_guard l(b->lk);
    port = path_sport(b->paths[i]);
  }
  log::info("{} QP {}: path {} renewed on UDP source port {}, on probation", b->ctx->device, b->pqp->qp_num, i, port);
}

// Not under b->lk.
void event_up(Bundle* b, int i) {
  report_mail(b);
  up_event(b, i);
}

void event_gave_up(Bundle* b, const std::string& why) {
  report_mail(b);  // the failures seen before, first
  log::error("{} QP {}: no path can carry this QP's work any more ({}); the application gets its errors",
             b->ctx->device, b->pqp->qp_num, why);
  telemetry::event("failover_failed",
                   {{"device", static_cast<const char*>(b->ctx->device)}, {"qpn", b->pqp->qp_num}, {"reason", why}});
}

// ---- the set-up's

void event_discovery_unanswered(const std::string& why) {
  log::once(LogLevel::info, "route-hops",
            "path discovery: the host agent does not answer (" + why + "); each bundle sends its own datagrams");
}

void event_no_job_key() {
  log::once(LogLevel::info, "bundle-nokey", "verbs bundles need SHUNT_JOB_KEY (the peer channel): QPs stay primary-only");
}

void event_probes_refused(size_t k, const std::string& why) {
  log::once(LogLevel::info, "bundle-probes-" + std::to_string(k),
            "verbs bundles: shadow paths" + (k ? " on other NICs" : std::string()) + " are not probed: " + why);
}

void event_fallback(Bundle* b, const std::string& why) {
  log::warn("{} QP {}: bundle stays primary-only: {}", b->ctx->device, b->pqp->qp_num, why);
  telemetry::event("bundle_fallback",
                   {{"device", static_cast<const char*>(b->ctx->device)}, {"qpn", b->pqp->qp_num}, {"reason", why}});
}

void event_active(Bundle* b) {
  // "N shadow paths (UDP source ports ...)" counts those on the QP's own
  // NIC; those on other NICs follow, per NIC.
  std::string ports, others;
  size_t own = 0, other = 0;
  for (size_t k = 0; k < std::max<size_t>(b->rails.size(), 1); k++) {
    std::string list;
    for (const auto& p : b->paths)
      if (p.rail == static_cast<int>(k)) list += (list.empty() ? "" : ",") + std::to_string(path_sport(p));
    if (k == 0) {
      ports = list;
    } else if (!list.empty()) {
      others += (others.empty() ? "" : "; ") + b->rails[k].device + ": " + list;
    }
  }
  for (const auto& p : b->paths) (p.rail ? other : own)++;
  log::info("{} QP {}: bundle active with {} shadow paths (UDP source ports {}){}", b->ctx->device, b->pqp->qp_num,
            own, ports, other ? " and " + std::to_string(other) + " on other NICs (" + others + ")" : std::string());
  telemetry::event("bundle_setup", {{"device", static_cast<const char*>(b->ctx->device)},
                                    {"qpn", b->pqp->qp_num},
                                    {"paths", b->paths.size()},
                                    {"udp_sports", ports}});
}

void event_shadows_short(Bundle* b, size_t made, int wanted, const std::string& why) {
  log::info("{} QP {}: {} of {} shadow QPs ({})", b->ctx->device, b->pqp->qp_num, made, wanted, why);
}

void event_rail_shadows(Bundle* b, const std::string& device, const std::string& why) {
  log::info("{} QP {}: shadows on {}: {}", b->ctx->device, b->pqp->qp_num, device, why.empty() ? "none" : why);
}

void event_rail_unrouted(Bundle* b, const std::string& device, const ibv_gid& gid) {
  log::info("{} QP {}: no rail path over {}: the route to the peer's {} leaves through another NIC", b->ctx->device,
            b->pqp->qp_num, device, gid_hex(gid));
}

void event_shadows_placed(Bundle* b, int rail, size_t n, const std::string& spread, bool for_peer) {
  log::info("{} QP {}: rail {}: {} shadows over {}{}", b->ctx->device, b->pqp->qp_num, rail, n, spread,
            for_peer ? " (the peer's bundle)" : "");
}

void event_shadows_hashed(Bundle* b, int rail) {
  log::info("{} QP {}: rail {}: no router answered for its ports; the hash places them", b->ctx->device,
            b->pqp->qp_num, rail);
}

void event_activation_answer_lost(Bundle* b) {
  log::info("{} QP {}: the peer's answer to the activation was lost; it is active, and so is this side",
            b->ctx->device, b->pqp->qp_num);
}

void event_stopped(Bundle* b, const std::string& why) {
  log::warn("{} QP {}: {}; the bundle stops", b->ctx->device, b->pqp->qp_num, why);
}

// ---- failover's, the carrier's and the worker's

void event_atomics_failed(Bundle* b, size_t n) {
  log::warn("{} QP {}: {} atomic WRs were in flight on the failed path; they complete with an error (an atomic "
            "may have executed, so it is never sent again)", b->ctx->device, b->pqp->qp_num, n);
}

void event_receive_unmoved(Bundle* b, int to, int rc) {
  log::error("{} QP {}: a receive could not move to path {} ({})", b->ctx->device, b->pqp->qp_num, to, strerror(rc));
}

void event_move_refused(Bundle* b, const std::string& answer) {
  log::warn("{} QP {}: the peer did not agree on a new path yet: {}", b->ctx->device, b->pqp->qp_num, answer);
}

void event_peer_unreachable(Bundle* b, const std::string& why) {
  log::warn("{} QP {}: the peer's shim cannot be reached ({}); holding the work, asking again", b->ctx->device,
            b->pqp->qp_num, why);
}

void event_rkeys_unanswered(Bundle* b, const std::string& why) {
  log::info("{} QP {}: the peer's rkeys on its other NICs: {}", b->ctx->device, b->pqp->qp_num, why);
}

void event_going_home(Bundle* b, const std::vector<int>& paths) {
  std::string list;
  for (int i : paths) list += (list.empty() ? "" : ", ") + std::to_string(i);
  log::info("{} QP {}: path(s) {} back to the router discovery placed them on", b->ctx->device, b->pqp->qp_num, list);
}

void event_home_short(Bundle* b, size_t back, size_t went, const std::string& why) {
  log::info("{} QP {}: {} of {} paths renewed on their home router ({}); the rest fail and renew as any path",
            b->ctx->device, b->pqp->qp_num, back, went, why);
}

void event_renewal_deferred(Bundle* b, int i, const std::string& why, int64_t next_ms) {
  log::info("{} QP {}: path {} not renewed yet ({}); next try in {} ms", b->ctx->device, b->pqp->qp_num, i, why,
            next_ms);
}

void event_shares_steered(Bundle* b, const std::string& from, const std::string& to, uint64_t steps,
                          const std::string& paths) {
  telemetry::event("steer", {{"device", static_cast<const char*>(b->ctx->device)},
                             {"qpn", b->pqp->qp_num},
                             {"from", from},
                             {"to", to},
                             {"steps", steps},
                             {"paths", paths}});
}

// ---- the watch thread's

void event_port_unwatched(const std::string& device, int err) {
  log::info("{}: port events are not watched (cannot open the device: {})", device, strerror(err));
}

void event_port(const std::string& device, ibv_event_type type, int port) {
  log::info("{}: {} on port {}", device, ibv_event_type_str(type), port);
}

void event_port_channel_closed(const std::string& device) {
  log::info("{}: its event channel closed; port events are no longer watched", device);
}

}  // namespace shunt::verbs::bundle
