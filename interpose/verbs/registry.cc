#include "interpose/verbs/registry.h"

#include <cstring>
#include <deque>
#include <mutex>
#include <vector>

#include "core/log.h"
#include "core/runtime.h"
#include "interpose/verbs/table.h"

namespace shunt::verbs {

namespace {
ContextRecord g_contexts[kMaxContexts];
std::mutex g_mu;  // control path: context slots, record list
std::deque<QpRecord>* g_records = nullptr;  // stable addresses, never shrinks
PtrTable<QpRecord> g_by_ptr;
PtrTable<QpRecord> g_by_num;
PtrTable<QpRecord> g_retired;  // numbers of shunt's destroyed QPs
constexpr size_t kMaxRecords = 1 << 16;

struct ForkSafety {  // the child must not inherit g_mu held by another thread
  ForkSafety() {
    on_fork([] { g_mu.lock(); }, [] { g_mu.unlock(); }, [] { g_mu.unlock(); });
  }
} g_fork_safety;

uint64_t num_key(const ContextRecord* c, uint32_t qpn) {
  return (static_cast<uint64_t>(c->slot) << 32) | qpn;
}

// What a bundle needs of the QP as created (ibv_qp_init_attr or _ex).
template <class Attr>
void note_attr(QpRecord* r, const Attr* attr) {
  if (!r) return;
  r->sq_sig_all = attr->sq_sig_all != 0;
  r->max_send_wr = attr->cap.max_send_wr;
}

ibv_qp* create_qp_ex_hook(ibv_context* ctx, ibv_qp_init_attr_ex* attr) {
  ContextRecord* c = find_context(ctx);
  ibv_qp* qp = c->orig_create_qp_ex(ctx, attr);
  if (qp) {
    log::once(LogLevel::info, "create_qp_ex",
              "ibv_create_qp_ex: extended QPs are counted for ibv_post_send but their ibv_wr_* "
              "calls pass through uncounted and get no multipath");
    note_attr(track_qp(qp, true), attr);
  }
  return qp;
}

ibv_cq_ex* create_cq_ex_hook(ibv_context* ctx, ibv_cq_init_attr_ex* attr) {
  ContextRecord* c = find_context(ctx);
  log::once(LogLevel::info, "create_cq_ex",
            "ibv_create_cq_ex: ibv_start_poll/ibv_next_poll pass through uncounted; ibv_poll_cq on "
            "such a CQ is counted");
  return c->orig_create_cq_ex(ctx, attr);
}
}  // namespace

ContextRecord* find_context(const ibv_context* ctx) {
  static thread_local ContextRecord* last = nullptr;
  ContextRecord* l = last;
  if (l && l->ctx.load(std::memory_order_acquire) == ctx) return l;
  for (auto& c : g_contexts)
    if (c.ctx.load(std::memory_order_acquire) == ctx) {
      last = &c;
      return &c;
    }
  return nullptr;
}

bool patch_context(ibv_context* ctx, const char* device) {
  std::lock_guard lk(g_mu);
  for (int i = 0; i < kMaxContexts; i++) {
    ContextRecord& c = g_contexts[i];
    if (c.ctx.load(std::memory_order_relaxed)) continue;
    c.slot = i + 1;
    c.orig = ctx->ops;
    snprintf(c.device, sizeof c.device, "%s", device ? device : "?");
    c.orig_create_qp_ex = nullptr;
    c.orig_create_cq_ex = nullptr;
    c.ctx.store(ctx, std::memory_order_release);
    ctx->ops.post_send = verbs::post_send;
    ctx->ops.post_recv = verbs::post_recv;
    ctx->ops.poll_cq = verbs::poll_cq;
    ctx->ops.req_notify_cq = verbs::req_notify_cq;
    ctx->ops.post_srq_recv = verbs::post_srq_recv;
    if (ctx->abi_compat == __VERBS_ABI_IS_EXTENDED) {
      verbs_context* v = verbs_get_ctx(ctx);
      if (v && v->sz >= sizeof(*v)) {
        c.orig_create_qp_ex = v->create_qp_ex;
        c.orig_create_cq_ex = v->create_cq_ex;
        if (v->create_qp_ex) v->create_qp_ex = create_qp_ex_hook;
        if (v->create_cq_ex) v->create_cq_ex = create_cq_ex_hook;
      }
    }
    return true;
  }
  log::once(LogLevel::warn, "ctx-full", "more than 64 open verbs contexts: later ones pass through");
  return false;
}

void unpatch_context(ibv_context* ctx) {
  std::lock_guard lk(g_mu);
  for (auto& c : g_contexts) {
    if (c.ctx.load(std::memory_order_relaxed) != ctx) continue;
    ctx->ops.post_send = c.orig.post_send;
    ctx->ops.post_recv = c.orig.post_recv;
    ctx->ops.poll_cq = c.orig.poll_cq;
    ctx->ops.req_notify_cq = c.orig.req_notify_cq;
    ctx->ops.post_srq_recv = c.orig.post_srq_recv;
    if (ctx->abi_compat == __VERBS_ABI_IS_EXTENDED) {
      verbs_context* v = verbs_get_ctx(ctx);
      if (v && v->sz >= sizeof(*v)) {
        if (c.orig_create_qp_ex) v->create_qp_ex = c.orig_create_qp_ex;
        if (c.orig_create_cq_ex) v->create_cq_ex = c.orig_create_cq_ex;
      }
    }
    c.ctx.store(nullptr, std::memory_order_release);
    return;
  }
}

void on_open(ibv_context* ctx, const char* device) {
  if (!ctx || current_mode() == Mode::off) return;
  if (patch_context(ctx, device)) log::debug("{}: context patched", device);
}

void on_create_qp(ibv_qp* qp, bool extended, const ibv_qp_init_attr* attr) {
  if (!qp || current_mode() == Mode::off) return;
  QpRecord* r = track_qp(qp, extended);
  if (attr) note_attr(r, attr);
}

QpRecord* track_qp(ibv_qp* qp, bool extended) {
  ContextRecord* c = find_context(qp->context);
  if (!c) return nullptr;
  QpRecord* r;
  {
    std::lock_guard lk(g_mu);
    if (!g_records) g_records = new std::deque<QpRecord>;
    if (g_records->size() >= kMaxRecords) {
      log::once(LogLevel::warn, "qp-full", "more than 65536 QPs: later ones are counted per device");
      return nullptr;
    }
    r = &g_records->emplace_back();
  }
  r->qp = qp;
  r->qpn = qp->qp_num;
  r->type = qp->qp_type;
  r->ctx = c;
  r->extended = extended;
  memcpy(r->device, c->device, sizeof r->device);
  if (g_retired_any.load(std::memory_order_relaxed)) g_retired.erase(num_key(c, r->qpn));  // the number is taken again
  if (!g_by_ptr.insert(reinterpret_cast<uint64_t>(qp), r) || !g_by_num.insert(num_key(c, r->qpn), r)) {
    g_by_ptr.erase(reinterpret_cast<uint64_t>(qp));
    r->destroyed.store(true);
    return nullptr;
  }
  return r;
}

namespace {
std::atomic<uint64_t> g_qp_gen{0};
}
uint64_t qp_generation() { return g_qp_gen.load(std::memory_order_acquire); }

void untrack_qp(ibv_qp* qp) {
  QpRecord* r = find_qp(qp);
  if (!r) return;
  g_qp_gen.fetch_add(1, std::memory_order_acq_rel);
  g_by_ptr.erase(reinterpret_cast<uint64_t>(qp));
  g_by_num.erase(num_key(r->ctx, r->qpn));
  r->destroyed.store(true);
}

std::atomic<bool> g_retired_any{false};

void retire_qp(ibv_qp* qp) {
  QpRecord* r = find_qp(qp);
  if (r && g_retired.insert(num_key(r->ctx, r->qpn), r)) g_retired_any.store(true);
  untrack_qp(qp);
}

bool is_retired(const ContextRecord* c, uint32_t qpn) { return g_retired.find(num_key(c, qpn)) != nullptr; }

void retrack_qp(ibv_qp* qp) {
  std::lock_guard lk(g_mu);
  if (!g_records) return;
  for (auto it = g_records->rbegin(); it != g_records->rend(); ++it)
    if (it->qp == qp && it->destroyed.load()) {
      it->destroyed.store(false);
      g_by_ptr.insert(reinterpret_cast<uint64_t>(qp), &*it);
      g_by_num.insert(num_key(it->ctx, it->qpn), &*it);
      return;
    }
}

QpRecord* find_qp(const ibv_qp* qp) { return g_by_ptr.find(reinterpret_cast<uint64_t>(qp)); }
QpRecord* find_qp_by_num(const ContextRecord* c, uint32_t qpn) { return g_by_num.find(num_key(c, qpn)); }

void for_each_qp(const std::function<void(const QpRecord&)>& fn) {
  // fn runs without g_mu (records are never freed): it may take locks that
  // are held by code that tracks QPs (a bundle's, while it adds shadows).
  std::vector<const QpRecord*> all;
  {
    std::lock_guard lk(g_mu);
    if (g_records)
      for (auto& r : *g_records) all.push_back(&r);
  }
  for (const QpRecord* r : all) fn(*r);
}

void for_each_context(const std::function<void(const ContextRecord&)>& fn) {
  std::lock_guard lk(g_mu);
  for (auto& c : g_contexts)
    if (c.slot) fn(c);
}

const char* wr_opcode_name(int op) {
  switch (op) {
    case IBV_WR_RDMA_WRITE: return "RDMA_WRITE";
    case IBV_WR_RDMA_WRITE_WITH_IMM: return "RDMA_WRITE_WITH_IMM";
    case IBV_WR_SEND: return "SEND";
    case IBV_WR_SEND_WITH_IMM: return "SEND_WITH_IMM";
    case IBV_WR_RDMA_READ: return "RDMA_READ";
    case IBV_WR_ATOMIC_CMP_AND_SWP: return "ATOMIC_CMP_AND_SWP";
    case IBV_WR_ATOMIC_FETCH_AND_ADD: return "ATOMIC_FETCH_AND_ADD";
    case IBV_WR_LOCAL_INV: return "LOCAL_INV";
    case IBV_WR_BIND_MW: return "BIND_MW";
    case IBV_WR_SEND_WITH_INV: return "SEND_WITH_INV";
    case IBV_WR_TSO: return "TSO";
    case IBV_WR_DRIVER1: return "DRIVER1";
    default: return "OTHER";
  }
}

}  // namespace shunt::verbs

namespace shunt::verbs {
namespace {
std::atomic<uint64_t> g_calls[static_cast<int>(Call::count_)];
constexpr const char* kCallNames[] = {
#define SHUNT_X(n) #n,
    SHUNT_VERBS_CALLS(SHUNT_X)
#undef SHUNT_X
};
}  // namespace
void count_call(Call c) { add(g_calls[static_cast<int>(c)], 1); }
uint64_t call_count(Call c) { return get(g_calls[static_cast<int>(c)]); }
const char* call_name(Call c) { return kCallNames[static_cast<int>(c)]; }
}  // namespace shunt::verbs
