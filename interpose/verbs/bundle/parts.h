// What each part of the bundle offers the others, by file, in the order of
// their layers: a file calls only those listed before it, and two calls go
// the other way, to worker.cc: wake_worker (the parts below wake the
// failover worker, and start it where its start at activation failed) and
// start_job (every thread of the bundle starts there). lifecycle.cc,
// datapath.cc and api.cc, the top, offer only bundle.h. state.h holds the
// types, with life.h and move.h below it (a path's life and a carrier move:
// states, events, one pure transition each); test hooks are in testing/.
// Only these files include it.
#pragma once
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/state.h"

namespace shunt::verbs::bundle {

// ---- small questions about a path or WR (the data path's, inlined)
inline constexpr int kWait = -2, kNone = -3;
inline bool two_sided(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_READ: return false;
    default: return true;  // SENDs, WRITE_WITH_IMM, atomics, binds, TSO...
  }
}
// Consumes a receive at the peer: the peer counts these.
inline bool consumes(ibv_wr_opcode op) {
  return op == IBV_WR_SEND || op == IBV_WR_SEND_WITH_IMM || op == IBV_WR_RDMA_WRITE_WITH_IMM ||
         op == IBV_WR_SEND_WITH_INV;
}
inline Path& P(Bundle* b, int i) { return i == kPrimary ? b->prim : b->paths[i]; }
inline bool drained(const Path& p) { return p.done == p.posted; }
inline bool usable(const Path& p) { return !p.down() && !p.probation(); }
inline bool signaled(const Bundle* b, const ibv_send_wr& w) {
  return (w.send_flags & IBV_SEND_SIGNALED) || b->primary->sq_sig_all;
}
// Adds to a counter only this thread writes now (under the bundle's lock):
// no locked instruction.
inline void bump_locked(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

// ---- types of messages
// The requests one end's shim sends the other's about their QP pair, over
// the peer channel; each is answered by the handler api.cc's table names.
enum class Msg : uint8_t {
  join,             // bundle-join: the deciding end's paths, for the answering end's halves
  activate,         // bundle-activate: which halves to keep; both ends go active
  abort,            // bundle-abort: the set-up ends (the answer says whether it was active)
  give_up,          // bundle-give-up: no path carries the work: the application gets its errors
  carrier_down,     // carrier-down: the carrier failed; the answering end moves its receives
  carrier_prepare,  // carrier-prepare: the first half of a carrier move (receives)
  carrier_commit,   // carrier-commit: its second half (sends, by the consumed count)
  path_renew,       // path-renew: renew these paths' halves on new ports
  path_down,        // path-down: these paths failed here
  steer_view,       // steer-view: the forward queues this end sees, for the deciding end
  rkeys,            // bundle-rkeys: the peer's rkeys on its other NICs
  renew_now,        // renew-now: a route came back: renew without waiting out the backoff
};
inline constexpr int kMsgs = 12;
// One of the peer's halves: a path on its application NIC, or (gid set) on
// another of its NICs; `none`: the peer has no half for this one.
struct Half {
  uint32_t qpn = 0, psn = 0;
  bool rail = false, none = false;
  ibv_gid gid{};
};

// ---- types of setup
// answer_abort's word for a bundle it activated already.
inline constexpr const char* kActiveBundle = "the bundle is active";

// ---- types of post
inline constexpr int kMaxRailSge = 32;
inline constexpr size_t kMaxHeld = 16384;  // a QP whose depth shunt did not see

// ---- types of steering
// The host agent's probes' word on each of a bundle's source paths, by
// (rail, source port) (probe_stats).
using ProbeStats = std::map<std::pair<int, uint32_t>, json>;

// ---- types of failover
// path_failed statuses that are not a completion's (-1: the peer's word)
inline constexpr int kStalled = -3;   // the stall watch
inline constexpr int kPortDown = -4;  // a port or device event
inline constexpr int kProbesLost = -5;  // the host agent's probes of its source port
inline constexpr int kFlapping = -6;    // the stall watch: held up again and again, never for a whole stall
inline constexpr int kUnanswered = -7;  // the stall watch: silent after a failure while other paths answered
// What a failure decided under the lock, for its caller's events after it
// (never under the spin lock). The poll path's go to the bundle's mailbox.
struct After {
  std::vector<std::pair<int, int>> down;  // (path, wc status)
  std::vector<int> up;                    // renewed paths whose probe completed
};

// ---- types of detect
// When the port of a bundle's rail last retransmitted (ms), by rail.
using RetxFn = std::function<int64_t(int)>;

// ---- types of carrier
// How often return_home looks (carrier.cc), and how long a woken worker stays quiet.
inline constexpr int64_t kHomeCheckMs = 2000;
inline constexpr int kQuietMs = 2000;  // a whole bundle's worker, woken by the gen watch

// ---- labels.cc
// A bundle's phase in words, as the stats file shows it; and its setter
// (under b->mu).
std::string phase_text(Phase p, const std::string& why, bool destroyed);
void set_phase(Bundle* b, Phase p, std::string why = {});
std::string gid_hex(const ibv_gid& g);
uint32_t random_psn();
uint32_t flow_label_for(uint32_t seed, int i);
uint32_t label_seed(uint32_t qpn, const ibv_gid& lgid);
uint32_t label_seed(const Bundle* b);
uint32_t sport_of(uint32_t fl);
uint32_t path_sport(const Path& p);
bool parse_gid(const std::string& hex, ibv_gid* g);
// The side with the lower (GID, QPN) sets the bundle up; the other answers.
bool initiates(const Bundle* b);

// ---- events.cc
// What the bundle says, in its log and its events: the only part that logs.
void event_down(Bundle* b, const After& a);
void event_all_stalled(Bundle* b, size_t n);
void event_moved(Bundle* b, int from, int to, const json& info, bool planned = false);
void event_renewed(Bundle* b, int i, bool probation);
void event_up(Bundle* b, int i);
// No path carries b's work: the application gets its errors (why).
void event_gave_up(Bundle* b, const std::string& why);
// Reports what the completion filter left in b's mailbox, in order, as
// event_down and event_up do; returns how many reports (dropped ones
// included). The event_ functions above report the mailbox first; none is
// called under b->lk. Those below take no lock: their callers may hold
// b->mu or b->lk.
size_t report_mail(Bundle* b);
// The host agent did not answer path discovery (why): once a process.
void event_discovery_unanswered(const std::string& why);
// SHUNT_PATHS_PER_RAIL without SHUNT_JOB_KEY: once a process.
void event_no_job_key();
// The host agent took no probes of b's rail k's paths (why): once a process per k.
void event_probes_refused(size_t k, const std::string& why);
// b stays primary-only (why).
void event_fallback(Bundle* b, const std::string& why);
// b is active: its shadow paths' source ports, per NIC.
void event_active(Bundle* b);
// Fewer shadow QPs than wanted on b's own NIC (made of wanted; why).
void event_shadows_short(Bundle* b, size_t made, int wanted, const std::string& why);
// b's shadows on another NIC, device: none, or fewer than wanted (why).
void event_rail_shadows(Bundle* b, const std::string& device, const std::string& why);
// b's rail has no path over device: the route to the peer's gid leaves through another NIC.
void event_rail_unrouted(Bundle* b, const std::string& device, const ibv_gid& gid);
// Rail `rail`'s n shadows placed over routers (spread); for_peer: the answering end's.
void event_shadows_placed(Bundle* b, int rail, size_t n, const std::string& spread, bool for_peer = false);
// No router answered for rail `rail`'s ports: the hash places them.
void event_shadows_hashed(Bundle* b, int rail);
// The peer activated, its answer lost: this side activates too.
void event_activation_answer_lost(Bundle* b);
// A shadow could not go to RTS with the application's QP (why): b stops.
void event_stopped(Bundle* b, const std::string& why);
// n atomic WRs in flight on a failed path complete with an error.
void event_atomics_failed(Bundle* b, size_t n);
// A receive could not move to path `to` (rc: its errno).
void event_receive_unmoved(Bundle* b, int to, int rc);
// The peer did not agree on a carrier move yet (its answer, or the error).
void event_move_refused(Bundle* b, const std::string& answer);
// The peer's shim cannot be reached for a carrier move (why); the work is held.
void event_peer_unreachable(Bundle* b, const std::string& why);
// The peer did not send its rkeys on its other NICs (why).
void event_rkeys_unanswered(Bundle* b, const std::string& why);
// These paths are renewed onto the routers discovery placed them on (their home).
void event_going_home(Bundle* b, const std::vector<int>& paths);
// Only `back` of the `went` paths renewed at home (why); the rest renew as any path.
void event_home_short(Bundle* b, size_t back, size_t went, const std::string& why);
// Path i not renewed (why); the next try in next_ms.
void event_renewal_deferred(Bundle* b, int i, const std::string& why, int64_t next_ms);
// A split's shares moved by steering: from, to, the steps since the last event, the paths.
void event_shares_steered(Bundle* b, const std::string& from, const std::string& to, uint64_t steps,
                          const std::string& paths);
// The port events of a device that cannot be opened (err: its errno) are not watched.
void event_port_unwatched(const std::string& device, int err);
// A port or device event came (port 0: the device's).
void event_port(const std::string& device, ibv_event_type type, int port);
// A device's event channel closed: its port events are no longer watched.
void event_port_channel_closed(const std::string& device);

// ---- list.cc
extern std::mutex g_mu;                  // the list of bundles
extern std::vector<Bundle*>* g_bundles;  // never shrinks
bool alive(Bundle* b);
Bundle* find_bundle(const std::string& gid, uint32_t qpn);
std::vector<Bundle*> all_bundles();

// ---- messages.cc
// A message's name on the wire, and the message of a name (false: none).
const char* msg_name(Msg m);
bool msg_of(const std::string& name, Msg* m);
// A request about b's QP pair: the message's name, the peer's GID and QPN,
// and the fields given.
json request(const Bundle* b, Msg m, json fields = json::object());
// The question for the peer host's agent: which port the process that owns
// b's peer QP answers on (before any request above reaches that process).
json locate_request(const Bundle* b);
// Asks the peer's shim (its process listener, found through its host agent)
// until total_ms; never with a bundle lock held.
std::optional<json> ask_peer(Bundle* b, json req, int total_ms, std::string* err);
// One request to a shim or agent at ip:port.
std::optional<json> ask(const std::string& ip, int port, const json& req, std::string* err);
json local_addrs();
void read_addrs(Bundle* b, const json& msg);
json path_json(const Bundle* b, const Path& p);
json paths_json(const Bundle* b);
bool parse_paths(const json& ps, size_t max, std::vector<Half>* out);
json rkeys_json(const Bundle* b, const std::vector<uint32_t>* only = nullptr);
void read_rkeys(Bundle* b, const json& msg);
bool read_paths(Bundle* b, const json& reply, std::string* err);

// ---- probes.cc
std::string probe_key(const Bundle* b, size_t k = 0);
size_t rail_count(const Bundle* b);
bool register_probe_paths(Bundle* b);
void drop_probe_paths(Bundle* b);
bool probe_stats(Bundle* b, ProbeStats* out);

// ---- shadows.cc
void init_rails(Bundle* b);
int add_rail(Bundle* b, Rail* r, std::string* err);
ibv_qp* create_shadow(Bundle* b, int i, std::string* err, int rail = 0);
bool shadow_to_rts(Bundle* b, Path& p, std::string* err);
bool connect_shadow(Bundle* b, Path& p, std::string* err);
void track_shadows(Bundle* b);
void destroy_shadows(Bundle* b, bool keep);

// ---- placement.cc
int shared_hops(const std::string& local, const std::string& peer, int candidates, int wait_ms, bool once,
                std::vector<uint16_t>* ports, std::vector<std::string>* hops);
std::vector<std::pair<uint32_t, std::string>> pick_ports(std::vector<uint16_t> ports, std::vector<std::string> hops,
                                                         int want, uint32_t prim, std::string* spread);
std::vector<std::pair<uint32_t, std::string>> cross_order(const std::vector<std::pair<uint32_t, std::string>>& placed);
void ask_prim_router_early(Bundle* b, uint32_t sport);
void settle_prim_router(Bundle* b, bool take = true);
void spread_over_routers(Bundle* b);
void ask_prim_router(Bundle* b);

// ---- post.cc
extern std::mutex g_stash_mu;
extern std::deque<std::pair<ibv_cq*, ibv_wc>>* g_stash;
void stash(ibv_cq* cq, const ibv_wc& w);
void owe(Bundle* b, const Copy& cp, ibv_wc_status st);
bool fits(Bundle* b, int pi, const ibv_send_wr* w);
int post_recvs_on(Bundle* b, Path& p, ibv_recv_wr* wr, ibv_recv_wr** bad);
bool bundle_drained(const Bundle* b);
void open_period(Bundle* b);
void close_period(Bundle* b);
int auto_choose(Bundle* b);
int post_on(Bundle* b, ContextRecord* c, int target, Copy* from, ibv_send_wr* w);
void fence(Bundle* b, ContextRecord* c, int path);
void hold(Bundle* b, const ibv_send_wr* w);
int next_live(Bundle* b, int from);
int next_flowlet_path(Bundle* b);

// ---- spread.cc
bool split(Bundle* b, ContextRecord* c, const ibv_send_wr* w, Copy* slot);
int route(Bundle* b, ContextRecord* c, const ibv_send_wr* w);
void flush_held(Bundle* b, ContextRecord* c);

// ---- failover.cc
void path_failed(Bundle* b, int pi, int status, After* a, bool counted = true);
std::vector<int> down_list(Bundle* b);
void mark_down(Bundle* b, ContextRecord* c, const json& list);
void drain(Bundle* b);
int begin_move(Bundle* b, bool planned = false);
int64_t move_receives(Bundle* b, int to);
bool move_sends(Bundle* b, int from, int to, uint64_t peer_consumed, json* info);
void give_up(Bundle* b, const std::string& why);
void start_give_up(Bundle* b, std::string why);

// ---- steering.cc
void steer_tick(Bundle* b, const ProbeStats& stats);
int carrier_steer_tick(Bundle* b, const ProbeStats& stats, bool decides, json* why);
json answer_steer_view(const json& req);

// ---- renewal.cc
// Which of a renewal's candidate ports to take, by the router hops[j] that
// candidate j was seen to take ("": none answered). Sent home (home not
// empty): the home router's, else the answered one on the router with the
// fewest paths (load). After a failure: one on a router in `works` (a path
// of the bundle was proven through it since the last failure), else the
// first answered. -1: none answered.
int pick_renewal(const std::vector<std::string>& hops, const std::string& home, const std::set<std::string>& works,
                 const std::map<std::string, int>& load);
// Per rail, the routers of b's paths (the application's QP's included, the
// paths in `skip` not) that are in service and whose probe completed since
// a path of b last failed: their whole route to the peer works now.
// Under b->lk.
std::map<int, std::set<std::string>> proven_routers(Bundle* b, const std::vector<int>& skip);
std::vector<int> renewal_ports(Bundle* b, const std::vector<int>& idx, bool home);
void probe(Bundle* b, int i);
bool back_in_service(Bundle* b, int i);
void probe_all(Bundle* b);
void poll_overdue_probes(Bundle* b);
std::vector<int> answering(Bundle* b, const std::vector<int>& cand, int ms);
std::vector<int> renew_paths(Bundle* b, const std::vector<int>& want, std::string* err, bool planned);
json answer_path_renew(const json& req);

// ---- carrier.cc
bool do_move(Bundle* b, int planned_to = -1, const json& why = nullptr);
void refresh_rkeys(Bundle* b);
void return_home(Bundle* b);
json answer_carrier_down(const json& req);
json answer_path_down(const json& req);
json answer_carrier_prepare(const json& req);
json answer_carrier_commit(const json& req);

// ---- detect.cc
int check_stalls(Bundle* b, int64_t now, int64_t stall_ms, const RetxFn& retx_ms);
// The stall watch's look interval for SHUNT_STALL_MS = stall_ms.
inline int64_t watch_tick_ms(int64_t stall_ms) { return stall_ms ? std::clamp<int64_t>(stall_ms / 8, 50, 1000) : 1000; }
// *spared: a path whose probes are lost was kept for its work completing
// (ask again soon: the route may have just gone dark).
int fail_silent_paths(Bundle* b, const ProbeStats& stats, int64_t now_ms, bool* spared = nullptr);
int on_port_event(const std::string& device, int port, bool up, bool wake = true);
void start_stall_watch();
void watch_resync(bool wait);

// ---- worker.cc
// The worker's thread, asleep until its first wake-up: started at
// activation, so that the data path never starts a thread.
void start_worker(Bundle* b);
// Wakes the worker (and starts it where its start at activation failed).
void wake_worker(Bundle* b);
// Wakes the worker, never starts it: the data path's (bundle_filter,
// inside the application's ibv_poll_cq), and bundle_on_destroy's.
void signal_worker(Bundle* b);
// Every thread of the bundle starts here (core/threads owns and joins
// them; none is detached): the worker's, and the jobs the other parts hand
// over that must not run on their caller's thread, because it holds locks
// the job takes or answers a peer that waits: the set-up, a give-up, a
// carrier move's commit watch, the process's stall watch. false: no thread
// could be made. Any part may call it, as wake_worker.
bool start_job(const char* what, std::function<void()> body,
               std::function<void(const std::string&)> on_throw = nullptr);

// ---- setup.cc
void fall_back(Bundle* b, const std::string& why);
void activate(Bundle* b);
bool register_owner(Bundle* b, std::string* err);
void start_steering(Bundle* b);
void run_setup(Bundle* b);
bool rails_wanted(Bundle* b);
int rail_for_half(Bundle* b, const ibv_gid& peer, std::string* err);

// ---- handshake.cc
json answer_join(const json& req);
json answer_abort(const json& req);
json answer_activate(const json& req);

}  // namespace shunt::verbs::bundle
