// Test hooks of the bundle, for the unit tests and the microbenchmark only:
// they are built into a test archive, never into libshunt.so.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "interpose/verbs/bundle.h"

namespace shunt::verbs {

// Unit tests and the microbenchmark: an active bundle over hand-built
// shadow QPs (no peer, nothing created, no failover worker), and its removal.
Bundle* bundle_attach_for_test(QpRecord* r, const std::vector<ibv_qp*>& shadows);
void bundle_detach_for_test(QpRecord* r);
// SHUNT_SPREAD as read at activation (0 pin, 1 flowlet, 2 split, 3 auto).
void bundle_spread_for_test(QpRecord* r, int spread, uint64_t split_min);
// The router path discovery saw a path's port take (-1: the application's QP).
void bundle_router_for_test(QpRecord* r, int path, const std::string& router);
// The routers of the bundle's paths on a rail proven since its last failure
// (what a failure's renewal prefers), the paths in skip left out.
std::vector<std::string> bundle_proven_routers_for_test(QpRecord* r, int rail, const std::vector<int>& skip);
// Where two-sided work goes: -1 the application's QP, a path, -2 moving.
int bundle_carrier_for_test(QpRecord* r);
// The second half of a carrier move, with the peer's count of consumed
// messages given: what is replayed, what completions are owed.
bool bundle_move_sends_for_test(QpRecord* r, int to, uint64_t peer_consumed);
// Shunt's probe on a path (as after a renewal), with the failover worker
// that polls it unless `worker` is false (then the test's own poll
// completes it, and no thread posts beside the test); and whether it is
// still out.
void bundle_probe_for_test(QpRecord* r, int path, bool worker = true);
// Shunt's probe on every usable path, as after a failure (no worker).
void bundle_probe_all_for_test(QpRecord* r);
bool bundle_probation_for_test(QpRecord* r, int path);
// One look of the stall watch at the bundle, at time now_ms, with the port's
// last retransmission at retx_ms; returns how many paths it failed.
int bundle_check_stalls_for_test(QpRecord* r, int64_t now_ms, int64_t stall_ms, int64_t retx_ms);
// What the host agent's probes say of the shadows' source ports on the
// bundle's own NIC ((port, alive) pairs): fails those whose probes are lost.
// now_ms < 0: the monotonic clock's now. *spared: fail_silent_paths' own.
int bundle_probes_for_test(QpRecord* r, const std::vector<std::pair<uint16_t, bool>>& alive, int64_t now_ms = -1,
                           bool* spared = nullptr);
// Whether a failed path is to be renewed now (its route came back), cleared.
bool bundle_renew_now_for_test(QpRecord* r);
// Puts a failed path back in service as a renewal does (on probation).
void bundle_back_in_service_for_test(QpRecord* r, int path);
// A port event as the watch thread handles it (its failover worker not
// woken); returns the bundles touched.
int bundle_port_event_for_test(const std::string& device, int port, bool up);
// The failover worker's thread as activation starts it: asleep until its
// first wake-up.
void bundle_start_worker_for_test(QpRecord* r);
// What the completion filter left in the bundle's mailbox: how many
// reports wait, and (dropped) how many found it full.
size_t bundle_mail_for_test(QpRecord* r, uint64_t* dropped);
// The worker's first step of a round: reports what the mailbox holds;
// returns how many reports (dropped ones included).
size_t bundle_report_mail_for_test(QpRecord* r);

}  // namespace shunt::verbs
