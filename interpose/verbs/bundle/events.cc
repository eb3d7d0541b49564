// The bundle's events: paths down, up and renewed, carrier moves, every path stalled, and the data path's reports.
#include "interpose/verbs/bundle/parts.h"

#include <cstring>

#include "core/event_log.h"
#include "core/log.h"

namespace shunt::verbs::bundle {

namespace {

void down_event(Bundle* b, int pi, int st) {
  int sport;
  {
    std::lock_guard l(b->lk);
    sport = static_cast<int>(path_sport(P(b, pi)));
  }
  const char* why = st >= 0            ? ibv_wc_status_str(static_cast<ibv_wc_status>(st))
                    : st == kStalled   ? "stalled: nothing completed while the device retransmitted"
                    : st == kPortDown ? "its port went down: async event"
                    : st == kProbesLost ? "its own probes are lost: silent loss on its route"
                                       : "the peer saw it fail";
  log::warn("{} QP {}: path {} failed ({})", b->ctx->device, b->pqp->qp_num,
            pi == kPrimary ? std::string("primary") : std::to_string(pi), why);
  telemetry::event("path_down", {{"device", static_cast<const char*>(b->ctx->device)},
                                 {"qpn", b->pqp->qp_num},
                                 {"path", pi},
                                 {"udp_sport", sport},
                                 {"status", st >= 0            ? why
                                            : st == kStalled   ? "stalled"
                                            : st == kPortDown ? "port_down"
                                            : st == kProbesLost ? "probes_lost"
                                                               : "peer"}});
}

void up_event(Bundle* b, int i) {
  uint32_t port;
  {
    std::lock_guard l(b->lk);
    port = 0xC000 | b->paths[i].flow_label;
  }
  log::info("{} QP {}: path {} back in service on UDP source port {}", b->ctx->device, b->pqp->qp_num, i, port);
  telemetry::event("path_up", {{"device", static_cast<const char*>(b->ctx->device)},
                               {"qpn", b->pqp->qp_num},
                               {"path", i},
                               {"udp_sport", port}});
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
  telemetry::event("failover", {{"device", static_cast<const char*>(b->ctx->device)},
                                {"qpn", b->pqp->qp_num},
                                {"from", from},
                                {"to", to},
                                {"replayed", info.value("replayed", 0)},
                                {"completed", info.value("completed", 0)}});
}

void event_renewed(Bundle* b, int i, bool probation) {
  if (!probation) return event_up(b, i);  // trusted without a probe
  report_mail(b);
  uint32_t port;
  {
    std::lock_guard l(b->lk);
    port = 0xC000 | b->paths[i].flow_label;
  }
  log::info("{} QP {}: path {} renewed on UDP source port {}, on probation", b->ctx->device, b->pqp->qp_num, i, port);
}

// Not under b->lk.
void event_up(Bundle* b, int i) {
  report_mail(b);
  up_event(b, i);
}

}  // namespace shunt::verbs::bundle
