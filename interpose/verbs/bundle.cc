#include "interpose/verbs/bundle.h"

#include <arpa/inet.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <deque>
#include <fstream>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "interpose/core/log.h"
#include "interpose/core/mono.h"
#include "interpose/core/runtime.h"
#include "interpose/peer/agent.h"
#include "interpose/peer/channel.h"
#include "interpose/peer/control.h"
#include "telemetry/event_log.h"

namespace shunt::verbs {

std::atomic<int> g_shadow_qps{0};

namespace {
using nlohmann::json;

constexpr uint8_t kApp = 1, kFence = 2;
constexpr int kPrimary = -1;

struct Path {
  ibv_qp* qp = nullptr;  // null once destroyed (the record stays for the stats)
  uint32_t qpn = 0;
  QpRecord* rec = nullptr;
  uint32_t psn = 0, remote_qpn = 0, remote_psn = 0, flow_label = 0;
  // Data path, under Bundle::lk. seq counts WRs posted here; done is the
  // seq of the last one known complete (a signaled WR completes every
  // earlier one), so the path has drained when done == posted.
  uint64_t posted = 0, done = 0;
  std::deque<std::pair<uint64_t, uint8_t>> signaled;
  bool last_signaled = true;
  uint64_t wrs = 0, bytes = 0;
  // Flowlet timing: from the first WR after a drain to the next drain.
  int64_t flow_start_ns = 0;
  uint64_t flow_bytes = 0;
  double ns_per_byte = 0;  // EWMA over the path's flowlets; 0: not measured yet
};

inline int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The data path's lock: held for a few dozen instructions, never across a
// call that can block; one locked instruction when uncontended.
class SpinLock {
 public:
  void lock() {
    while (f_.test_and_set(std::memory_order_acquire))
      while (f_.test(std::memory_order_relaxed)) __builtin_ia32_pause();
  }
  void unlock() { f_.clear(std::memory_order_release); }

 private:
  std::atomic_flag f_ = ATOMIC_FLAG_INIT;
};

struct HeldWr {
  ibv_send_wr wr{};
  std::vector<ibv_sge> sge;
  std::vector<char> inline_data;
};

}  // namespace

struct Bundle {
  QpRecord* primary = nullptr;
  ibv_qp* pqp = nullptr;
  ContextRecord* ctx = nullptr;
  // Control path.
  std::mutex mu;
  bool dead = false, started = false, registered = false, probed = false;
  std::string state = "waiting for RTS";
  int access = 0;
  uint8_t port = 1;
  uint16_t pkey = 0;
  bool have_rtr = false, have_rts = false;
  ibv_qp_attr rtr{}, rts{};
  ibv_gid lgid{}, rgid{};
  uint32_t rqpn = 0;
  std::string dir_file;
  // Data path.
  std::atomic<bool> active{false};
  SpinLock lk;
  bool flowlet = true;  // SHUNT_SPREAD, read once at activation
  std::vector<Path> paths;
  int cur = 0, last = kPrimary;
  uint32_t picks = 0;
  std::deque<HeldWr> held;
  uint64_t fences = 0, held_total = 0, to_primary = 0;
};

namespace {

std::mutex g_mu;  // the list of bundles
std::vector<Bundle*>* g_bundles = nullptr;

std::string gid_hex(const ibv_gid& g) {
  char s[33];
  for (int i = 0; i < 16; i++) snprintf(s + 2 * i, 3, "%02x", g.raw[i]);
  return std::string(s, 32);
}

bool gid_v4(const ibv_gid& g, std::string* ip) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(g.raw, prefix, 12) != 0) return false;
  char s[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, g.raw + 12, s, sizeof s);
  *ip = s;
  return true;
}

// Stays primary-only: one log line and one event say why.
void fall_back(Bundle* b, const std::string& why) {
  {
    std::lock_guard g(b->mu);
    b->state = "primary-only: " + why;
  }
  log::warn("{} QP {}: bundle stays primary-only: {}", b->ctx->device, b->pqp->qp_num, why);
  telemetry::event("bundle_fallback",
                   {{"device", static_cast<const char*>(b->ctx->device)}, {"qpn", b->pqp->qp_num}, {"reason", why}});
}

// No thread_local generator: libshunt's TLS must stay small enough for the
// static TLS block when a program dlopens it.
uint32_t random_psn() {
  uint32_t v = 0;
  if (getrandom(&v, sizeof v, 0) != sizeof v) v = static_cast<uint32_t>(mono_ms() * 2654435761u);
  return v & 0xffffff;
}

// Flow labels below 0x4000 give UDP source port 0xC000 | label (the
// kernel's rdma_flow_label_to_udp_sport), so path i gets a port of its own.
// The seed mixes in the local address, so the two ends' shadows (often of
// equal QPNs on fresh hosts) use different ports.
uint32_t flow_label_for(uint32_t seed, int i) { return ((seed * 2654435761u >> 18) + 977u * (i + 1)) % 0x3fff + 1; }
uint32_t label_seed(const Bundle* b) {
  uint32_t a;
  memcpy(&a, b->lgid.raw + 12, 4);
  return b->pqp->qp_num ^ (a * 2246822519u);
}

ibv_qp* create_shadow(Bundle* b, int i, std::string* err) {
  ibv_qp_attr qa{};
  ibv_qp_init_attr init{};
  if (ibv_query_qp(b->pqp, &qa, IBV_QP_CAP, &init) != 0) {
    *err = std::string("ibv_query_qp: ") + strerror(errno);
    return nullptr;
  }
  int64_t limit = config().num(Param::test_shadow_limit);
  if (limit >= 0 && static_cast<int64_t>(b->paths.size()) >= limit) {
    *err = "ibv_create_qp: injected failure (SHUNT_TEST_SHADOW_LIMIT)";
    return nullptr;
  }
  ibv_qp_init_attr ia{};
  ia.send_cq = b->pqp->send_cq;
  ia.recv_cq = b->pqp->recv_cq;
  ia.qp_type = IBV_QPT_RC;
  ia.sq_sig_all = 0;
  ia.cap.max_send_wr = init.cap.max_send_wr + 2;  // + a fence
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = init.cap.max_send_sge ? init.cap.max_send_sge : 1;
  ia.cap.max_recv_sge = 1;
  ia.cap.max_inline_data = init.cap.max_inline_data;
  ibv_qp* q = ibv_create_qp(b->pqp->pd, &ia);
  if (!q) {
    *err = std::string("ibv_create_qp: ") + strerror(errno);
    return nullptr;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.pkey_index = b->pkey;
  a.port_num = b->port;
  a.qp_access_flags = b->access;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *err = std::string("shadow to INIT: ") + strerror(errno);
    ibv_destroy_qp(q);
    return nullptr;
  }
  Path p;
  p.qp = q;
  p.qpn = q->qp_num;
  p.psn = random_psn();
  p.flow_label = flow_label_for(label_seed(b), i);
  b->paths.push_back(p);
  return q;
}

bool shadow_to_rts(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a = b->rts;
  a.qp_state = IBV_QPS_RTS;
  a.sq_psn = p.psn;
  if (ibv_modify_qp(p.qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *err = std::string("shadow to RTS: ") + strerror(errno);
    return false;
  }
  return true;
}

// To RTR against the peer's half, and to RTS when the application's QP is
// there (a QP that only receives, like perftest's server, stays at RTR).
bool connect_shadow(Bundle* b, Path& p, std::string* err) {
  ibv_qp_attr a = b->rtr;
  a.qp_state = IBV_QPS_RTR;
  a.dest_qp_num = p.remote_qpn;
  a.rq_psn = p.remote_psn;
  a.ah_attr.grh.flow_label = p.flow_label;
  if (ibv_modify_qp(p.qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *err = std::string("shadow to RTR: ") + strerror(errno);
    return false;
  }
  return !b->have_rts || shadow_to_rts(b, p, err);
}

// Registers every shadow with the registry, so completions find their way.
void track_shadows(Bundle* b) {
  for (size_t i = 0; i < b->paths.size(); i++) {
    Path& p = b->paths[i];
    if (p.rec) continue;
    p.rec = track_qp(p.qp, false);
    if (p.rec) {
      p.rec->shadow_of = b;
      p.rec->path = static_cast<int>(i);
      p.rec->primary_qpn = b->pqp->qp_num;
      g_shadow_qps.fetch_add(1);
    }
  }
}

// Under b->mu and b->lk. keep: leave the records (with their counters) for
// the stats, as for a bundle that ran; else forget them (setup failed).
void destroy_shadows(Bundle* b, bool keep) {
  for (auto& p : b->paths) {
    if (!p.qp) continue;
    if (p.rec) g_shadow_qps.fetch_sub(1);
    untrack_qp(p.qp);
    ibv_destroy_qp(p.qp);
    p.qp = nullptr;
  }
  if (!keep) b->paths.clear();
}

json paths_json(const Bundle* b) {
  json out = json::array();
  for (const auto& p : b->paths) out.push_back({{"qpn", p.qpn}, {"psn", p.psn}});
  return out;
}

// The peer's halves, (QPN, PSN) per path, from a join request or reply;
// false when the list is missing, empty, longer than `max` or malformed.
bool parse_paths(const json& ps, size_t max, std::vector<std::pair<uint32_t, uint32_t>>* out) {
  if (!ps.is_array() || ps.empty() || ps.size() > max) return false;
  out->clear();
  for (const auto& p : ps) {
    if (!p.is_object() || !p.value("qpn", json()).is_number_unsigned() ||
        !p.value("psn", json()).is_number_unsigned())
      return false;
    out->emplace_back(p["qpn"].get<uint32_t>() & 0xffffff, p["psn"].get<uint32_t>() & 0xffffff);
  }
  return true;
}

bool read_paths(Bundle* b, const json& reply, std::string* err) {
  std::vector<std::pair<uint32_t, uint32_t>> remote;
  if (!parse_paths(reply.contains("paths") ? reply["paths"] : json(), b->paths.size(), &remote)) {
    *err = "the peer's shim sent no usable paths";
    return false;
  }
  for (size_t i = 0; i < remote.size(); i++) std::tie(b->paths[i].remote_qpn, b->paths[i].remote_psn) = remote[i];
  return true;
}

void activate(Bundle* b) {
  {
    std::lock_guard g(b->lk);
    b->cur = 0;
    b->last = kPrimary;
    b->flowlet = config().num(Param::spread) == 1;
    b->active.store(true, std::memory_order_release);
  }
  b->state = "active";
  log::info("{} QP {}: bundle active with {} shadow paths", b->ctx->device, b->pqp->qp_num, b->paths.size());
  std::string ports;
  for (const auto& p : b->paths) ports += (ports.empty() ? "" : ",") + std::to_string(0xC000 | p.flow_label);
  telemetry::event("bundle_setup", {{"device", static_cast<const char*>(b->ctx->device)},
                                    {"qpn", b->pqp->qp_num},
                                    {"paths", b->paths.size()},
                                    {"udp_sports", ports}});
}

std::string probe_key(const Bundle* b) { return gid_hex(b->lgid) + "-" + std::to_string(b->pqp->qp_num); }

// Asks the host agent's probe engine to probe the peer from every shadow's
// UDP source port (clocksync source paths). Without a probe engine the
// bundle works all the same; one line says why it is not probed.
void register_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), peer_ip, local_ip, err;
  if (sock.empty() || !gid_v4(b->rgid, &peer_ip) || !gid_v4(b->lgid, &local_ip)) return;
  json sports = json::array();
  {
    std::lock_guard g(b->mu);
    if (b->dead || !b->active.load()) return;
    for (const auto& p : b->paths) sports.push_back(0xC000 | p.flow_label);
  }
  auto r = peer::request(sock,
                         {{"cmd", "bundle-paths"}, {"peer", peer_ip}, {"local", local_ip}, {"sports", sports},
                          {"key", probe_key(b)}},
                         2000, &err);
  if (!r || !r->value("ok", false)) {
    log::once(LogLevel::info, "bundle-probes",
              "verbs bundles: shadow paths are not probed: " + (r ? r->value("error", r->dump()) : err));
    return;
  }
  std::lock_guard g(b->mu);
  b->probed = true;
}

void drop_probe_paths(Bundle* b) {
  std::string sock = agent::socket_path(), err;
  if (!sock.empty()) peer::request(sock, {{"cmd", "bundle-paths-drop"}, {"key", probe_key(b)}}, 2000, &err);
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

std::optional<json> ask(const std::string& ip, int port, const json& req, std::string* err) {
  return peer::call(ip, port, peer::job_key_from(config().str(Param::job_key)), req, 3000, err);
}

// The side with the lower (GID, QPN) sets the bundle up; the other answers.
bool initiates(const Bundle* b) {
  int c = memcmp(b->lgid.raw, b->rgid.raw, 16);
  return c < 0 || (c == 0 && b->pqp->qp_num < b->rqpn);
}

void run_setup(Bundle* b) {
  ReentryGuard guard;
  pthread_setname_np(pthread_self(), "shunt-bundle");
  const Config& c = config();
  std::string ip, err;
  if (!gid_v4(b->rgid, &ip)) return fall_back(b, "the peer's GID is not an IPv4-mapped RoCE v2 GID");
  int n = static_cast<int>(c.num(Param::paths_per_rail));
  {
    std::lock_guard g(b->mu);
    if (b->dead) return;
    for (int i = 0; i < n; i++)
      if (!create_shadow(b, i, &err)) break;
    if (b->paths.empty()) goto failed;
    if (static_cast<int>(b->paths.size()) < n)
      log::info("{} QP {}: {} of {} shadow QPs ({})", b->ctx->device, b->pqp->qp_num, b->paths.size(), n, err);
    b->state = "asking the peer";
  }
  {
    int64_t deadline = mono_ms() + c.num(Param::bundle_setup_ms);
    json join = {{"cmd", "bundle-join"},   {"gid", gid_hex(b->rgid)},       {"qpn", b->rqpn},
                 {"peer_gid", gid_hex(b->lgid)}, {"peer_qpn", b->pqp->qp_num}, {"paths", paths_json(b)}};
    std::optional<json> reply;
    int port = 0;
    std::string last = "no answer";
    bool refused = false;
    while (mono_ms() < deadline) {
      {
        std::lock_guard g(b->mu);
        if (b->dead) return;
      }
      if (!port) {
        auto r = ask(ip, static_cast<int>(c.num(Param::peer_port)),
                     {{"cmd", "locate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, &err);
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
    std::unique_lock g(b->mu);
    if (b->dead) return;
    if (refused || !reply) {
      err = last;
      goto failed;
    }
    if (!read_paths(b, *reply, &err)) goto failed;
    while (b->paths.size() > (*reply)["paths"].size()) {  // the peer made fewer: ours beyond are not needed
      ibv_destroy_qp(b->paths.back().qp);
      b->paths.pop_back();
    }
    for (auto& p : b->paths)
      if (!connect_shadow(b, p, &err)) goto failed;
    track_shadows(b);
    g.unlock();  // no bundle lock across the network
    auto ok = ask(ip, port, {{"cmd", "bundle-activate"}, {"gid", gid_hex(b->rgid)}, {"qpn", b->rqpn}}, &err);
    g.lock();
    if (b->dead) return;
    if (!ok || !ok->value("ok", false)) {
      err = "the peer did not activate: " + (ok ? ok->dump() : err);
      goto failed;
    }
    activate(b);
    g.unlock();
    register_probe_paths(b);
    return;
  }
failed : {
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  destroy_shadows(b, false);
}
  fall_back(b, err);
}

Bundle* find_bundle(const std::string& gid, uint32_t qpn) {
  std::lock_guard g(g_mu);
  if (!g_bundles) return nullptr;
  for (auto it = g_bundles->rbegin(); it != g_bundles->rend(); ++it) {
    Bundle* b = *it;
    if (b->pqp->qp_num == qpn && gid_hex(b->lgid) == gid) {
      std::lock_guard m(b->mu);
      if (!b->dead) return b;
    }
  }
  return nullptr;
}

json answer_join(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"retry", "no such QP here yet"}};
  std::lock_guard g(b->mu);
  if (!b->have_rtr) return {{"retry", "QP not at RTR yet"}};
  if (gid_hex(b->rgid) != req.value("peer_gid", "") || b->rqpn != req.value("peer_qpn", 0u))
    return {{"error", "that QP is connected to another peer"}};
  if (b->active.load() || !b->paths.empty()) return {{"error", "bundle already set up"}};
  std::vector<std::pair<uint32_t, uint32_t>> remote;
  if (!parse_paths(req.value("paths", json::array()), 64, &remote)) return {{"error", "no paths, or a malformed one"}};
  int n = std::min<int>(static_cast<int>(remote.size()), static_cast<int>(config().num(Param::paths_per_rail)));
  std::string err;
  for (int i = 0; i < n; i++)
    if (!create_shadow(b, i, &err)) break;
  if (b->paths.empty()) {
    b->state = "primary-only: " + err;
    return {{"error", err}};
  }
  json mine = json::array();
  for (size_t i = 0; i < b->paths.size(); i++) {
    Path& p = b->paths[i];
    std::tie(p.remote_qpn, p.remote_psn) = remote[i];
    if (!connect_shadow(b, p, &err)) break;
    mine.push_back({{"qpn", p.qpn}, {"psn", p.psn}});
  }
  if (mine.size() != b->paths.size()) {
    std::lock_guard l(b->lk);
    destroy_shadows(b, false);
    b->state = "primary-only: " + err;
    return {{"error", err}};
  }
  track_shadows(b);
  b->state = "joined, waiting for activation";
  return {{"paths", mine}};
}

json answer_activate(const json& req) {
  Bundle* b = find_bundle(req.value("gid", ""), req.value("qpn", 0u));
  if (!b) return {{"error", "no such QP"}};
  {
    std::lock_guard g(b->mu);
    if (b->paths.empty()) return {{"error", "no shadows"}};
    activate(b);
  }
  register_probe_paths(b);
  return {{"ok", true}};
}

// ---------------------------------------------------------------- data path

bool two_sided(ibv_wr_opcode op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE:
    case IBV_WR_RDMA_READ: return false;
    default: return true;  // SENDs, WRITE_WITH_IMM, atomics, binds, TSO...
  }
}

bool drained(const Path& p) { return p.done == p.posted; }

// Adds to a counter only this thread writes now (under the bundle's lock):
// no locked instruction.
inline void bump_locked(std::atomic<uint64_t>& c, uint64_t n) {
  c.store(c.load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
}

int post_on(Bundle* b, ContextRecord* c, int target, ibv_send_wr* w) {
  bool sig = (w->send_flags & IBV_SEND_SIGNALED) || b->primary->sq_sig_all;
  ibv_send_wr one;
  ibv_send_wr* post = w;
  if (w->next || (sig && !(w->send_flags & IBV_SEND_SIGNALED))) {  // post this WR alone, as asked
    one = *w;
    one.next = nullptr;
    if (sig) one.send_flags |= IBV_SEND_SIGNALED;
    post = &one;
  }
  ibv_send_wr* bad = nullptr;
  if (target == kPrimary) {
    int rc = c->orig.post_send(b->pqp, post, &bad);
    if (rc == 0) b->last = kPrimary, b->to_primary++;
    return rc;
  }
  Path& p = b->paths[target];
  bool starts = p.posted == p.done;
  int rc = c->orig.post_send(p.qp, post, &bad);
  if (rc) return rc;
  if (starts) p.flow_start_ns = now_ns(), p.flow_bytes = 0;
  p.posted++;
  if (sig) p.signaled.emplace_back(p.posted, kApp);
  p.last_signaled = sig;
  p.wrs++;
  uint64_t len = 0;
  for (int i = 0; i < w->num_sge; i++) len += w->sg_list[i].length;
  p.bytes += len;
  p.flow_bytes += len;
  if (p.rec) {  // the path's own counters, as for any QP (the shared shard)
    bump_locked(p.rec->s.hot[kShards].send_wrs[static_cast<unsigned>(w->opcode) & (kWrOpcodes - 1)], 1);
    bump_locked(p.rec->s.hot[kShards].send_bytes, len);
  }
  b->last = target;
  return 0;
}

// Makes sure the path will report when it drains.
void fence(Bundle* b, ContextRecord* c, int path) {
  Path& p = b->paths[path];
  if (p.last_signaled) return;
  ibv_send_wr f{};
  ibv_send_wr* bad = nullptr;
  f.opcode = IBV_WR_RDMA_WRITE;  // zero bytes: no rkey is checked (C9-88)
  f.send_flags = IBV_SEND_SIGNALED;
  if (c->orig.post_send(p.qp, &f, &bad) != 0) return;
  p.posted++;
  p.signaled.emplace_back(p.posted, kFence);
  p.last_signaled = true;
  b->fences++;
}

void hold(Bundle* b, const ibv_send_wr* w) {
  HeldWr h;
  h.wr = *w;
  h.wr.next = nullptr;
  if (w->send_flags & IBV_SEND_INLINE) {  // the caller may reuse its buffer now
    for (int i = 0; i < w->num_sge; i++) {
      const char* s = reinterpret_cast<const char*>(w->sg_list[i].addr);
      h.inline_data.insert(h.inline_data.end(), s, s + w->sg_list[i].length);
    }
    h.sge.push_back({reinterpret_cast<uint64_t>(h.inline_data.data()), static_cast<uint32_t>(h.inline_data.size()), 0});
  } else {
    h.sge.assign(w->sg_list, w->sg_list + w->num_sge);
  }
  b->held.push_back(std::move(h));
  b->held_total++;
}

// At a drain point: the path whose flowlets drained fastest per byte
// lately (an unmeasured one first), so paths through a congested spine get
// less; every fourth pick goes round robin, to keep every estimate fresh.
int next_flowlet_path(Bundle* b) {
  int n = static_cast<int>(b->paths.size());
  int from = b->last == kPrimary ? b->cur : b->last;
  if (b->picks++ % 4 == 3) return (from + 1) % n;
  int best = (from + 1) % n;
  for (int k = 1; k <= n; k++) {
    int i = (from + k) % n;
    if (b->paths[i].ns_per_byte < b->paths[best].ns_per_byte) best = i;
  }
  return best;
}

// Where w goes; kPrimary or a path. -2: it must wait for a fence.
int route(Bundle* b, ContextRecord* c, const ibv_send_wr* w) {
  int target = kPrimary;
  if (!two_sided(w->opcode)) {
    if (b->flowlet && (b->last == kPrimary || drained(b->paths[b->last]))) b->cur = next_flowlet_path(b);
    target = b->cur;
  }
  if (target != b->last && b->last != kPrimary && !drained(b->paths[b->last])) {
    fence(b, c, b->last);
    return -2;
  }
  return target;
}

void flush_held(Bundle* b, ContextRecord* c) {  // under b->lk
  while (!b->held.empty()) {
    HeldWr& h = b->held.front();
    h.wr.sg_list = h.sge.data();
    h.wr.num_sge = static_cast<int>(h.sge.size());
    int target = route(b, c, &h.wr);
    if (target == -2) return;
    if (int rc = post_on(b, c, target, &h.wr))
      log::error("{} QP {}: a held WR could not be posted ({}); it is lost", c->device, b->pqp->qp_num, strerror(rc));
    b->held.pop_front();
  }
}

}  // namespace

// ------------------------------------------------------------------ public

void bundle_on_modify(QpRecord* r, const ibv_qp_attr* attr, int mask) {
  if (!r || r->type != IBV_QPT_RC || r->shadow_of || current_mode() != Mode::active) return;
  const Config& c = config();
  if (c.num(Param::paths_per_rail) == 0 || c.str(Param::job_key).empty()) {
    if (c.num(Param::paths_per_rail) != 0)
      log::once(LogLevel::info, "bundle-nokey", "verbs bundles need SHUNT_JOB_KEY (the peer channel): QPs stay primary-only");
    return;
  }
  Bundle* b = r->bundle.load();
  if (!b) {
    if (!(mask & IBV_QP_STATE) || attr->qp_state != IBV_QPS_INIT) return;
    b = new Bundle;
    b->primary = r;
    b->pqp = r->qp;
    b->ctx = r->ctx;
    {
      std::lock_guard g(g_mu);
      if (!g_bundles) g_bundles = new std::vector<Bundle*>;
      g_bundles->push_back(b);
    }
    r->bundle.store(b, std::memory_order_release);
  }
  bool start = false;
  {
    std::lock_guard g(b->mu);
    if (mask & IBV_QP_ACCESS_FLAGS) b->access = attr->qp_access_flags;
    if (mask & IBV_QP_PORT) b->port = attr->port_num;
    if (mask & IBV_QP_PKEY_INDEX) b->pkey = attr->pkey_index;
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTR) {
      b->rtr = *attr;
      b->rqpn = attr->dest_qp_num;
      b->have_rtr = true;
      std::string err;
      if (!(attr->ah_attr.is_global)) {
        b->state = "primary-only: no GRH (not RoCE v2)";
      } else if (ibv_query_gid(b->pqp->context, b->port, attr->ah_attr.grh.sgid_index, &b->lgid) != 0) {
        b->state = "primary-only: cannot read the local GID";
      } else {
        b->rgid = attr->ah_attr.grh.dgid;
        if (!register_owner(b, &err)) b->state = "primary-only: " + err;
        else b->registered = true;
      }
    }
    if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_RTS && b->have_rtr && !b->started) {
      b->rts = *attr;
      b->have_rts = true;
      std::string err;
      for (auto& p : b->paths)  // joined while the QP was at RTR
        if (!shadow_to_rts(b, p, &err)) {
          log::warn("{} QP {}: {}; the bundle stops", b->ctx->device, b->pqp->qp_num, err);
          b->active.store(false);
          break;
        }
      if (b->registered && initiates(b)) {
        b->started = true;
        start = true;
        b->state = "setting up";
      } else if (b->registered) {
        b->state = "waiting for the peer's shim";
      }
    }
  }
  if (start) std::thread(run_setup, b).detach();
}

void bundle_on_destroy(QpRecord* r) {
  Bundle* b = r ? r->bundle.load() : nullptr;
  if (!b) return;
  bool probed;
  {
    std::lock_guard g(b->mu);
    b->dead = true;
    std::lock_guard l(b->lk);
    b->active.store(false);
    destroy_shadows(b, true);
    b->held.clear();
    if (!b->dir_file.empty()) unlink(b->dir_file.c_str());
    b->state += " (destroyed)";
    probed = b->probed;
  }
  if (probed) drop_probe_paths(b);
}

bool bundle_active(const Bundle* b) { return b->active.load(std::memory_order_acquire); }

int bundle_post_send(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  std::lock_guard l(b->lk);
  if (!b->active.load(std::memory_order_relaxed)) return c->orig.post_send(qp, wr, bad);
  for (ibv_send_wr* w = wr; w; w = w->next) {
    if (!b->held.empty()) {
      hold(b, w);
      continue;
    }
    int target = route(b, c, w);
    if (target == -2) {
      hold(b, w);
      continue;
    }
    if (int rc = post_on(b, c, target, w)) {
      *bad = w;
      return rc;
    }
  }
  return 0;
}

int bundle_filter(ContextRecord* c, ibv_wc* wc, int n) {
  int out = 0;
  Bundle *touched = nullptr, *pending_flush = nullptr;
  for (int i = 0; i < n; i++) {
    QpRecord* r = find_qp_by_num(c, wc[i].qp_num);
    if (!r || !r->shadow_of) {
      if (out != i) wc[out] = wc[i];
      out++;
      continue;
    }
    Bundle* b = r->shadow_of;
    uint8_t kind = kApp;
    {
      std::lock_guard l(b->lk);
      if (r->path < static_cast<int>(b->paths.size())) {
        Path& p = b->paths[r->path];
        if (!p.signaled.empty()) {
          kind = p.signaled.front().second;
          p.done = p.signaled.front().first;
          p.signaled.pop_front();
          if (drained(p) && p.flow_bytes > 0) {  // a flowlet ended: how fast did it drain?
            double x = static_cast<double>(now_ns() - p.flow_start_ns) / static_cast<double>(p.flow_bytes);
            p.ns_per_byte = p.ns_per_byte > 0 ? 0.75 * p.ns_per_byte + 0.25 * x : x;
            p.flow_bytes = 0;
          }
        }
      }
      if (!b->held.empty() && touched != b) {
        if (touched) pending_flush = touched;  // rare: two bundles in one batch
        touched = b;
      }
    }
    if (pending_flush) {
      std::lock_guard l(pending_flush->lk);
      flush_held(pending_flush, c);
      pending_flush = nullptr;
    }
    if (kind == kFence && wc[i].status == IBV_WC_SUCCESS) continue;
    wc[i].qp_num = r->primary_qpn;
    if (out != i) wc[out] = wc[i];
    out++;
  }
  if (touched) {
    std::lock_guard l(touched->lk);
    flush_held(touched, c);
  }
  return out;
}

json bundle_json(const QpRecord& r) {
  Bundle* b = r.bundle.load();
  if (!b) return nullptr;
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  json paths = json::array();
  for (const auto& p : b->paths)
    paths.push_back({{"qpn", p.qpn},
                     {"ns_per_byte", p.ns_per_byte},
                     {"remote_qpn", p.remote_qpn},
                     {"udp_sport", 0xC000 | p.flow_label},
                     {"wrs", p.wrs},
                     {"bytes", p.bytes}});
  return {{"state", b->state},     {"active", b->active.load()}, {"paths", paths}, {"fences", b->fences},
          {"held", b->held_total}, {"to_primary", b->to_primary}};
}

json bundle_answer(const json& req) {
  ReentryGuard g;
  const std::string cmd = req.value("cmd", "");
  try {
    if (cmd == "bundle-join") return answer_join(req);
    if (cmd == "bundle-activate") return answer_activate(req);
  } catch (const json::exception& e) {
    return {{"error", std::string("malformed request: ") + e.what()}};
  }
  return {{"error", "unknown command " + cmd}};
}

Bundle* bundle_attach_for_test(QpRecord* r, const std::vector<ibv_qp*>& shadows) {
  auto* b = new Bundle;
  b->primary = r;
  b->pqp = r->qp;
  b->ctx = r->ctx;
  for (size_t i = 0; i < shadows.size(); i++) {
    Path p;
    p.qp = shadows[i];
    p.qpn = shadows[i]->qp_num;
    p.flow_label = flow_label_for(r->qpn, static_cast<int>(i));
    b->paths.push_back(p);
  }
  {
    std::lock_guard g(g_mu);
    if (!g_bundles) g_bundles = new std::vector<Bundle*>;
    g_bundles->push_back(b);
  }
  std::lock_guard g(b->mu);
  track_shadows(b);
  r->bundle.store(b, std::memory_order_release);
  activate(b);
  return b;
}

void bundle_detach_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  if (!b) return;
  std::lock_guard g(b->mu);
  std::lock_guard l(b->lk);
  b->dead = true;
  b->active.store(false);
  for (auto& p : b->paths) {
    if (p.rec) g_shadow_qps.fetch_sub(1);
    untrack_qp(p.qp);
  }
  r->bundle.store(nullptr);
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
