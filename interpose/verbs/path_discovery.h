// Which ECMP path a RoCE v2 flow takes, found before any of its packets go:
// a UDP datagram from the flow's source port to the peer's RoCE port (4791)
// with a short TTL is hashed by every router as the flow's packets are
// (the TTL is in no ECMP hash), and the router where its TTL runs out
// answers with ICMP time exceeded, from its own address. With TTL 2 that is
// the first router past the host's own switch: the spine of a leaf-spine
// fabric, where the flow's path is chosen. Paris-traceroute's idea, one hop.
//
// A bundle asks it for more candidate source ports than it has shadows and
// takes ports balanced over the answers, so its shadows spread over the
// spines by construction instead of by the hash's luck. Routers limit their
// ICMP rate (Linux: a burst of 6 a second per destination host), so a port
// may stay unknown; unknown ports are taken last, and where fewer than two
// routers answered, nothing changes.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace shunt::verbs {

constexpr uint16_t kRoceV2Port = 4791;  // RoCE v2's UDP destination port

// For each source port: the address of the router `ttl` hops out on the way
// from local_ip to remote_ip:4791, or "" (no answer in time, the port taken
// by another socket, or the datagram reached the peer itself). It waits
// until discovery_deadline, or at most max_ms where that is >= 0. Another
// dst_port finds the path of datagrams to that port instead (where the
// routers hash the destination port too, it is not RoCE's).
std::vector<std::string> hops_of_ports(const std::string& local_ip, const std::string& remote_ip,
                                       const std::vector<uint16_t>& sports, int ttl, int wait_ms,
                                       int max_ms = -1, uint16_t dst_port = kRoceV2Port);

// One port's datagram, answered later (a caller that must not wait): the
// socket it went from, or -1 (the port taken by another socket, no route).
// hop_answer reads it without waiting: true once the router answered (*hop
// its address) or the datagram reached the peer (*hop ""); the caller
// closes the socket.
int hop_send(const std::string& local_ip, const std::string& remote_ip, uint16_t sport, int ttl,
             uint16_t dst_port = kRoceV2Port);
bool hop_answer(int fd, std::string* hop);

// How long hops_of_ports waits for answers, started at start_ms, with
// `routers` distinct routers heard so far, the last new one at last_new_ms:
// wait_ms; while exactly one router answered, up to kDiscoveryLateFactor
// times as long (a router's answers queue behind the traffic its links
// carry: behind a congested spine they come late, and without a second
// router discovery places nothing); after a router first answers, a
// quarter of the time it took (at least 20 ms) more for the rest of its
// burst, never past the cap. None at all by wait_ms: no router is out
// there (the peer hangs off the same switch), no more waiting. With no
// congestion every router answers within a millisecond or two and nothing
// changes; on a fabric with a single router two hops out the first
// discovery towards a peer waits the whole cap.
constexpr int kDiscoveryLateFactor = 10;
// The longest a discovery waits for answers: kDiscoveryLateFactor x wait_ms.
constexpr int64_t discovery_cap_ms(int wait_ms) { return int64_t{kDiscoveryLateFactor} * wait_ms; }
int64_t discovery_deadline(int64_t start_ms, int wait_ms, int routers, int64_t last_new_ms);

// `want` indices into hops, spread evenly over the distinct known hops (in
// candidate order within each), unknown ones last. Fewer than two distinct
// known hops: the first `want` candidates, as without discovery.
std::vector<int> balanced_pick(const std::vector<std::string>& hops, int want);

// What discovery found per (local address, peer address), kept by the host
// agent so that every bundle of the host towards that peer is served by one
// round of datagrams. Routers limit ICMP per destination host: the bundles
// a job opens at once, each sending its own candidates, left all but the
// first unanswered (and placed by the hash). The bundles that share an entry
// share its ports too (the same 5-tuples, so the same routes, and the host
// agent probes each such port once).
//
// Anyone who can reach the agent can ask, so the cache is bounded: entries
// past their TTL go, the table holds at most max_entries (the oldest
// goes first), and a discovery starts only while fewer than max_running
// are out and their candidates (one socket each) stay within max_ports.
struct HopCacheLimits {
  size_t max_entries = 256;  // (local, peer) pairs kept
  int max_running = 4;       // discoveries out at once
  int max_ports = 256;       // their candidates together: the sockets they hold
};

class HopCache {
 public:
  struct Entry {
    std::vector<uint16_t> ports;   // candidate UDP source ports, in the order they were tried
    std::vector<std::string> hops; // the router that answered for each, or ""
    int64_t at_ms = 0;             // when its datagrams went
  };
  using Limits = HopCacheLimits;
  // Runs a discovery: hops of `ports` from local to peer (hops_of_ports).
  using Probe = std::function<std::vector<std::string>(const std::string& local, const std::string& peer,
                                                      const std::vector<uint16_t>& ports)>;
  // Runs `work` somewhere (a thread of its own in the agent; inline in tests).
  using Spawn = std::function<void(std::function<void()> work)>;
  HopCache(Probe probe, Spawn spawn, int64_t ttl_ms, Limits limits = {})
      : probe_(std::move(probe)), spawn_(std::move(spawn)), ttl_ms_(ttl_ms), limits_(limits) {}
  // The entry for (local, peer) when it is younger than the TTL and tried at
  // least `candidates` ports. Otherwise a new discovery of `candidates`
  // fresh random ports starts (unless one for that pair runs already) and
  // the answer is nullopt: ask again shortly. Where the discoveries out are
  // at their bound none starts, and *busy (when given) is set.
  std::optional<Entry> get(const std::string& local, const std::string& peer, int candidates, int64_t now_ms,
                           bool* busy = nullptr);
  size_t entries();      // (for tests)
  int running_ports();   // candidates of the discoveries out now

 private:
  struct Slot {
    Entry e;
    bool have = false, running = false;
    int64_t touched_ms = 0;  // when it was made or last refreshed: the oldest goes first
  };
  using Key = std::pair<std::string, std::string>;
  void prune(int64_t now_ms);  // under mu_
  Probe probe_;
  Spawn spawn_;
  int64_t ttl_ms_;
  Limits limits_;
  std::mutex mu_;
  std::map<Key, Slot> slots_;
  int running_ = 0, running_ports_ = 0;
  uint64_t draws_ = 0;
};

// Random candidate source ports for (local, peer): `n` distinct ports in
// 0xC001..0xFFFF, so each is the port of flow label (port & 0x3fff) (the
// kernel's rdma_flow_label_to_udp_sport for labels below 0x4000).
std::vector<uint16_t> candidate_ports(const std::string& local, const std::string& peer, int n, uint64_t salt);

}  // namespace shunt::verbs
