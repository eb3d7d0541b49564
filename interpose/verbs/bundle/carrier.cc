// Carrier moves: deciding one, its prepare/commit messages with the peer, and the return of paths to their home routers.
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>

#include <algorithm>

#include "core/mono.h"
#include "core/runtime.h"

namespace shunt::verbs::bundle {

namespace {

// Whether a move is to be tried; false: nothing to do now (the bundle gave
// up, a planned move no longer fits, or the receives cannot move: a
// failover's gives up). Takes b->lk.
bool move_wanted(Bundle* b, bool planned, int planned_to) {
  {
    std::lock_guard l(b->lk);
    if (b->move == Move::gave_up) return false;
    if (planned && (b->move != Move::idle || planned_to >= static_cast<int>(b->paths.size()) ||
                    planned_to == b->carrier || !usable(b->paths[planned_to])))
      return false;
  }
  if (!b->tracking.load()) {
    if (planned) return false;  // its receives cannot move: it stays
    give_up(b, "the QP uses a shared receive queue: its receives cannot move");
    return false;
  }
  return true;
}

// How a step of a move ended: go on, done (do_move says true), or to be
// tried again later (false).
enum class MoveStep { go, done, again };

// The candidates on rails where a path failed lately go last: a link that
// flaps answers a probe while it is up, and a fault on one rail often
// reaches more of its paths than have failed yet (a blackhole behind a
// spine, a leaf's uplink); the other rails' routes share none of it.
// Under b->lk.
void failed_rails_last(Bundle* b, std::vector<int>* cand) {
  const int64_t now = mono_ms(), window = kFlapWindows * config().num(Param::stall_ms);
  std::stable_partition(cand->begin(), cand->end(), [&](int i) {
    auto it = b->rail_fail_ms.find(b->paths[i].rail);
    return it == b->rail_fail_ms.end() || now - it->second > window;
  });
}

// How long each part of a move took (ms), for its event: each lap ends one.
struct MoveClock {
  json took = json::object();
  int64_t t = mono_ms();
  void lap(const char* part) {
    const int64_t now = mono_ms();
    took[part] = now - t;
    t = now;
  }
};

// The paths the carrier may move to (those answering a probe), into cand,
// and the carrier stopped, its index into *from; the clock's "stop" and
// "probe" laps. Takes b->lk.
MoveStep stop_carrier(Bundle* b, bool planned, int planned_to, std::vector<int>* cand_out, int* from_out,
                      MoveClock* clock) {
  std::vector<int>& cand = *cand_out;
  int& from = *from_out;
  if (planned) {
    cand.push_back(planned_to);
  } else {
    std::lock_guard l(b->lk);
    for (size_t i = 0; i < b->paths.size(); i++)
      if (usable(b->paths[i])) cand.push_back(static_cast<int>(i));
  }
  if (cand.empty()) return MoveStep::again;
  if (planned) {
    // Before the carrier stops: a path that does not answer is no place to go.
    if (answering(b, cand, 300).empty()) return MoveStep::done;
    clock->lap("probe");
    from = begin_move(b, true);
    clock->lap("stop");
  } else {
    from = begin_move(b);
    clock->lap("stop");
    // Only paths that answer a probe now: a path that carried nothing since
    // the fault looks usable but may sit behind it.
    cand = answering(b, cand, 300);
    clock->lap("probe");
    if (cand.empty()) return MoveStep::again;
  }
  std::lock_guard l(b->lk);
  failed_rails_last(b, &cand);
  return MoveStep::go;
}

// Asks the peer to prepare the move to one of cand: its answer, or none (it
// did not agree: to try again; a planned move's carrier is stopped, so it
// goes on as after a failure). Takes b->lk.
std::optional<json> ask_prepare(Bundle* b, const std::vector<int>& cand, bool planned, std::string* err_out) {
  std::string& err = *err_out;
  auto prep = ask_peer(b,
                       request(b, Msg::carrier_prepare,
                               {{"candidates", cand}, {"down", down_list(b)}, {"planned", planned}}),
                       10000, &err);
  if (!prep || !prep->contains("to")) {
    if (prep) mark_down(b, b->ctx, prep->value("down", json::array()));
    event_move_refused(b, prep ? prep->dump() : err);
    if (planned) {  // the carrier is stopped: it moves as after a failure now
      std::lock_guard l(b->lk);
      b->move = next(b->move, MoveEvent::retry);
    }
    return std::nullopt;
  }
  return prep;
}

// The move's second half, to the path the peer chose: the receives and
// sends moved, the peer told to commit, the move reported; where one of
// those fails, the bundle gives up.
void commit_move(Bundle* b, int from, const std::optional<json>& prep, bool planned, const json& why,
                 MoveClock* clock, std::string* err_out) {
  std::string& err = *err_out;
  mark_down(b, b->ctx, prep->value("down", json::array()));
  int to = prep->value("to", -1);
  if (to < 0 || to >= static_cast<int>(b->paths.size())) {
    give_up(b, "the peer named no usable path");
    return;
  }
  int64_t mine = move_receives(b, to);
  if (mine < 0) {
    give_up(b, "the receives could not move");
    return;
  }
  json info;
  if (!move_sends(b, from, to, prep->value("consumed", uint64_t{0}), &info)) {
    give_up(b, info.value("error", ""));
    return;
  }
  auto ok = ask_peer(b, request(b, Msg::carrier_commit, {{"to", to}, {"consumed", mine}, {"planned", planned}}),
                     10000, &err);
  if (!ok || !ok->value("ok", false)) {
    give_up(b, "the peer did not take the new path: " + (ok ? ok->dump() : err));
    return;
  }
  info["why"] = why;
  clock->lap("commit");
  info["took_ms"] = clock->took;
  event_moved(b, from, to, info, planned);
}

}  // namespace

// Moves two-sided work off a failed carrier (the deciding side). Returns
// false to try again later (no live path yet). planned_to >= 0: steering
// moves it off a live carrier to that path (why: the queues that made it),
// counting no failure; where that path does not answer its probe nothing
// moves, and where the peer does not agree after the carrier stopped, the
// move goes on as a failover's.
bool do_move(Bundle* b, int planned_to, const json& why) {
  const bool planned = planned_to >= 0;
  if (!move_wanted(b, planned, planned_to)) return true;
  std::vector<int> cand;
  int from;
  MoveClock clock;
  {
    std::lock_guard l(b->lk);
    if (!planned && b->fail_ms) clock.took["wait"] = clock.t - b->fail_ms;  // since the failure
  }
  const MoveStep stopped = stop_carrier(b, planned, planned_to, &cand, &from, &clock);
  if (stopped != MoveStep::go) return stopped == MoveStep::done;
  std::string err;
  auto prep = ask_prepare(b, cand, planned, &err);
  if (!prep) return false;
  clock.lap("prepare");
  commit_move(b, from, prep, planned, why, &clock, &err);
  return true;
}

// Work waits for rkeys of the peer's not known on a rail (MRs it
// registered after the bundle was set up): ask for them.
void refresh_rkeys(Bundle* b) {
  std::vector<uint32_t> want;
  {
    std::lock_guard l(b->lk);
    if (!b->need_rkeys) return;
    b->need_rkeys = false;
    for (size_t i = 0; i < b->held.size() && want.size() < 256; i++) {
      const ibv_send_wr& w = b->held[i].wr;
      uint32_t k = w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP || w.opcode == IBV_WR_ATOMIC_FETCH_AND_ADD ? w.wr.atomic.rkey
                                                                                                   : w.wr.rdma.rkey;
      if (std::find(want.begin(), want.end(), k) == want.end()) want.push_back(k);
    }
  }
  if (want.empty()) return;
  std::string err;
  auto r = ask_peer(b, request(b, Msg::rkeys, {{"want", want}}), 3000, &err);
  if (!r) {
    event_rkeys_unanswered(b, err);
    std::lock_guard l(b->lk);
    b->need_rkeys = true;
    return;
  }
  std::lock_guard l(b->lk);
  read_rkeys(b, *r);
  flush_held(b, b->ctx);
}

// A renewal draws ports until one works: while a spine (or the link to
// it) is dark, every shadow that fails lands on the other spine, and stays
// there once it heals; a split job then moves what one spine carries.
// Every kHomeCheckMs while no path is down, the shadows away from the
// router discovery placed them on (their home) ask for ports there, and
// those whose home answers again are renewed onto it together, planned:
// their work goes to the others meanwhile, no failure is counted or
// reported. The deciding side only (the peer renews its halves with
// them, onto its own homes). Under b->move_mu.
void return_home(Bundle* b) {
  std::vector<int> away;
  const int64_t now = mono_ms();
  {
    std::lock_guard l(b->lk);
    for (size_t i = 0; i < b->paths.size(); i++) {
      Path& p = b->paths[i];
      if (p.home.empty()) continue;
      if (p.router == p.home) p.home_backoff = 0;  // home: the next time away starts over
      else if (static_cast<int>(i) != b->carrier && usable(p) && now >= p.home_after) away.push_back(static_cast<int>(i));
    }
  }
  if (away.empty()) return;
  std::vector<int> go = renewal_ports(b, away, true);
  {
    // Where the home router answers ICMP but the route drops RoCE, the path
    // fails again at home: each path's tries back off, doubling to
    // SHUNT_PATH_RETRY_MAX_MS.
    std::lock_guard l(b->lk);
    const int64_t cap = config().num(Param::path_retry_max_ms);
    for (int i : away) {
      Path& p = b->paths[i];
      if (std::find(go.begin(), go.end(), i) == go.end()) {
        p.next_label = 0;  // not going: its next renewal chooses again
        continue;
      }
      p.home_backoff = p.home_backoff ? std::min<int64_t>(p.home_backoff * 2, cap) : kHomeCheckMs;
      p.home_after = now + p.home_backoff;
    }
  }
  if (go.empty()) return;
  std::string err;
  event_going_home(b, go);
  auto back = renew_paths(b, go, &err, true);
  {
    std::lock_guard l(b->lk);
    b->homecomings += back.size();
  }
  if (back.size() < go.size()) event_home_short(b, back.size(), go.size(), err);
}

json answer_carrier_down(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  {
    std::lock_guard l(b->lk);
    if (req.value("carrier", kNone) != b->carrier) return {{"ok", true}, {"note", "that carrier was moved already"}};
    b->move = next(b->move, MoveEvent::peer_down);
  }
  wake_worker(b);
  return {{"ok", true}};
}

json answer_path_down(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  wake_worker(b);
  return {{"ok", true}};
}

namespace {

// Waits for the deciding side's commit; gives up when it never comes.
void watch_commit(Bundle* b, uint64_t moves) {
  ReentryGuard guard;
  auto settled = [&] {
    std::lock_guard l(b->lk);
    return b->moves != moves || b->move == Move::gave_up;
  };
  for (int i = 0; i < 300; i++) {
    usleep(100 * 1000);
    if (settled()) return;
  }
  // Under move_mu, as the QP's destruction: give_up must not reach the
  // application's QP and CQs once they are destroyed. A commit may have
  // come while move_mu was held: asked again under it.
  std::lock_guard m(b->move_mu);
  if (!settled() && alive(b)) give_up(b, "the peer never committed the new path");
}

}  // namespace

json answer_carrier_prepare(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b || !bundle_active(b)) return {{"error", "no active bundle for that QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no active bundle for that QP"}};
  mark_down(b, b->ctx, req.value("down", json::array()));
  poll_overdue_probes(b);
  int to = -1;
  uint64_t moves;
  {
    std::lock_guard l(b->lk);
    std::vector<int> cand;  // the first usable one, where no path failed lately if it can
    for (const auto& x : req.value("candidates", json::array()))
      if (x.is_number_integer() && x.get<int>() >= 0 && x.get<int>() < static_cast<int>(b->paths.size()) &&
          usable(b->paths[x.get<int>()]))
        cand.push_back(x.get<int>());
    failed_rails_last(b, &cand);
    if (!cand.empty()) to = cand.front();
    moves = b->moves;
  }
  if (to < 0) return {{"error", "none of those paths is alive here"}, {"down", down_list(b)}};
  if (!b->tracking.load()) return {{"error", "the QP uses a shared receive queue: its receives cannot move"}};
  b->pending_from = begin_move(b, req.value("planned", false));
  int64_t mine = move_receives(b, to);
  if (mine < 0) {
    start_give_up(b, "the receives could not move");
    return {{"error", "the receives could not move"}};
  }
  start_job("carrier commit watch", [b, moves] { watch_commit(b, moves); });
  return {{"to", to}, {"consumed", mine}, {"down", down_list(b)}};
}

json answer_carrier_commit(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  std::lock_guard m(b->move_mu);
  if (!alive(b)) return {{"error", "no such QP"}};
  int to = req.value("to", -1);
  json info;
  int from = b->pending_from;
  if (to < 0 || to >= static_cast<int>(b->paths.size())) return {{"error", "no such path"}};
  if (!move_sends(b, from, to, req.value("consumed", uint64_t{0}), &info)) {
    start_give_up(b, info.value("error", std::string("?")));
    return {{"error", info.value("error", "")}};
  }
  event_moved(b, from, to, info, req.value("planned", false));
  wake_worker(b);  // to report or renew the old carrier (or the new one, failed already)
  return {{"ok", true}};
}

}  // namespace shunt::verbs::bundle
