// Exported librdmacm entry points: the connection manager's teardown over a
// dead route. rdma_disconnect sends a DREQ on the application's NIC and the
// DISCONNECTED event comes when the peer answers, or when the kernel's CM
// gives up after its retries (about a minute on RoCE). A job whose NIC's
// route died for good, and whose traffic shunt moved to another rail, would
// wait that out at its very end (perftest -R did, past its time limit).
// When the application's QP has failed and no path on its NIC works,
// shunt gives the DISCONNECTED event at once, from rdma_get_cm_event on that
// id's channel: the QP is in the error state by then, so the connection is
// down locally whatever the peer hears. The real DREQ still goes; a late real
// event for an id the application has destroyed is dropped by the kernel.
// With the NIC itself gone, the real call fails (ENXIO): then too the
// disconnect succeeds and the event is given. Limits: only for an
// application that waits in rdma_get_cm_event (one that polls the
// channel's fd first sees nothing ready).
#include <errno.h>
#include <rdma/rdma_cma.h>

#include <deque>
#include <map>
#include <mutex>
#include <set>

#include "core/event_log.h"
#include "core/log.h"
#include "core/runtime.h"
#include "interpose/verbs/bundle.h"
#include "interpose/verbs/registry.h"

using namespace shunt;

namespace {
constexpr const char* kLib = "librdmacm.so.1";

#define SHUNT_REAL(fn, ver) SHUNT_REAL_IN(kLib, fn, ver)

std::mutex g_mu;
// Built on first use and never destroyed: another thread of the application
// may still give or take an event while exit() runs the static destructors.
std::map<rdma_event_channel*, std::deque<rdma_cm_event*>>& ready_events() {  // given by shunt, not yet returned
  static auto* m = new std::map<rdma_event_channel*, std::deque<rdma_cm_event*>>;
  return *m;
}
std::set<rdma_cm_event*>& given_events() {  // given by shunt, not yet acked
  static auto* s = new std::set<rdma_cm_event*>;
  return *s;
}
}  // namespace

extern "C" {

__attribute__((visibility("default"))) int rdma_disconnect(rdma_cm_id* id) {
  ensure_init();
  bool give = false;
  if (current_mode() == Mode::active && !in_shunt() && id && id->qp && id->channel) {
    ReentryGuard g;
    give = verbs::bundle_cm_route_dead(verbs::find_qp(id->qp));
  }
  const uint32_t qpn = id && id->qp ? id->qp->qp_num : 0;
  int rc = SHUNT_REAL(rdma_disconnect, "RDMACM_1.0")(id);
  if (!give) return rc;
  // The NIC itself is gone (removed from the bus): there is nothing left to
  // disconnect, and the job's work went on over another rail. The
  // application gets what a disconnect gives, not the device's error.
  if (rc != 0 && errno != ENXIO && errno != ENODEV) return rc;
  rc = 0;
  auto* ev = new rdma_cm_event{};
  ev->id = id;
  ev->event = RDMA_CM_EVENT_DISCONNECTED;
  {
    std::lock_guard l(g_mu);
    ready_events()[id->channel].push_back(ev);
    given_events().insert(ev);
  }
  log::info("rdma_cm: QP {} disconnected while its NIC's route is dead: DISCONNECTED given at once (the CM's "
            "request to the peer cannot get through)",
            qpn);
  telemetry::event("cm_disconnected", {{"qpn", qpn}, {"reason", "route dead"}});
  return rc;
}

__attribute__((visibility("default"))) int rdma_get_cm_event(rdma_event_channel* channel, rdma_cm_event** event) {
  {
    std::lock_guard l(g_mu);
    auto it = ready_events().find(channel);
    if (it != ready_events().end() && !it->second.empty() && event) {
      *event = it->second.front();
      it->second.pop_front();
      if (it->second.empty()) ready_events().erase(it);
      return 0;
    }
  }
  return SHUNT_REAL(rdma_get_cm_event, "RDMACM_1.0")(channel, event);
}

__attribute__((visibility("default"))) int rdma_ack_cm_event(rdma_cm_event* event) {
  {
    std::lock_guard l(g_mu);
    if (given_events().erase(event)) {
      delete event;
      return 0;
    }
  }
  return SHUNT_REAL(rdma_ack_cm_event, "RDMACM_1.0")(event);
}

}  // extern "C"
