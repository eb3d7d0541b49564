// Cost of one WR (and one completion) through the ops table, as the inline
// ibv_post_send/ibv_poll_cq of verbs.h make it, into a trivial provider:
// unpatched, with shunt in off mode (the context goes through shunt's open
// path and stays unpatched) and in observe mode (patched, counted).
#include <benchmark/benchmark.h>
#include <infiniband/verbs.h>

#include <memory>

#include "agent/agent.h"
#include "core/runtime.h"
#include "interpose/stats_sources.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/bundle/testing/hooks.h"
#include "interpose/verbs/registry.h"
#include "telemetry/stats_file.h"

namespace {
__attribute__((noinline)) int provider_post_send(ibv_qp*, ibv_send_wr* wr, ibv_send_wr**) {
  benchmark::DoNotOptimize(wr);
  return 0;
}
__attribute__((noinline)) int provider_poll_cq(ibv_cq*, int n, ibv_wc* wc) {
  wc[0].qp_num = 77;
  wc[0].status = IBV_WC_SUCCESS;
  wc[0].opcode = IBV_WC_RDMA_WRITE;
  benchmark::DoNotOptimize(wc);
  return n > 0 ? 1 : 0;
}

struct Device {
  verbs_context vctx{};
  ibv_qp qp{};
  ibv_cq cq{};
  explicit Device(shunt::Mode mode) {
    vctx.sz = sizeof vctx;
    ibv_context* ctx = &vctx.context;
    ctx->abi_compat = __VERBS_ABI_IS_EXTENDED;
    ctx->ops.post_send = provider_post_send;
    ctx->ops.poll_cq = provider_poll_cq;
    qp.context = ctx;
    qp.qp_num = 77;
    qp.qp_type = IBV_QPT_RC;
    cq.context = ctx;
    // What ibv_open_device/ibv_create_qp do under the preload.
    shunt::g_mode.store(static_cast<int>(mode));
    shunt::verbs::on_open(ctx, "bench0");
    shunt::agent::ensure_started();
    shunt::verbs::on_create_qp(&qp, false);
  }
  ~Device() {
    shunt::verbs::untrack_qp(&qp);
    shunt::verbs::unpatch_context(&vctx.context);
  }
};

// Posts one 4 KiB WR of `op` per iteration on the application's QP.
void post_loop(benchmark::State& st, Device& d, ibv_wr_opcode op) {
  ibv_sge sge{0x1000, 4096, 1};
  ibv_send_wr wr{};
  wr.opcode = op;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  for (auto _ : st) benchmark::DoNotOptimize(ibv_post_send(&d.qp, &wr, &bad));
}

void post_send(benchmark::State& st, shunt::Mode mode, bool bypass) {
  auto d = std::make_unique<Device>(mode);
  if (bypass) shunt::verbs::unpatch_context(&d->vctx.context);
  post_loop(st, *d, IBV_WR_RDMA_WRITE_WITH_IMM);
}

__attribute__((noinline)) int shadow_poll_cq(ibv_cq*, int n, ibv_wc* wc) {
  wc[0] = {};
  wc[0].qp_num = 78;
  wc[0].status = IBV_WC_SUCCESS;
  wc[0].opcode = IBV_WC_RDMA_WRITE;
  benchmark::DoNotOptimize(wc);
  return n > 0 ? 1 : 0;
}

// Active mode with a bundle: the WRITE goes to a shadow QP (one path, the
// steady state of a busy QP between drain points). Shunt keeps a copy of
// every WR until a completion proves it done, so the loop is a realistic
// one: every 64th WR is signaled and its completion polled, and that poll
// (with shunt's bookkeeping of the shadow) is part of the per-WR cost.
void post_send_bundle(benchmark::State& st) {
  auto d = std::make_unique<Device>(shunt::Mode::active);
  ibv_qp shadow{};
  shadow.context = &d->vctx.context;
  shadow.qp_num = 78;
  shadow.qp_type = IBV_QPT_RC;
  d->qp.send_cq = d->qp.recv_cq = &d->cq;
  shunt::verbs::bundle_attach_for_test(shunt::verbs::find_qp(&d->qp), {&shadow});
  shunt::verbs::find_context(&d->vctx.context)->orig.poll_cq = shadow_poll_cq;
  ibv_sge sge{0x1000, 4096, 1};
  ibv_send_wr wr{};
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_send_wr* bad = nullptr;
  ibv_wc wc[4];
  unsigned i = 0;
  for (auto _ : st) {
    bool last = (++i & 63) == 0;
    wr.send_flags = last ? IBV_SEND_SIGNALED : 0;
    benchmark::DoNotOptimize(ibv_post_send(&d->qp, &wr, &bad));
    if (last) benchmark::DoNotOptimize(ibv_poll_cq(&d->cq, 4, wc));
  }
  shunt::verbs::bundle_detach_for_test(shunt::verbs::find_qp(&d->qp));
}

void poll_cq(benchmark::State& st, shunt::Mode mode, bool bypass) {
  auto d = std::make_unique<Device>(mode);
  if (bypass) shunt::verbs::unpatch_context(&d->vctx.context);
  ibv_wc wc[4];
  for (auto _ : st) benchmark::DoNotOptimize(ibv_poll_cq(&d->cq, 4, wc));
}

// One process snapshot (stats_json), what every preloaded process builds
// once per SHUNT_REPORT_INTERVAL_MS for the host agent: three bundles (a
// 4-rank all-to-all's peers) of 16 shadows each (8 per rail, 2 rails).
void snapshot(benchmark::State& st) {
  shunt::register_stats_sources();  // as libshunt.so's constructor does
  auto d = std::make_unique<Device>(shunt::Mode::active);
  constexpr int kPeers = 3, kShadows = 16;
  std::vector<ibv_qp> apps(kPeers), shadows(kPeers * kShadows);
  for (int i = 0; i < kPeers; i++) {
    apps[i] = d->qp;
    apps[i].qp_num = 100 + i;
    shunt::verbs::on_create_qp(&apps[i], false);
    std::vector<ibv_qp*> mine;
    for (int k = 0; k < kShadows; k++) {
      ibv_qp& s = shadows[i * kShadows + k];
      s = d->qp;
      s.qp_num = 1000 + i * kShadows + k;
      mine.push_back(&s);
    }
    shunt::verbs::bundle_attach_for_test(shunt::verbs::find_qp(&apps[i]), mine);
  }
  for (auto _ : st) benchmark::DoNotOptimize(shunt::telemetry::stats_json());
  for (auto& a : apps) {
    shunt::verbs::bundle_detach_for_test(shunt::verbs::find_qp(&a));
    shunt::verbs::untrack_qp(&a);
  }
}
}  // namespace

BENCHMARK(snapshot)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(post_send, unpatched, shunt::Mode::observe, true);
BENCHMARK_CAPTURE(post_send, off, shunt::Mode::off, false);
BENCHMARK_CAPTURE(post_send, observe, shunt::Mode::observe, false);
BENCHMARK(post_send_bundle)->Name("post_send/active_bundle");
BENCHMARK_CAPTURE(poll_cq, unpatched, shunt::Mode::observe, true);
BENCHMARK_CAPTURE(poll_cq, off, shunt::Mode::off, false);
BENCHMARK_CAPTURE(poll_cq, observe, shunt::Mode::observe, false);
BENCHMARK_MAIN();
