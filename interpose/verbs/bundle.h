// The bundle behind an application's RC QP: shadow QPs on the same port
// and on the other NICs the peer is reachable through (rails.h), each with
// its own flow label (so its own UDP source port and ECMP path),
// set up with the peer's shim over the peer channel, and the rules that keep
// verbs semantics while one-sided work moves between them:
// - SENDs, WRITE_WITH_IMM and atomics stay on the application's QP (its
//   receive queue and the peer's are the application's own); one-sided
//   WRITE and READ go on a shadow path.
// - A WR goes to the application's QP only once every earlier WR on a shadow
//   has completed (a fence: shunt's own zero-length signaled WRITE when the
//   last one was unsignaled); until then it and everything after it wait in
//   the bundle and are posted from ibv_poll_cq.
// - A shadow's completions reach the application's CQ with the
//   application's wr_id and QP number; shunt's fences never show.
// - Failover: an error completion marks its path down and its errors never
//   reach the application. A shadow's unfinished WRs are posted again on
//   live paths. When the path carrying two-sided work (the application's
//   QP first) fails, both ends agree on a shadow to carry it: each moves its
//   unconsumed receives there, tells the other how many messages it
//   consumed, and the sender posts again exactly the messages not consumed
//   (completions of those that were are owed and returned by ibv_poll_cq).
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "interpose/verbs/registry.h"

namespace shunt::verbs {

// After a successful ibv_modify_qp of an application QP (active mode):
// records what the shadows need, and at RTS starts the bundle's setup.
// Before the application's RC QP goes to RTR in active mode (a bundle
// made at INIT): without a flow label of its own, the QP gets one, so its
// UDP source port is known and the host agent can probe its route like a
// shadow's. true: *out (a copy of *attr with the label) is what to pass.
// Either way the QP's label is kept. bundle_unlabel_primary: the real call
// refused the copy (the application's own attr goes instead).
bool bundle_label_primary(QpRecord* r, const ibv_qp_attr* attr, int mask, ibv_qp_attr* out);
void bundle_unlabel_primary(QpRecord* r);
void bundle_on_modify(QpRecord* r, const ibv_qp_attr* attr, int mask);
// Before the real destroy of an application QP: destroys its shadows.
void bundle_on_destroy(QpRecord* r);

bool bundle_active(const Bundle* b);
// Every WR of a QP with a bundle (active or not yet): a bundle numbers the
// messages that consume a receive, and keeps the application's receives,
// from the start, so that two-sided work can move to another path.
int bundle_post_send(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad);
int bundle_post_recv(Bundle* b, ContextRecord* c, ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad);

// Path discovery's ports for (local, peer) from the host agent at `sock`: 1
// with them, 0 without an agent that answers, -1 while its round is out (or
// it has not answered yet) and `once`; without `once` it asks until the
// round ends.
int shared_hops_via(const std::string& sock, const std::string& local, const std::string& peer, int candidates,
                    int wait_ms, bool once, std::vector<uint16_t>* ports, std::vector<std::string>* hops);

// How many bundled and shadow QPs exist: the poll path looks for them only
// when some do.
extern std::atomic<int> g_shadow_qps;
// Completions of destroyed shadows that the poll path dropped (registry.h,
// retire_qp).
extern std::atomic<uint64_t> g_stale_wcs;
// Completions shunt owes the application (WRs the peer executed on a path
// that failed before their completion came): ibv_poll_cq returns them first.
extern std::atomic<int> g_stash_n;
int bundle_unstash(ibv_cq* cq, int n, ibv_wc* wc);

// The depth to create (or resize) an application's CQ with, in active mode:
// the shadows on the application's own NIC complete into its CQs, so a CQ
// sized for the application's QP alone overflows, and rxe drops a
// completion that finds its CQ full (perftest's rdma_cm CQs hold one entry;
// shunt's probes then never completed there, and their paths failed as
// stalled). Room for `paths` more QPs like the application's, a few of
// shunt's own WRs on each, never past the device's max_cqe, never less than asked.
int shadow_cq_depth(int cqe, int paths, int max_cqe);
int cq_depth_for(ibv_context* ctx, int cqe);

// Rewrites the completions of shadow QPs among wc[0..n) to the application's
// QP, drops shunt's own, posts WRs whose fence cleared; returns the new n.
int bundle_filter(ContextRecord* c, ibv_wc* wc, int n);

// Whether the connection manager's own route to the peer looks dead: the
// application's QP failed and no path on its NIC is usable (rdma_cm_exports.cc).
bool bundle_cm_route_dead(QpRecord* r);

// The bundle of an application QP for the stats file (null when none).
nlohmann::json bundle_json(const QpRecord& r);

// Requests of other hosts' shims to this process (its peer listener).
nlohmann::json bundle_answer(const nlohmann::json& req);

// The directory of bundle owners on this host, in the run directory: the
// host agent answers "locate" from it with the owner's listener port.
std::string bundle_dir();
int bundle_locate(const std::string& gid_hex, uint32_t qpn);

}  // namespace shunt::verbs
