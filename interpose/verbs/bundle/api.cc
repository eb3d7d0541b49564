// The bundle seen from outside: its stats JSON, the peer requests it answers, and the directory of owners.
#include "interpose/verbs/bundle/parts.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cerrno>
#include <fstream>

#include "core/mono.h"
#include "core/runtime.h"
#include "interpose/verbs/path_discovery.h"
#include "peer/control.h"

namespace shunt::verbs {

using namespace bundle;

json bundle_json(const QpRecord& r) {
  Bundle* b = r.bundle.load();
  if (!b) return nullptr;
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  json paths = json::array();
  for (const auto& p : b->paths)
    paths.push_back({{"qpn", p.qpn},
                     {"device", p.rail < static_cast<int>(b->rails.size()) ? b->rails[p.rail].device
                                                                          : std::string(b->ctx->device)},
                     {"ns_per_byte", p.ns_per_byte},
                     {"remote_qpn", p.remote_qpn},
                     {"udp_sport", path_sport(p)},
                     {"router", p.router},
                     {"home", p.home},
                     {"wrs", p.wrs},
                     {"bytes", p.bytes},
                     {"in_flight", p.posted - p.done},
                     {"fails", p.fails},
                     {"down", p.down()},
                     {"share", p.share},
                     {"seg_lat_ns", p.seg_lat},
                     {"queue", p.queue_known ? json{{"excess_ns", p.excess_ns},
                                                    {"threshold_ns", p.threshold_ns},
                                                    {"congested", p.congested}}
                                             : json(nullptr)}});
  return {{"state", phase_text(b->phase, b->why, b->dead)},
          {"device", static_cast<const char*>(b->ctx->device)},
          {"primary", {{"wrs", b->prim.wrs},
                       {"bytes", b->prim.bytes},
                       {"in_flight", b->prim.posted - b->prim.done},
                       {"fails", b->prim.fails},
                       {"router", b->prim.router},
                       {"udp_sport", path_sport(b->prim) ? json(path_sport(b->prim)) : json(nullptr)}}},
          {"active", b->active.load()},
          {"paths", paths},
          {"fences", b->fences},
          {"splits", b->splits},
          {"homecomings", b->homecomings},
          {"segments", b->segments},
          {"steer", b->carrier_steer ? "queue-carrier" : !b->split ? "-" : !b->steer ? "off" : !b->steer_queue ? "latency" : b->steer_owd ? "queue" : "queue-unknown"},
          {"spread", b->spread_auto ? "auto" : b->split ? "split" : b->flowlet ? "flowlet" : "pin"},
          {"auto", !b->spread_auto ? json(nullptr)
                                   : json{{"now", b->auto_best < 0 ? "trying" : b->auto_best ? "split" : "pin"},
                                          {"split_ns_per_kib", 1024 * b->auto_npb[1]},
                                          {"pin_ns_per_kib", 1024 * b->auto_npb[0]},
                                          {"split_periods", b->auto_periods[1]},
                                          {"pin_periods", b->auto_periods[0]}}},
          {"steer_steps", b->steer_steps},
          {"carrier_steers", b->carrier_steers},
          {"carrier_steering",
           !b->carrier_steer ? json(nullptr) : [&] {
             json pv = json::object();
             for (const auto& [i, v] : b->peer_view)
               pv[std::to_string(i)] = json::array({v.verdict, std::round(v.excess_ns / 1e6), v.same ? 1 : 0});
             return json{{"application_qp_router", b->prim.router},
                         {"carrier_queue", json::array({b->carrier_dir.verdict, b->carrier_dir.excess_ns / 1e6,
                                                        b->carrier_dir.threshold_ns / 1e6})},
                         {"peer_view", pv},
                         {"peer_view_age_ms", b->peer_view_ms ? mono_ms() - b->peer_view_ms : -1},
                         {"hold_window_ms", b->chold.window_ms()},
                         {"holding", b->chold.holding()}};
           }()},
          {"steer_reversals", b->steer_reversals},
          {"all_stalled", b->all_stalled_count},
          {"witness_probes", b->witness_probes},
          {"held", b->held_total},
          {"held_now", b->held.size()},
          {"splits_open", b->groups.size()},
          {"to_primary", b->to_primary},
          {"carrier", b->carrier},
          {"primary_down", b->prim.down()},
          {"messages_sent", b->cseq},
          {"messages_received", b->consumed},
          {"failovers", b->failovers},
          {"moves", b->moves},
          {"replayed", b->replayed},
          {"replayed_bytes", b->replayed_bytes},
          {"completions_owed", b->synthesized},
          {"errors_hidden", b->swallowed}};
}

}  // namespace shunt::verbs

namespace shunt::verbs::bundle {

namespace {

json answer(const json& req, const std::string& cmd);

// The answers to the last requests with an id (see ask_peer).
std::mutex g_rid_mu;
std::deque<std::pair<uint64_t, json>>* g_rids = nullptr;

// Whether every float in j converts to the int or unsigned that the
// answers read fields as (beyond their range the conversion is undefined).
bool floats_fit(const json& j, int depth = 0) {
  if (j.is_number_float()) return j.get<double>() > -1 && j.get<double>() < 2147483648.0;
  if (!j.is_structured()) return true;
  if (depth > 32) return false;
  for (const auto& x : j)
    if (!floats_fit(x, depth + 1)) return false;
  return true;
}

}  // namespace

}  // namespace shunt::verbs::bundle

namespace shunt::verbs {

using namespace bundle;

// Any holder of the job key reaches this: nothing it sends may throw out.
json bundle_answer(const json& req) try {
  ReentryGuard g;
  if (!req.is_object()) return {{"error", "a request is a JSON object"}};
  if (!floats_fit(req)) return {{"error", "a number out of range (or nested too deep)"}};
  const std::string cmd = req.contains("cmd") && req["cmd"].is_string() ? req["cmd"].get<std::string>() : "";
  uint64_t rid = req.contains("rid") && req["rid"].is_number_unsigned() ? req["rid"].get<uint64_t>() : 0;
  if (rid) {
    std::lock_guard l(g_rid_mu);
    if (!g_rids) g_rids = new std::deque<std::pair<uint64_t, json>>;
    for (const auto& [id, reply] : *g_rids)
      if (id == rid) return reply;
  }
  json reply = answer(req, cmd);
  if (rid) {
    std::lock_guard l(g_rid_mu);
    g_rids->emplace_back(rid, reply);
    if (g_rids->size() > 64) g_rids->pop_front();
  }
  return reply;
} catch (const std::exception& e) {
  return {{"error", std::string("cannot answer: ") + e.what()}};
}

}  // namespace shunt::verbs

namespace shunt::verbs::bundle {

namespace {

json answer_give_up(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  start_give_up(b, "the peer's shim gave up: " + req.value("why", std::string("?")));
  return {{"ok", true}};
}

json answer_rkeys(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  std::vector<uint32_t> want;
  for (const auto& x : req.value("want", json::array()))
    if (x.is_number_unsigned() && want.size() < 256) want.push_back(x.get<uint32_t>());
  std::lock_guard g(b->mu);
  return {{"rails", rkeys_json(b, &want)}};
}

json answer_renew_now(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  b->renew_now.store(true);
  wake_worker(b);
  return {{"ok", true}};
}

// Who answers each of the peer's messages (parts.h, Msg), in their order.
struct Answer {
  Msg msg;
  json (*fn)(const json& req);
};
constexpr Answer kAnswers[] = {
    {Msg::join, answer_join},
    {Msg::activate, answer_activate},
    {Msg::abort, answer_abort},
    {Msg::give_up, answer_give_up},
    {Msg::carrier_down, answer_carrier_down},
    {Msg::carrier_prepare, answer_carrier_prepare},
    {Msg::carrier_commit, answer_carrier_commit},
    {Msg::path_renew, answer_path_renew},
    {Msg::path_down, answer_path_down},
    {Msg::steer_view, answer_steer_view},
    {Msg::rkeys, answer_rkeys},
    {Msg::renew_now, answer_renew_now},
};
constexpr bool every_message_answered() {
  if (sizeof(kAnswers) / sizeof(kAnswers[0]) != kMsgs) return false;
  for (int i = 0; i < kMsgs; i++)
    if (kAnswers[i].msg != static_cast<Msg>(i)) return false;
  return true;
}
static_assert(every_message_answered(), "kAnswers names each Msg once, in order");

json answer(const json& req, const std::string& cmd) {
  Msg m;
  if (!msg_of(cmd, &m)) return {{"error", "unknown command " + cmd}};
  try {
    return kAnswers[static_cast<int>(m)].fn(req);
  } catch (const json::exception& e) {
    return {{"error", std::string("malformed request: ") + e.what()}};
  }
}

}  // namespace

}  // namespace shunt::verbs::bundle

namespace shunt::verbs {

using namespace bundle;

// (bundle.h) shared_hops, asking the agent at `sock`. Here, outside the
// anonymous namespace that shared_hops lives in: tests call it.
int shared_hops_via(const std::string& sock, const std::string& local, const std::string& peer, int candidates,
                    int wait_ms, bool once, std::vector<uint16_t>* ports, std::vector<std::string>* hops) {
  if (sock.empty()) return 0;
  const int64_t deadline = mono_ms() + discovery_cap_ms(wait_ms) + 1000;
  std::string err;
  for (;;) {
    auto r = peer::request(sock,
                           {{"cmd", "route-hops"}, {"local", local}, {"peer", peer}, {"candidates", candidates},
                            {"wait_ms", wait_ms}},
                           once ? 300 : 1000, &err);
    // An agent that took the question but not yet answered is slow, not
    // gone (a guest's agent thread still starting its services took over
    // 300 ms): once, that is "ask again", which the caller bounds.
    if (!r && once && err.rfind("no answer", 0) == 0) return -1;
    if (!r || r->contains("error")) {
      event_discovery_unanswered(r ? r->value("error", std::string("?")) : err);
      return 0;
    }
    if (r->contains("ports") && r->contains("hops")) {
      *ports = (*r)["ports"].get<std::vector<uint16_t>>();
      *hops = (*r)["hops"].get<std::vector<std::string>>();
      return ports->size() == hops->size() ? 1 : 0;
    }
    if (once) return -1;
    if (mono_ms() >= deadline) return 0;
    usleep(10 * 1000);  // pending: another bundle's datagrams (or ours) are out
  }
}

bool bundle_cm_route_dead(QpRecord* r) {
  Bundle* b = r ? r->bundle.load() : nullptr;
  if (!b) return false;
  std::lock_guard g(b->mu);
  if (b->dead || !b->active.load()) return false;
  std::lock_guard l(b->lk);
  if (!b->prim.down()) return false;
  for (const auto& p : b->paths)
    if (p.rail == 0 && usable(p)) return false;  // a route on the application's NIC works
  return true;
}

std::string bundle_dir() {
  std::string d = peer::run_dir(config().str(Param::run_dir));
  return d.empty() ? d : d + "/bundles";
}

int bundle_locate(const std::string& gid_hex_s, uint32_t qpn) {
  for (char ch : gid_hex_s)
    if (!isxdigit(static_cast<unsigned char>(ch))) return 0;
  if (gid_hex_s.size() != 32) return 0;
  std::ifstream f(bundle_dir() + "/" + gid_hex_s + "-" + std::to_string(qpn));
  long pid = 0;
  int port = 0;
  if (!(f >> pid >> port) || pid <= 0) return 0;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno != EPERM) return 0;
  return port;
}

}  // namespace shunt::verbs
