// Test hooks: hand-built bundles and single steps of the failover for the unit tests and the microbenchmark; linked into those only.
#include "interpose/verbs/bundle/testing/hooks.h"
#include "core/mono.h"
#include "interpose/verbs/bundle/parts.h"

#include <unistd.h>

namespace shunt::verbs {

using namespace bundle;

Bundle* bundle_attach_for_test(QpRecord* r, const std::vector<ibv_qp*>& shadows) {
  auto* b = new Bundle;
  b->no_worker = true;
  b->access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;  // (fences are WRITEs)
  b->primary = r;
  b->pqp = r->qp;
  b->ctx = r->ctx;
  for (size_t i = 0; i < shadows.size(); i++) {
    Path p;
    p.qp = shadows[i];
    p.qpn = shadows[i]->qp_num;
    p.pc = r->ctx;
    p.flow_label = flow_label_for(r->qpn, static_cast<int>(i));
    b->paths.push_back(std::move(p));
  }
  b->prim.flow_label = flow_label_for(r->qpn, -1);  // as bundle_label_primary gives it
  {
    std::lock_guard g(g_mu);
    if (!g_bundles) g_bundles = new std::vector<Bundle*>;
    g_bundles->push_back(b);
  }
  g_shadow_qps.fetch_add(1);
  b->tracking.store(true);
  std::lock_guard g(b->mu);
  track_shadows(b);
  r->bundle.store(b, std::memory_order_release);
  activate(b);
  std::lock_guard l(b->lk);
  b->flowlet = true;  // the spreading data path, whatever SHUNT_SPREAD says
  return b;
}

void bundle_spread_for_test(QpRecord* r, int spread, uint64_t split_min) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  b->flowlet = spread == 1;
  b->split = spread >= 2;
  b->spread_auto = spread == 3;
  b->split_min = split_min;
}

void bundle_router_for_test(QpRecord* r, int path, const std::string& router) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  P(b, path < 0 ? kPrimary : path).router = router;
}

std::vector<std::string> bundle_proven_routers_for_test(QpRecord* r, int rail, const std::vector<int>& skip) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  auto works = proven_routers(b, skip);
  return {works[rail].begin(), works[rail].end()};
}

void bundle_detach_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  if (!b) return;
  {
    std::lock_guard g(b->mu);
    std::lock_guard l(b->lk);
    b->dead = true;
    b->active.store(false);
    b->tracking.store(false);
    for (auto& p : b->paths) {  // as destroy_shadows leaves them
      if (p.rec) g_shadow_qps.fetch_sub(1);
      retire_qp(p.qp);
    }
    g_shadow_qps.fetch_sub(1);
    r->bundle.store(nullptr);
  }
  bool worker;
  {
    std::lock_guard w(b->wmu);
    worker = b->worker;
  }
  // The worker sees `dead` within one of its 50 ms waits; the test's QPs and
  // CQs must outlive its last drain.
  for (int i = 0; worker && i < 400 && !b->worker_exited.load(); i++) usleep(5000);
}

int bundle_check_stalls_for_test(QpRecord* r, int64_t now_ms, int64_t stall_ms, int64_t retx_ms) {
  Bundle* b = r->bundle.load();
  std::lock_guard m(b->mu);
  return check_stalls(b, now_ms, stall_ms, [=](int) { return retx_ms; });
}

int bundle_probes_for_test(QpRecord* r, const std::vector<std::pair<uint16_t, bool>>& alive, int64_t now_ms,
                           bool* spared) {
  ProbeStats st;
  for (auto [port, up] : alive) st[{0, port}] = json{{"port", port}, {"alive", up}};
  return fail_silent_paths(r->bundle.load(), st, now_ms < 0 ? mono_ms() : now_ms, spared);
}

bool bundle_renew_now_for_test(QpRecord* r) { return r->bundle.load()->renew_now.exchange(false); }

void bundle_back_in_service_for_test(QpRecord* r, int path) {
  Bundle* b = r->bundle.load();
  {
    std::lock_guard l(b->lk);
    b->paths[path].probe_alive = b->paths[path].probe_dead = false;  // as reset_half: its probes start over
  }
  back_in_service(b, path);
}

int bundle_port_event_for_test(const std::string& device, int port, bool up) {
  return on_port_event(device, port, up, false);
}

void bundle_start_worker_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  b->no_worker = false;
  start_worker(b);
}

size_t bundle_mail_for_test(QpRecord* r, uint64_t* dropped) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  *dropped = b->mail.dropped();
  return b->mail.size();
}

size_t bundle_report_mail_for_test(QpRecord* r) { return report_mail(r->bundle.load()); }

void bundle_probe_for_test(QpRecord* r, int path, bool worker) {
  Bundle* b = r->bundle.load();
  if (worker) b->no_worker = false;  // (before the worker exists) it is what polls the probe
  {
    std::lock_guard l(b->lk);
    probe(b, path);
  }
  if (worker) wake_worker(b);
}

void bundle_probe_all_for_test(QpRecord* r) { probe_all(r->bundle.load()); }

bool bundle_probation_for_test(QpRecord* r, int path) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  return b->paths[path].probation();
}

int bundle_carrier_for_test(QpRecord* r) {
  Bundle* b = r->bundle.load();
  std::lock_guard l(b->lk);
  return two_sided_waits(b->move) ? kWait : b->carrier;
}

bool bundle_move_sends_for_test(QpRecord* r, int to, uint64_t peer_consumed) {
  Bundle* b = r->bundle.load();
  int from;
  {
    std::lock_guard l(b->lk);
    from = b->carrier;
    b->move = next(b->move, MoveEvent::start);
    P(b, from).step(LifeEvent::fail);
  }
  json info;
  return move_sends(b, from, to, peer_consumed, &info);
}

}  // namespace shunt::verbs
