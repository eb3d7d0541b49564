// Exported verbs entry points. Each behaves exactly like the real call (same
// return, same errno); shunt's own work happens around it and only when the
// mode is not off. The inline hot path is reached through ctx->ops, patched
// in ibv_open_device/ibv_import_device before the context is returned.
#include <errno.h>
#include <infiniband/verbs.h>

#include "agent/agent.h"
#include "core/log.h"
#include "core/runtime.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/busy.h"
#include "interpose/verbs/rails.h"
#include "interpose/verbs/registry.h"

using namespace shunt;
using verbs::Call;

namespace {
constexpr const char* kLib = "libibverbs.so.1";

#define SHUNT_REAL(fn, ver) SHUNT_REAL_IN(kLib, fn, ver)

// Initializes if needed; true when shunt should act on this call.
inline bool acting() {
  ensure_init();
  return current_mode() != Mode::off && !in_shunt();
}

// An MR the application registered: a bundle's paths on other NICs need
// its mirror there (active mode only).
ibv_mr* noted_mr(ibv_mr* mr, void* addr, size_t len, uint64_t iova, int access) {
  if (mr && current_mode() == Mode::active) verbs::rails_on_reg_mr(mr, addr, len, iova, access);
  return mr;
}

void patch_opened(ibv_context* ctx) {
  if (!ctx) return;
  ReentryGuard g;
  verbs::on_open(ctx, ctx->device ? ibv_get_device_name(ctx->device) : "?");
  agent::ensure_started();
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) ibv_device** ibv_get_device_list(int* num) {
  if (acting()) verbs::count_call(Call::ibv_get_device_list);
  return SHUNT_REAL(ibv_get_device_list, "IBVERBS_1.1")(num);
}

__attribute__((visibility("default"))) void ibv_free_device_list(ibv_device** list) {
  SHUNT_REAL(ibv_free_device_list, "IBVERBS_1.1")(list);
}

__attribute__((visibility("default"))) ibv_context* ibv_open_device(ibv_device* dev) {
  bool act = acting();
  ibv_context* ctx = SHUNT_REAL(ibv_open_device, "IBVERBS_1.1")(dev);
  if (act) {
    verbs::count_call(Call::ibv_open_device);
    patch_opened(ctx);
  }
  return ctx;
}

__attribute__((visibility("default"))) ibv_context* ibv_import_device(int cmd_fd) {
  bool act = acting();
  ibv_context* ctx = SHUNT_REAL(ibv_import_device, "IBVERBS_1.10")(cmd_fd);
  if (act) {
    verbs::count_call(Call::ibv_import_device);
    patch_opened(ctx);
  }
  return ctx;
}

__attribute__((visibility("default"))) int ibv_close_device(ibv_context* ctx) {
  // Restore whatever was patched, even if the mode changed meanwhile: the
  // provider frees the context and its ops must be its own again.
  if (ctx && verbs::find_context(ctx)) {
    verbs::count_call(Call::ibv_close_device);
    verbs::unpatch_context(ctx);
  }
  return SHUNT_REAL(ibv_close_device, "IBVERBS_1.1")(ctx);
}

__attribute__((visibility("default"))) ibv_pd* ibv_alloc_pd(ibv_context* ctx) {
  if (acting()) verbs::count_call(Call::ibv_alloc_pd);
  return SHUNT_REAL(ibv_alloc_pd, "IBVERBS_1.1")(ctx);
}

__attribute__((visibility("default"))) int ibv_dealloc_pd(ibv_pd* pd) {
  if (acting()) {
    verbs::count_call(Call::ibv_dealloc_pd);
    ReentryGuard g;
    verbs::rails_on_dealloc_pd(pd);
  }
  return SHUNT_REAL(ibv_dealloc_pd, "IBVERBS_1.1")(pd);
}

// ibv_reg_mr and ibv_reg_mr_iova are also function-like macros in verbs.h;
// the parentheses keep them from expanding here.
__attribute__((visibility("default"))) ibv_mr*(ibv_reg_mr)(ibv_pd* pd, void* addr, size_t len, int access) {
  if (!acting()) return SHUNT_REAL(ibv_reg_mr, "IBVERBS_1.1")(pd, addr, len, access);
  verbs::count_call(Call::ibv_reg_mr);
  ReentryGuard g;  // the real call may go through ibv_reg_mr_iova2
  return noted_mr(SHUNT_REAL(ibv_reg_mr, "IBVERBS_1.1")(pd, addr, len, access), addr, len,
                  reinterpret_cast<uintptr_t>(addr), access);
}

__attribute__((visibility("default"))) ibv_mr*(ibv_reg_mr_iova)(ibv_pd* pd, void* addr, size_t len,
                                                                uint64_t iova, int access) {
  if (!acting()) return SHUNT_REAL(ibv_reg_mr_iova, "IBVERBS_1.7")(pd, addr, len, iova, access);
  verbs::count_call(Call::ibv_reg_mr_iova);
  ReentryGuard g;
  return noted_mr(SHUNT_REAL(ibv_reg_mr_iova, "IBVERBS_1.7")(pd, addr, len, iova, access), addr, len, iova, access);
}

__attribute__((visibility("default"))) ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t len,
                                                                uint64_t iova, unsigned int access) {
  if (!acting()) return SHUNT_REAL(ibv_reg_mr_iova2, "IBVERBS_1.8")(pd, addr, len, iova, access);
  verbs::count_call(Call::ibv_reg_mr_iova2);
  ReentryGuard g;
  return noted_mr(SHUNT_REAL(ibv_reg_mr_iova2, "IBVERBS_1.8")(pd, addr, len, iova, access), addr, len, iova,
                  static_cast<int>(access));
}

__attribute__((visibility("default"))) ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* pd, uint64_t offset, size_t len,
                                                                 uint64_t iova, int fd, int access) {
  if (acting()) verbs::count_call(Call::ibv_reg_dmabuf_mr);
  return SHUNT_REAL(ibv_reg_dmabuf_mr, "IBVERBS_1.12")(pd, offset, len, iova, fd, access);
}

__attribute__((visibility("default"))) int ibv_dereg_mr(ibv_mr* mr) {
  if (acting()) {
    verbs::count_call(Call::ibv_dereg_mr);
    ReentryGuard g;
    verbs::rails_on_dereg_mr(mr);
  }
  return SHUNT_REAL(ibv_dereg_mr, "IBVERBS_1.1")(mr);
}

__attribute__((visibility("default"))) ibv_cq* ibv_create_cq(ibv_context* ctx, int cqe, void* cq_ctx,
                                                             ibv_comp_channel* ch, int vec) {
  if (acting()) {
    verbs::count_call(Call::ibv_create_cq);
    ReentryGuard g;
    cqe = verbs::cq_depth_for(ctx, cqe);  // room for the shadows' completions
  }
  return SHUNT_REAL(ibv_create_cq, "IBVERBS_1.1")(ctx, cqe, cq_ctx, ch, vec);
}

__attribute__((visibility("default"))) int ibv_resize_cq(ibv_cq* cq, int cqe) {
  if (acting() && cq) {
    ReentryGuard g;
    cqe = verbs::cq_depth_for(cq->context, cqe);
  }
  return SHUNT_REAL(ibv_resize_cq, "IBVERBS_1.1")(cq, cqe);
}

__attribute__((visibility("default"))) int ibv_destroy_cq(ibv_cq* cq) {
  if (acting()) {
    verbs::count_call(Call::ibv_destroy_cq);
    ReentryGuard g;
    verbs::rails_on_destroy_cq(cq);
  }
  return SHUNT_REAL(ibv_destroy_cq, "IBVERBS_1.1")(cq);
}

__attribute__((visibility("default"))) ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attr) {
  bool act = acting();
  ibv_qp* qp = SHUNT_REAL(ibv_create_qp, "IBVERBS_1.1")(pd, attr);
  if (act) {
    verbs::count_call(Call::ibv_create_qp);
    ReentryGuard g;
    verbs::on_create_qp(qp, false, attr);
  }
  return qp;
}

__attribute__((visibility("default"))) int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attr, int mask) {
  bool act = acting();
  ibv_qp_attr labeled;
  bool relabel = false;
  if (act)
    if (verbs::QpRecord* r = verbs::find_qp(qp)) {
      ReentryGuard g;
      relabel = verbs::bundle_label_primary(r, attr, mask, &labeled);
    }
  int ret = SHUNT_REAL(ibv_modify_qp, "IBVERBS_1.1")(qp, relabel ? &labeled : attr, mask);
  if (relabel && ret != 0) {  // refused with shunt's label: the application's own attr, as without shunt
    verbs::bundle_unlabel_primary(verbs::find_qp(qp));
    ret = SHUNT_REAL(ibv_modify_qp, "IBVERBS_1.1")(qp, attr, mask);
  }
  if (act) {
    verbs::count_call(Call::ibv_modify_qp);
    if (ret == 0)
      if (verbs::QpRecord* r = verbs::find_qp(qp)) {
        if (mask & IBV_QP_STATE) r->state.store(attr->qp_state);
        ReentryGuard g;
        verbs::note_addresses(r, attr, mask);
        verbs::bundle_on_modify(r, attr, mask);
      }
  }
  return ret;
}

__attribute__((visibility("default"))) int ibv_destroy_qp(ibv_qp* qp) {
  bool act = acting();
  if (act) verbs::count_call(Call::ibv_destroy_qp);
  // Untracked first so a QP created at the same address right after the
  // real destroy never finds this record.
  if (verbs::QpRecord* r = verbs::find_qp(qp)) {
    ReentryGuard g;
    verbs::bundle_on_destroy(r);
  }
  verbs::untrack_qp(qp);
  int ret = SHUNT_REAL(ibv_destroy_qp, "IBVERBS_1.1")(qp);
  if (ret) {
    int e = errno;
    verbs::retrack_qp(qp);
    errno = e;
  }
  return ret;
}

__attribute__((visibility("default"))) ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attr) {
  if (acting()) verbs::count_call(Call::ibv_create_srq);
  return SHUNT_REAL(ibv_create_srq, "IBVERBS_1.1")(pd, attr);
}

__attribute__((visibility("default"))) int ibv_destroy_srq(ibv_srq* srq) {
  if (acting()) verbs::count_call(Call::ibv_destroy_srq);
  return SHUNT_REAL(ibv_destroy_srq, "IBVERBS_1.1")(srq);
}

__attribute__((visibility("default"))) int ibv_get_async_event(ibv_context* ctx, ibv_async_event* ev) {
  int ret = SHUNT_REAL(ibv_get_async_event, "IBVERBS_1.1")(ctx, ev);
  if (ret == 0 && acting()) {
    verbs::count_call(Call::ibv_get_async_event);
    if (verbs::ContextRecord* c = verbs::find_context(ctx)) {
      verbs::add(c->async_events, 1);
      ReentryGuard g;
      log::info("{}: async event {}", c->device, ibv_event_type_str(ev->event_type));
    }
  }
  return ret;
}

}  // extern "C"
