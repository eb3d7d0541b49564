// Rails: the host's other RDMA NICs, and shunt's mirrors of the
// application's verbs objects on them, so a bundle can have paths on every
// rail its peer is reachable through.
// - A rail is a device port with an IPv4 GID of the same type as the one
//   the application's QP uses; shunt opens its own context on it.
// - Every MR the application registers is known here (address, length,
//   iova, access); once a bundle has a path on another rail, the MR's PD
//   gets a mirror PD there and every MR of that PD a mirror MR (same
//   address and iova, same access), so a WR can be posted there with its
//   keys translated. Each application CQ with rail paths behind it gets a
//   mirror CQ per rail, polled from the application's ibv_poll_cq.
// - Mirrors go with the application's object (dereg, dealloc, destroy).
#pragma once
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "interpose/verbs/registry.h"

namespace shunt::verbs {

struct Rail {
  std::string device;
  ibv_context* ctx = nullptr;  // shunt's own
  ContextRecord* rec = nullptr;  // its record (the provider's ops)
  uint8_t port = 1;
  int gid_index = -1;
  ibv_gid gid{};
  std::string ip;
};

// The local rail the kernel routes `ip` through (a connected UDP socket's
// source address, matched to a device's IPv4 GID of type `gid_type`), or
// null. Opens the rail's context on first use.
Rail* rail_toward(const std::string& ip, int gid_type, std::string* err);
// Every rail whose port is active with an IPv4 GID of `gid_type`, other
// than `device`.
std::vector<Rail*> other_rails(const std::string& device, int gid_type);
// A new context of the device of that name, or null (errno set).
ibv_context* open_device_named(const std::string& name);
// The IPv4 address of an IPv4-mapped GID (RoCE v2); false for another GID.
bool gid_v4(const ibv_gid& g, std::string* ip);
// The GID type (IBV_GID_TYPE_*) of a device's GID entry; -1 when unknown.
int gid_type_of(ibv_context* ctx, uint8_t port, int index);

// The exported registration calls, around the real ones (active mode).
void rails_on_reg_mr(ibv_mr* mr, void* addr, size_t len, uint64_t iova, int access);
void rails_on_dereg_mr(ibv_mr* mr);     // before the real dereg
void rails_on_dealloc_pd(ibv_pd* pd);   // before the real dealloc
void rails_on_destroy_cq(ibv_cq* cq);   // before the real destroy

// The mirror PD of `app` on the rail (made with a mirror of every MR of
// the PD the first time), or null with *err.
ibv_pd* mirror_pd(ibv_pd* app, const Rail* r, std::string* err);
// Where a doorbell QP on the application's NIC connects to itself.
struct LoopAddr {
  uint8_t port = 1;
  int gid_index = 0;
};
// The mirror CQ of `app` on the rail (as deep as it), or null with *err.
// When `app` has a completion channel (event mode), the mirror gets one of
// shunt's, watched by the watch thread (rail_channel_fds): a completion
// there rings a doorbell on `app`, a zero-length WRITE of a QP on the
// application's NIC connected to itself (at `at`) whose completion lands
// on `app`, so an application waiting on its channel wakes and polls.
ibv_cq* mirror_cq(ibv_cq* app, const Rail* r, const LoopAddr& at, std::string* err);
// The completion channels of mirror CQs, for the watch thread to poll;
// rail_channel_ready(fd) when one is readable.
std::vector<int> rail_channel_fds();
void rail_channel_ready(int fd);
// Wakes an application waiting on `app`'s channel (completions shunt owes
// it are waiting), when `app` has a doorbell; false when it has none.
bool ring_doorbell(ibv_cq* app);
// The lkey on the rail of the MR whose lkey on the application's device is
// `lkey`; false when the MR has no mirror there.
bool mirror_lkey(const ibv_context* app_ctx, uint32_t lkey, const Rail* r, uint32_t* out);
// (rkey on the application's device, rkey on the rail) of every MR of the
// PD mirrored there: what the peer needs to post one-sided work to them.
std::vector<std::pair<uint32_t, uint32_t>> rkey_map(ibv_pd* app, const Rail* r, size_t max);

// Mirror CQs exist: the poll path looks for them only then.
extern std::atomic<int> g_mirror_cqs;
// Completions expected on mirror CQs (signaled WRs and receives posted on
// rail paths, less completions polled there): while above 0, every poll
// of the application looks at its mirrors. Approximate (flushes of
// unsignaled WRs also complete), hence only a hint: polls look at the
// mirrors now and then regardless.
extern std::atomic<int64_t> g_rail_expect;
inline void rail_expect(int64_t n) { g_rail_expect.fetch_add(n, std::memory_order_relaxed); }
// Polls the mirror CQs of `cq` (each filtered like the application's
// completions: see bundle_filter) into wc[0..n); returns how many.
int poll_mirrors(ibv_cq* cq, int n, ibv_wc* wc);

}  // namespace shunt::verbs
