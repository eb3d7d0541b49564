// What shunt knows of the application's verbs objects: one record per
// opened context (with the provider's original ops, restored at close) and
// one per QP. Lookups from the hot path are lock-free; records are never
// freed while the process runs, so a pointer taken on the hot path stays
// valid, and the exit-time stats include destroyed QPs.
#pragma once
#include <infiniband/verbs.h>

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "interpose/verbs/stats.h"
#include "telemetry/rhythm.h"

namespace shunt::verbs {

constexpr int kMaxContexts = 64;

struct ContextRecord {
  std::atomic<ibv_context*> ctx{nullptr};
  int slot = 0;  // 1-based, part of the qpn key
  ibv_context_ops orig{};
  // Extended-verbs entries, patched only to notice and track them.
  ibv_qp* (*orig_create_qp_ex)(ibv_context*, ibv_qp_init_attr_ex*) = nullptr;
  ibv_cq_ex* (*orig_create_cq_ex)(ibv_context*, ibv_cq_init_attr_ex*) = nullptr;
  char device[64] = {};
  QpStats untracked;  // WRs on QPs created behind shunt's back
  std::atomic<uint64_t> srq_recv_wrs{0};
  std::atomic<uint64_t> notify_calls{0};
  std::atomic<uint64_t> async_events{0};
};

struct Bundle;  // bundle.h

struct QpRecord {
  ibv_qp* qp = nullptr;
  uint32_t qpn = 0;
  ibv_qp_type type = IBV_QPT_RC;
  ContextRecord* ctx = nullptr;
  char device[64] = {};
  bool extended = false;        // created with ibv_create_qp_ex
  std::atomic<bool> destroyed{false};
  std::atomic<int> state{IBV_QPS_RESET};
  bool sq_sig_all = false;
  uint32_t max_send_wr = 0;  // as created; 0: not known
  // An application QP: its bundle, once shunt set out to build one.
  std::atomic<Bundle*> bundle{nullptr};
  // A shadow QP of a bundle (shunt's own): the bundle and the path index.
  Bundle* shadow_of = nullptr;
  int path = -1;
  // Shunt's doorbell QP on an application CQ (rails.h): its completions
  // only wake the application; this flag clears as one is polled.
  std::atomic<bool>* doorbell_pending = nullptr;
  uint32_t primary_qpn = 0;
  QpStats s;
  // The two ends' addresses (IPv4 or IPv6 text, from the GIDs of the
  // address vector at RTR; "" until then, or where not an IP GID), and the
  // milliseconds a signaled send WR was outstanding (busy.h).
  char local_addr[46] = {};
  char peer_addr[46] = {};
  mutable std::atomic<uint64_t> busy_ms{0};  // written by the sampler alone
  // Ends of the process's communication (busy.h: step_ends) at which this
  // QP was among the last with work: how often it held up a step. The sampler's.
  mutable std::atomic<uint64_t> last_steps{0};
  // How long each stretch of work out on it lasted: counts per bound of
  // telemetry::kTransferBucketsMs and one over them all, and their sum. The sampler's.
  mutable std::array<std::atomic<uint64_t>, telemetry::kTransferBucketsMs.size() + 1> transfers{};
  mutable std::atomic<uint64_t> transfer_ms{0};
};

// Patches ctx->ops (post_send, post_recv, poll_cq, req_notify_cq,
// post_srq_recv) and, for an extended context, create_qp_ex/create_cq_ex.
// Returns false (and leaves ctx untouched) when the table is full.
bool patch_context(ibv_context* ctx, const char* device);
// Restores the provider's ops; a no-op for a context shunt did not patch.
void unpatch_context(ibv_context* ctx);
ContextRecord* find_context(const ibv_context* ctx);

// What the exported ibv_open_device/ibv_import_device and ibv_create_qp do
// after the real call: act according to the mode in force (off: nothing).
// (After on_open the exported call starts the agent: agent::ensure_started.)
void on_open(ibv_context* ctx, const char* device);
void on_create_qp(ibv_qp* qp, bool extended, const ibv_qp_init_attr* attr = nullptr);

QpRecord* track_qp(ibv_qp* qp, bool extended);
void untrack_qp(ibv_qp* qp);      // before the real destroy
// Shunt's own QP (a shadow) before its real destroy: untracked, and its
// number remembered, because a provider that leaves a destroyed QP's
// completions in a shared CQ (rxe does; mlx5 cleans them out) would hand
// them to the application, whose wr_id they do not carry. Remembered until
// a new QP takes the number.
void retire_qp(ibv_qp* qp);
bool is_retired(const ContextRecord* c, uint32_t qpn);
// True once a QP was retired: the poll path then filters every batch.
extern std::atomic<bool> g_retired_any;
void retrack_qp(ibv_qp* qp);      // the real destroy failed
QpRecord* find_qp(const ibv_qp* qp);
// Moves on every QP destroy; lets the hot path cache lookups safely.
uint64_t qp_generation();
QpRecord* find_qp_by_num(const ContextRecord* c, uint32_t qpn);

// Visits every QP record ever made (live and destroyed); fn runs without
// the registry lock held.
void for_each_qp(const std::function<void(const QpRecord&)>& fn);
void for_each_context(const std::function<void(const ContextRecord&)>& fn);

// The patched entry points, exposed for the unit tests and microbenchmark.
int post_send(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int post_recv(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);
int poll_cq(ibv_cq* cq, int n, ibv_wc* wc);
// Polls cq until it is empty on behalf of shunt (a failover that cannot
// wait for the application to poll), with the application's own polls held
// off meanwhile; what the application must still see goes to keep().
void drain_cq(ContextRecord* c, ibv_cq* cq, const std::function<void(const ibv_wc&)>& keep);
int req_notify_cq(ibv_cq* cq, int solicited_only);
int post_srq_recv(ibv_srq* srq, ibv_recv_wr* wr, ibv_recv_wr** bad);

}  // namespace shunt::verbs

namespace shunt::verbs {
// Calls of each exported verbs entry point seen by shunt (observe or active).
#define SHUNT_VERBS_CALLS(X)                                                                  \
  X(ibv_get_device_list) X(ibv_open_device) X(ibv_import_device) X(ibv_close_device)          \
  X(ibv_alloc_pd) X(ibv_dealloc_pd) X(ibv_reg_mr) X(ibv_reg_mr_iova) X(ibv_reg_mr_iova2)      \
  X(ibv_reg_dmabuf_mr) X(ibv_dereg_mr) X(ibv_create_cq) X(ibv_destroy_cq) X(ibv_create_qp)    \
  X(ibv_modify_qp) X(ibv_destroy_qp) X(ibv_create_srq) X(ibv_destroy_srq) X(ibv_get_async_event)
enum class Call {
#define SHUNT_X(n) n,
  SHUNT_VERBS_CALLS(SHUNT_X)
#undef SHUNT_X
  count_
};
void count_call(Call c);
uint64_t call_count(Call c);
const char* call_name(Call c);
}  // namespace shunt::verbs
