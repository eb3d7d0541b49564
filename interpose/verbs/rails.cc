#include "interpose/verbs/rails.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <dirent.h>

#include <algorithm>
#include <fstream>
#include <cstring>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "core/log.h"
#include "core/runtime.h"
#include "interpose/verbs/bundle.h"

namespace shunt::verbs {

std::atomic<int> g_mirror_cqs{0};
std::atomic<int64_t> g_rail_expect{0};

namespace {

// ------------------------------------------------------------------ rails

std::mutex g_rail_mu;
std::vector<Rail*>* g_rails = nullptr;  // never freed: bundles keep pointers
std::vector<std::pair<std::string, ibv_context*>>* g_rail_ctx = nullptr;

// Shunt's own context of a device, opened when a bundle first needs it
// there. Under g_rail_mu.
bool open_rail(Rail* r) {
  if (r->ctx) return true;
  if (!g_rail_ctx) g_rail_ctx = new std::vector<std::pair<std::string, ibv_context*>>;
  for (auto& [n, c] : *g_rail_ctx)
    if (n == r->device) {
      r->ctx = c;
      r->rec = find_context(c);
      return r->rec != nullptr;
    }
  ibv_context* c = open_device_named(r->device);
  if (!c) return false;
  if (!patch_context(c, r->device.c_str())) {
    ibv_close_device(c);
    return false;
  }
  g_rail_ctx->emplace_back(r->device, c);
  r->ctx = c;
  r->rec = find_context(c);
  return r->rec != nullptr;
}

std::string read_line(const std::string& path) {
  std::ifstream f(path);
  std::string l;
  std::getline(f, l);
  return l;
}

// A GID type as sysfs names it (gid_attrs/types), as ibv_query_gid_ex
// gives it on an Ethernet port.
int sysfs_gid_type(const std::string& s) {
  if (s == "RoCE v2") return IBV_GID_TYPE_ROCE_V2;
  if (s == "IB/RoCE v1") return IBV_GID_TYPE_ROCE_V1;
  return -1;
}

// Looks at every device port again (states and addresses change), from
// sysfs, so no device is opened just to look: the rails found are active
// Ethernet ports with an IPv4 GID of gid_type. Under g_rail_mu.
std::vector<Rail*> scan(int gid_type, const std::string& root = "/sys/class/infiniband") {
  if (!g_rails) g_rails = new std::vector<Rail*>;
  std::vector<Rail*> out;
  DIR* d = opendir(root.c_str());
  if (!d) return out;
  std::vector<std::string> devs;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') devs.push_back(e->d_name);
  closedir(d);
  std::sort(devs.begin(), devs.end());
  for (const auto& name : devs) {
    for (int port = 1; port <= 8; port++) {
      std::string pdir = root + "/" + name + "/ports/" + std::to_string(port);
      std::string state = read_line(pdir + "/state");
      if (state.empty()) break;
      if (state.find("ACTIVE") == std::string::npos || read_line(pdir + "/link_layer") != "Ethernet") continue;
      for (int i = 0; i < 256; i++) {
        std::string g = read_line(pdir + "/gids/" + std::to_string(i));
        if (g.empty()) break;
        if (sysfs_gid_type(read_line(pdir + "/gid_attrs/types/" + std::to_string(i))) != gid_type) continue;
        ibv_gid gid{};
        std::string hex, ip;
        for (char ch : g)
          if (ch != ':') hex += ch;
        if (hex.size() != 32) continue;
        for (int k = 0; k < 16; k++) gid.raw[k] = static_cast<uint8_t>(std::stoul(hex.substr(2 * k, 2), nullptr, 16));
        if (!gid_v4(gid, &ip)) continue;
        Rail* r = nullptr;
        for (Rail* x : *g_rails)
          if (x->device == name && x->port == port && x->ip == ip) r = x;
        if (!r) {
          r = new Rail;
          r->device = name;
          r->port = static_cast<uint8_t>(port);
          r->ip = ip;
          g_rails->push_back(r);
        }
        r->gid_index = i;
        r->gid = gid;
        out.push_back(r);
        break;
      }
    }
  }
  return out;
}

// The source address the kernel picks for ip (a connected UDP socket sends
// nothing).
bool source_for(const std::string& ip, std::string* src) {
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(4791);
  if (inet_pton(AF_INET, ip.c_str(), &to.sin_addr) != 1) return false;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in me{};
  socklen_t len = sizeof me;
  bool ok = connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0 &&
            getsockname(fd, reinterpret_cast<sockaddr*>(&me), &len) == 0;
  close(fd);
  if (!ok) return false;
  char s[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, &me.sin_addr, s, sizeof s);
  *src = s;
  return true;
}

// ------------------------------------------------------------------ mirrors

struct MrRec {
  ibv_mr* mr;
  void* addr;
  size_t len;
  uint64_t iova;
  int access;
  std::vector<std::pair<const Rail*, ibv_mr*>> m;
};
struct PdMirror {
  ibv_pd* app;
  const Rail* r;
  ibv_pd* pd;
};

std::shared_mutex g_mr_mu;
std::map<std::pair<const ibv_context*, uint32_t>, MrRec*>* g_by_lkey = nullptr;
std::map<const ibv_mr*, MrRec*>* g_by_mr = nullptr;
std::vector<PdMirror>* g_pds = nullptr;

// Made on first use (never freed: a destructor at exit could run under a
// thread still registering). Under g_mr_mu, exclusive.
void init_mr_maps() {
  if (g_pds) return;
  g_by_lkey = new std::map<std::pair<const ibv_context*, uint32_t>, MrRec*>;
  g_by_mr = new std::map<const ibv_mr*, MrRec*>;
  g_pds = new std::vector<PdMirror>;
}

// Under g_mr_mu (exclusive).
void mirror_mr(MrRec* m, ibv_pd* mpd, const Rail* r) {
  ibv_mr* x = ibv_reg_mr_iova2(mpd, m->addr, m->len, m->iova, static_cast<unsigned>(m->access));
  if (!x) {
    log::once(LogLevel::warn, "mirror-mr-" + r->device,
              r->device + ": an MR could not be mirrored (" + strerror(errno) +
                  "); WRs using it stay on the application's NIC");
    return;
  }
  m->m.emplace_back(r, x);
}

// Wakes an application waiting on its CQ's channel: see mirror_cq.
struct Doorbell {
  ibv_cq* app = nullptr;
  ibv_pd* pd = nullptr;
  ibv_qp* qp = nullptr;
  ContextRecord* c = nullptr;
  std::atomic<bool> pending{false};  // rung since its last completion was polled
};

struct CqSlot {
  std::atomic<ibv_cq*> app{nullptr};
  ibv_cq* cq = nullptr;
  ContextRecord* rec = nullptr;
  const Rail* r = nullptr;
  Doorbell* bell = nullptr;  // the application's CQ has a channel
};
constexpr int kCqSlots = 256;
CqSlot g_cqs[kCqSlots];
// Shunt's completion channel per rail context (never freed), and the
// doorbells per application CQ. Under g_cq_mu.
std::vector<std::pair<const Rail*, ibv_comp_channel*>>* g_channels = nullptr;
std::vector<Doorbell*>* g_bells = nullptr;

// Connects qp to itself: INIT, RTR, RTS over the port and GID at.
bool loop_back(ibv_qp* qp, const LoopAddr& at, std::string* err) {
  ibv_gid gid;
  if (ibv_query_gid(qp->context, at.port, at.gid_index, &gid) != 0) {
    *err = "doorbell: cannot read the GID";
    return false;
  }
  ibv_qp_attr a{};
  a.qp_state = IBV_QPS_INIT;
  a.port_num = at.port;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
  if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    *err = std::string("doorbell to INIT: ") + strerror(errno);
    return false;
  }
  a = {};
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = qp->qp_num;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = gid;
  a.ah_attr.grh.sgid_index = static_cast<uint8_t>(at.gid_index);
  a.ah_attr.grh.hop_limit = 1;
  a.ah_attr.port_num = at.port;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *err = std::string("doorbell to RTR: ") + strerror(errno);
    return false;
  }
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 3;
  a.rnr_retry = 7;
  if (ibv_modify_qp(qp, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *err = std::string("doorbell to RTS: ") + strerror(errno);
    return false;
  }
  return true;
}

// The doorbell of an application CQ, made once. Under g_cq_mu.
Doorbell* doorbell_of(ibv_cq* app, const LoopAddr& at, std::string* err) {
  if (!g_bells) g_bells = new std::vector<Doorbell*>;
  for (Doorbell* d : *g_bells)
    if (d->app == app) return d;
  auto* d = new Doorbell;
  d->app = app;
  d->c = find_context(app->context);
  d->pd = ibv_alloc_pd(app->context);
  ibv_qp_init_attr ia{};
  ia.send_cq = ia.recv_cq = app;
  ia.qp_type = IBV_QPT_RC;
  ia.cap.max_send_wr = 64;
  ia.cap.max_recv_wr = 1;
  ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
  if (d->c && d->pd) d->qp = ibv_create_qp(d->pd, &ia);
  if (!d->qp || !loop_back(d->qp, at, err)) {
    if (err->empty()) *err = std::string("doorbell: ") + strerror(errno);
    if (d->qp) ibv_destroy_qp(d->qp);
    if (d->pd) ibv_dealloc_pd(d->pd);
    delete d;
    return nullptr;
  }
  if (QpRecord* r = track_qp(d->qp, false)) r->doorbell_pending = &d->pending;
  g_bells->push_back(d);
  return d;
}

// One ring per mirror event, even with one not polled yet: an application
// may take fewer completions per wake-up than are waiting (ibv_rc_pingpong
// polls two), and only a new event wakes it again.
void ring(Doorbell* d) {
  d->pending.store(true);
  ibv_send_wr w{}, *bad = nullptr;
  w.opcode = IBV_WR_RDMA_WRITE;  // zero bytes: no rkey is checked
  w.send_flags = IBV_SEND_SIGNALED;
  if (d->c->orig.post_send(d->qp, &w, &bad) != 0)  // full: those outstanding wake it
    log::once(LogLevel::debug, "doorbell-full", "a doorbell's send queue is full");
}

// Shunt's channel on a rail's context. Under g_cq_mu.
ibv_comp_channel* channel_of(const Rail* r, std::string* err) {
  if (!g_channels) g_channels = new std::vector<std::pair<const Rail*, ibv_comp_channel*>>;
  for (auto& [x, ch] : *g_channels)
    if (x->ctx == r->ctx) return ch;
  ibv_comp_channel* ch = ibv_create_comp_channel(r->ctx);
  if (!ch) {
    *err = r->device + ": ibv_create_comp_channel: " + strerror(errno);
    return nullptr;
  }
  int fl = fcntl(ch->fd, F_GETFL);
  fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
  g_channels->emplace_back(r, ch);
  return ch;
}
std::atomic<int> g_cq_top{0};  // slots at and above are unused: the poll path looks below only
std::mutex g_cq_mu;

}  // namespace

ibv_context* open_device_named(const std::string& name) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  ibv_context* c = nullptr;
  for (int d = 0; list && d < n && !c; d++)
    if (name == ibv_get_device_name(list[d])) c = ibv_open_device(list[d]);
  if (list) ibv_free_device_list(list);
  return c;
}

bool gid_v4(const ibv_gid& g, std::string* ip) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  if (memcmp(g.raw, prefix, 12) != 0) return false;
  char s[INET_ADDRSTRLEN];
  inet_ntop(AF_INET, g.raw + 12, s, sizeof s);
  *ip = s;
  return true;
}

int gid_type_of(ibv_context* ctx, uint8_t port, int index) {
  ibv_gid_entry e{};
  if (ibv_query_gid_ex(ctx, port, static_cast<uint32_t>(index), &e, 0) != 0) return -1;
  return static_cast<int>(e.gid_type);
}

Rail* rail_toward(const std::string& ip, int gid_type, std::string* err) {
  std::string src;
  if (!source_for(ip, &src)) {
    *err = "no route to " + ip;
    return nullptr;
  }
  std::lock_guard g(g_rail_mu);
  for (Rail* r : scan(gid_type))
    if (r->ip == src) {
      if (open_rail(r)) return r;
      *err = r->device + ": cannot open it: " + strerror(errno);
      return nullptr;
    }
  *err = "no RDMA port with address " + src + " (the route to " + ip + ")";
  return nullptr;
}

std::vector<Rail*> other_rails(const std::string& device, int gid_type) {
  std::lock_guard g(g_rail_mu);
  std::vector<Rail*> out;
  for (Rail* r : scan(gid_type))
    if (r->device != device && open_rail(r)) out.push_back(r);
  return out;
}

void rails_on_reg_mr(ibv_mr* mr, void* addr, size_t len, uint64_t iova, int access) {
  if (!mr) return;
  std::unique_lock g(g_mr_mu);
  init_mr_maps();
  auto* m = new MrRec{mr, addr, len, iova, access, {}};
  (*g_by_lkey)[{mr->context, mr->lkey}] = m;
  (*g_by_mr)[mr] = m;
  for (const auto& p : *g_pds)
    if (p.app == mr->pd) mirror_mr(m, p.pd, p.r);
}

void rails_on_dereg_mr(ibv_mr* mr) {
  MrRec* m = nullptr;
  {
    std::unique_lock g(g_mr_mu);
    if (!g_by_mr) return;
    auto it = g_by_mr->find(mr);
    if (it == g_by_mr->end()) return;
    m = it->second;
    g_by_mr->erase(it);
    g_by_lkey->erase({mr->context, mr->lkey});
  }
  for (auto& [r, x] : m->m) ibv_dereg_mr(x);
  delete m;
}

void rails_on_dealloc_pd(ibv_pd* pd) {
  std::vector<ibv_pd*> gone;
  {
    std::unique_lock g(g_mr_mu);
    if (!g_pds) return;
    for (auto it = g_pds->begin(); it != g_pds->end();) {
      if (it->app != pd) {
        ++it;
        continue;
      }
      gone.push_back(it->pd);
      it = g_pds->erase(it);
    }
  }
  for (ibv_pd* p : gone)
    if (ibv_dealloc_pd(p) != 0)
      log::warn("a mirror PD could not be freed ({}): the application freed its PD with MRs or QPs left",
                strerror(errno));
}

void rails_on_destroy_cq(ibv_cq* cq) {
  std::lock_guard g(g_cq_mu);
  for (auto& s : g_cqs) {
    if (s.app.load() != cq) continue;
    s.app.store(nullptr);
    g_mirror_cqs.fetch_sub(1);
    if (ibv_destroy_cq(s.cq) != 0)
      log::warn("{}: a mirror CQ could not be destroyed ({})", s.r->device, strerror(errno));
    s.cq = nullptr;
    s.bell = nullptr;
  }
  if (!g_bells) return;
  for (auto it = g_bells->begin(); it != g_bells->end(); ++it) {
    Doorbell* d = *it;
    if (d->app != cq) continue;
    untrack_qp(d->qp);
    ibv_destroy_qp(d->qp);
    ibv_dealloc_pd(d->pd);
    g_bells->erase(it);
    delete d;
    break;
  }
}

bool ring_doorbell(ibv_cq* app) {
  std::lock_guard g(g_cq_mu);
  if (g_bells)
    for (Doorbell* d : *g_bells)
      if (d->app == app) {
        ring(d);
        return true;
      }
  return false;
}

std::vector<int> rail_channel_fds() {
  std::lock_guard g(g_cq_mu);
  std::vector<int> out;
  if (g_channels)
    for (auto& [r, ch] : *g_channels) out.push_back(ch->fd);
  return out;
}

void rail_channel_ready(int fd) {
  ibv_comp_channel* ch = nullptr;
  {
    std::lock_guard g(g_cq_mu);
    if (g_channels)
      for (auto& [r, c] : *g_channels)
        if (c->fd == fd) ch = c;
  }
  if (!ch) return;
  ibv_cq* cq;
  void* cctx;
  // Each event acked and its CQ armed again before the doorbell rings: the
  // application's poll after the doorbell sees every completion made before
  // the arm, and one made after it raises a new event. (Acked before taking
  // g_cq_mu: a destroy under it waits for its CQ's events to be acked.)
  while (ibv_get_cq_event(ch, &cq, &cctx) == 0) {
    ibv_ack_cq_events(cq, 1);
    std::lock_guard g(g_cq_mu);
    for (auto& s : g_cqs) {
      if (s.cq != cq || !s.app.load() || !s.bell) continue;
      ibv_req_notify_cq(cq, 0);
      if (g_rail_expect.load() <= 0) g_rail_expect.store(1);  // the woken poll looks at the mirrors
      ring(s.bell);
    }
  }
}

ibv_pd* mirror_pd(ibv_pd* app, const Rail* r, std::string* err) {
  std::unique_lock g(g_mr_mu);
  init_mr_maps();
  for (const auto& p : *g_pds)
    if (p.app == app && p.r == r) return p.pd;
  ibv_pd* pd = ibv_alloc_pd(r->ctx);
  if (!pd) {
    *err = r->device + ": ibv_alloc_pd: " + strerror(errno);
    return nullptr;
  }
  g_pds->push_back({app, r, pd});
  for (auto& [mr, m] : *g_by_mr)
    if (mr->pd == app) mirror_mr(m, pd, r);
  return pd;
}

ibv_cq* mirror_cq(ibv_cq* app, const Rail* r, const LoopAddr& at, std::string* err) {
  std::lock_guard g(g_cq_mu);
  for (auto& s : g_cqs)
    if (s.app.load() == app && s.r == r) return s.cq;
  Doorbell* bell = nullptr;
  ibv_comp_channel* ch = nullptr;
  if (app->channel && (!(bell = doorbell_of(app, at, err)) || !(ch = channel_of(r, err)))) return nullptr;
  CqSlot* free = nullptr;
  for (auto& s : g_cqs)
    if (!s.app.load() && !s.cq) {
      free = &s;
      break;
    }
  if (!free) {
    *err = "more than 256 mirror CQs";
    return nullptr;
  }
  ibv_device_attr da{};
  int depth = std::max(app->cqe * 2, 1024);
  if (ibv_query_device(r->ctx, &da) == 0 && da.max_cqe > 0) depth = std::min(depth, da.max_cqe);
  ibv_cq* cq = ibv_create_cq(r->ctx, depth, nullptr, ch, 0);
  if (!cq) {
    *err = r->device + ": ibv_create_cq: " + strerror(errno);
    return nullptr;
  }
  if (ch) ibv_req_notify_cq(cq, 0);
  free->cq = cq;
  free->bell = bell;
  free->rec = r->rec;
  free->r = r;
  free->app.store(app);
  g_mirror_cqs.fetch_add(1);
  int idx = static_cast<int>(free - g_cqs);
  if (idx >= g_cq_top.load()) g_cq_top.store(idx + 1);
  return cq;
}

bool mirror_lkey(const ibv_context* app_ctx, uint32_t lkey, const Rail* r, uint32_t* out) {
  std::shared_lock g(g_mr_mu);
  if (!g_by_lkey) return false;
  auto it = g_by_lkey->find({app_ctx, lkey});
  if (it == g_by_lkey->end()) return false;
  for (auto& [rr, x] : it->second->m)
    if (rr == r) {
      *out = x->lkey;
      return true;
    }
  return false;
}

std::vector<std::pair<uint32_t, uint32_t>> rkey_map(ibv_pd* app, const Rail* r, size_t max) {
  std::vector<std::pair<uint32_t, uint32_t>> out;
  std::shared_lock g(g_mr_mu);
  if (!g_by_mr) return out;
  for (auto& [mr, m] : *g_by_mr) {
    if (mr->pd != app) continue;
    for (auto& [rr, x] : m->m)
      if (rr == r && out.size() < max) out.emplace_back(mr->rkey, x->rkey);
  }
  return out;
}

int poll_mirrors(ibv_cq* cq, int n, ibv_wc* wc) {
  int k = 0;
  const int top = g_cq_top.load(std::memory_order_acquire);
  for (int i = 0; i < top && k < n; i++) {
    CqSlot& s = g_cqs[i];
    if (s.app.load(std::memory_order_acquire) != cq) continue;
    int got = s.rec->orig.poll_cq(s.cq, n - k, wc + k);
    if (got > 0) {
      rail_expect(-got);
      k += bundle_filter(s.rec, wc + k, got);
    } else if (got == 0 && g_rail_expect.load(std::memory_order_relaxed) < 0) {
      g_rail_expect.store(0, std::memory_order_relaxed);  // flushes of unsignaled WRs counted down past 0
    }
  }
  return k;
}

}  // namespace shunt::verbs
