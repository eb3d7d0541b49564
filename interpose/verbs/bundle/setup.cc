// Set-up: the deciding end's handshake with the peer's shim, activation, and the probe paths registered with the host agent.
#include "interpose/verbs/bundle/parts.h"

#include <sys/stat.h>
#include <unistd.h>
#include <pthread.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <optional>

#include "core/mono.h"
#include "core/runtime.h"
#include "peer/channel.h"
#include "interpose/verbs/rails.h"

namespace shunt::verbs::bundle {

// Stays primary-only: one log line and one event say why.
void fall_back(Bundle* b, const std::string& why) {
  {
    std::lock_guard g(b->mu);
    set_phase(b, Phase::primary_only, why);
    settle_prim_router(b, false);
  }
  event_fallback(b, why);
}

void activate(Bundle* b) {
  // Its worker's thread, asleep until the first failure or the steering's
  // start wakes it: the completion filter, inside the application's
  // ibv_poll_cq, only wakes it.
  start_worker(b);
  {
    std::lock_guard g(b->lk);
    b->cur = 0;
    b->last = kPrimary;
    b->flowlet = config().num(Param::spread) == 1;
    b->split = config().num(Param::spread) >= 2;
    b->spread_auto = config().num(Param::spread) == 3;
    b->steer = config().num(Param::steer) != 0;
    b->steer_queue = config().num(Param::steer) == 2;
    b->carrier_steer = b->steer_queue && !b->split && !b->flowlet;
    b->split_min = static_cast<uint64_t>(config().num(Param::split_min_bytes));
    b->prim.qp = b->pqp;
    b->prim.qpn = b->pqp->qp_num;
    b->prim.rec = b->primary;
    b->prim.pc = b->ctx;
    for (auto& p : b->paths)
      if (!p.pc) p.pc = b->ctx;
    b->active.store(true, std::memory_order_release);
  }
  set_phase(b, Phase::active);
  event_active(b);
}

// Makes this process reachable for its bundles and lists the QP in the
// host's directory, so the peer's shim can find its owner.
bool register_owner(Bundle* b, std::string* err) {
  int port = peer::start_process_listener(peer::job_key_from(config().str(Param::job_key)), bundle_answer);
  if (!port) {
    *err = "cannot listen for the peer's shim";
    return false;
  }
  std::string dir = bundle_dir();
  if (dir.empty()) {
    *err = "no run directory";
    return false;
  }
  mkdir(dir.c_str(), 0700);
  std::string f = dir + "/" + gid_hex(b->lgid) + "-" + std::to_string(b->pqp->qp_num);
  std::string tmp = f + ".tmp" + std::to_string(getpid());
  {
    std::ofstream o(tmp);
    o << getpid() << " " << port << "\n";
    if (!o) {
      *err = "cannot write " + tmp;
      return false;
    }
  }
  if (rename(tmp.c_str(), f.c_str()) != 0) {
    *err = "cannot write " + f;
    unlink(tmp.c_str());
    return false;
  }
  b->dir_file = f;
  return true;
}

// A probed bundle's failover worker runs from the start, before any
// failure: it asks the host agent what the probes of its shadows' source
// ports say, fails a path whose probes are lost (fail_silent_paths), and
// steers a split bundle by the paths' queues (steer_tick) or moves a pinned
// one's carrier off a congested path (carrier_steer_tick). A split
// bundle's worker runs from the start too, to learn its application QP's
// router (ask_prim_router), which balancing its splits needs.
void start_steering(Bundle* b) {
  bool start;
  {
    std::lock_guard g(b->mu);
    start = (b->probed || b->split) && !b->dead;
  }
  if (start) wake_worker(b);
}

namespace {

// How a step of the set-up ended: go on; the bundle died (stop, nothing
// more to do); or failed (the shadows go, and the bundle stays primary-only).
enum class Step { go, dead, failed };

// Creates the shadows, on the QP's own NIC and, where wanted, on the
// others; the set-up then finds their paths. Takes b->mu.
Step make_shadows(Bundle* b, int n, std::string* err_out) {
  std::string& err = *err_out;
  std::lock_guard g(b->mu);
  if (b->dead) return Step::dead;
  init_rails(b);
  for (int i = 0; i < n; i++)
    if (!create_shadow(b, i, &err)) break;
  if (b->paths.empty()) return Step::failed;
  if (static_cast<int>(b->paths.size()) < n) event_shadows_short(b, b->paths.size(), n, err);
  if (rails_wanted(b)) {
    std::string e;
    for (Rail* r : other_rails(b->ctx->device, b->gid_type)) {
      int k = add_rail(b, r, &e);
      for (int i = 0; k > 0 && i < n; i++)
        if (!create_shadow(b, static_cast<int>(b->paths.size()), &e, k)) break;
      if (k < 0 || !e.empty()) event_rail_shadows(b, r->device, e);
      e.clear();
    }
  }
  set_phase(b, Phase::finding_paths);
  return Step::go;
}

// What the peer's shim answered the join: its reply (none: it gave none in
// time, or refused), the port it answers on, and what went wrong last.
struct JoinAnswer {
  std::optional<json> reply;
  int port = 0;
  std::string last = "no answer";
  bool refused = false;
};

// Asks the peer's shim to join (locating it through its host's agent) until
// the set-up's time is out; false: the bundle died meanwhile. No lock held.
bool ask_join(Bundle* b, const Config& c, const std::string& ip, std::string* err_out, JoinAnswer* a) {
  std::string& err = *err_out;
  std::optional<json>& reply = a->reply;
  int& port = a->port;
  std::string& last = a->last;
  bool& refused = a->refused;
  int64_t deadline = mono_ms() + c.num(Param::bundle_setup_ms);
  json join = request(b, Msg::join,
                      {{"peer_gid", gid_hex(b->lgid)}, {"peer_qpn", b->pqp->qp_num}, {"paths", paths_json(b)},
                       {"addrs", local_addrs()}, {"rails", rkeys_json(b)}, {"access", b->access}});
  while (mono_ms() < deadline) {
    {
      std::lock_guard g(b->mu);
      if (b->dead) return false;
    }
    if (!port) {
      auto r = ask(ip, static_cast<int>(c.num(Param::peer_port)), locate_request(b), &err);
      if (!r) last = "no shim answers at " + ip + ": " + err;
      else if (r->value("port", 0) > 0) port = r->value("port", 0);
      else last = "the peer's agent: " + r->value("retry", r->value("error", std::string("?")));
    }
    if (port) {
      reply = ask(ip, port, join, &err);
      if (reply && reply->contains("paths")) break;
      if (reply && reply->contains("error")) {
        last = "the peer's shim refused: " + reply->value("error", std::string("?"));
        refused = true;
        break;
      }
      last = reply ? "the peer's shim: " + reply->value("retry", std::string("?")) : err;
      if (!reply) port = 0;  // its owner may have gone: locate again
      reply.reset();
    }
    usleep(100 * 1000);
  }
  return true;
}

// Reads the peer's halves and addresses from its reply and connects the
// shadows to them; false: failed (*err says why). Under b->mu.
bool join_paths(Bundle* b, const JoinAnswer& a, std::string* err_out) {
  std::string& err = *err_out;
  if (a.refused || !a.reply) {
    err = a.last;
    return false;
  }
  const json* reply = &*a.reply;
  if (!read_paths(b, *reply, &err)) return false;
  read_addrs(b, *reply);
  b->peer_access = reply->value("access", -1);
  for (auto& p : b->paths)
    if (!connect_shadow(b, p, &err)) return false;
  track_shadows(b);
  b->peer_port = a.port;
  return true;
}

// The halves of our paths the peer keeps, in our order. Under b->mu.
json kept_halves(Bundle* b) {
  json keep = json::array();
  for (const auto& p : b->paths) {
    json x = {{"qpn", p.remote_qpn}};
    if (p.rail) x["gid"] = gid_hex(b->rails[p.rail].rgid);
    keep.push_back(x);
  }
  return keep;
}

constexpr int kActivateTries = 3;

// Asks the peer to activate with the halves it keeps; where it did not
// answer yes, aborts it, and goes on if that says it is active already.
// Called under b->mu, held by g: lets it go across the network and takes
// it again.
Step activate_peer(Bundle* b, std::unique_lock<std::mutex>& g, const json& keep, std::string* err_out) {
  std::string& err = *err_out;
  g.unlock();  // no bundle lock across the network
  // Asked again where no answer came (a busy peer; activating twice is
  // activating once): a bundle given up here stays primary-only for good.
  std::optional<json> ok;
  for (int k = 0; k < kActivateTries && !ok; k++) {
    err.clear();
    ok = ask_peer(b, request(b, Msg::activate, {{"keep", keep}}), 5000, &err);
  }
  if (config().num(Param::test_lose_activation) == 1) ok.reset(), err = "its answer lost (SHUNT_TEST_LOSE_ACTIVATION)";
  g.lock();
  if (b->dead) return Step::dead;
  if (!ok || !ok->value("ok", false)) {
    err = "the peer did not activate: " + (ok ? ok->dump() : err);
    g.unlock();
    std::string aerr;
    auto ab = ask_peer(b, request(b, Msg::abort), 2000, &aerr);
    g.lock();
    if (b->dead) return Step::dead;
    // The peer activated and its answer was lost (a starved host): this
    // side activates too. Left primary-only beside an active peer, it
    // would refuse the peer's every move, and the peer would give the
    // application its errors at the first false failure of its carrier.
    if (!ab || ab->value("error", "") != kActiveBundle) return Step::failed;
    event_activation_answer_lost(b);
  }
  return Step::go;
}

}  // namespace

void run_setup(Bundle* b) {
  ReentryGuard guard;
  pthread_setname_np(pthread_self(), "shunt-bundle");
  const Config& c = config();
  std::string ip, err;
  if (!gid_v4(b->rgid, &ip)) return fall_back(b, "the peer's GID is not an IPv4-mapped RoCE v2 GID");
  int n = static_cast<int>(c.num(Param::paths_per_rail));
  const Step made = make_shadows(b, n, &err);
  if (made == Step::dead) return;
  if (made == Step::failed) goto failed;
  spread_over_routers(b);
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    set_phase(b, Phase::asking_peer);
  }
  {
    JoinAnswer a;
    if (!ask_join(b, c, ip, &err, &a)) return;
    std::unique_lock g(b->mu);
    if (b->dead) return;
    if (!join_paths(b, a, &err)) goto failed;
    const json keep = kept_halves(b);
    const Step act = activate_peer(b, g, keep, &err);
    if (act == Step::dead) return;
    if (act == Step::failed) goto failed;
    settle_prim_router(b);
    activate(b);
    start_stall_watch();
    g.unlock();
    register_probe_paths(b);
    start_steering(b);
    return;
  }
failed : {
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  destroy_shadows(b, false);
}
  fall_back(b, err);
}

// Paths on other NICs: wanted (SHUNT_RAILS=all) and possible (an IPv4
// GID whose type shunt knows).
bool rails_wanted(Bundle* b) { return config().num(Param::rails) == 0 && b->gid_type >= 0; }

// The answering side's rail for one of the peer's halves on another NIC:
// the NIC its route leaves through, when that is not the application's.
// Returns the rail index, or -1. Under b->mu.
int rail_for_half(Bundle* b, const ibv_gid& peer, std::string* err) {
  std::string ip;
  if (!gid_v4(peer, &ip)) return -1;
  Rail* r = rail_toward(ip, b->gid_type, err);
  if (!r || r->device == b->ctx->device) return -1;
  int k = add_rail(b, r, err);
  if (k < 0) return -1;
  BundleRail& br = b->rails[k];
  static const ibv_gid zero{};
  if (memcmp(br.rgid.raw, zero.raw, 16) == 0) br.rgid = peer;
  return memcmp(br.rgid.raw, peer.raw, 16) == 0 ? k : -1;
}

}  // namespace shunt::verbs::bundle
