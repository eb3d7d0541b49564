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
#include <string>
#include <vector>

namespace shunt::verbs {

// For each source port: the address of the router `ttl` hops out on the way
// from local_ip to remote_ip:4791, or "" (no answer within wait_ms, the port
// taken by another socket, or the datagram reached the peer itself).
std::vector<std::string> hops_of_ports(const std::string& local_ip, const std::string& remote_ip,
                                       const std::vector<uint16_t>& sports, int ttl, int wait_ms);

// `want` indices into hops, spread evenly over the distinct known hops (in
// candidate order within each), unknown ones last. Fewer than two distinct
// known hops: the first `want` candidates, as without discovery.
std::vector<int> balanced_pick(const std::vector<std::string>& hops, int want);

}  // namespace shunt::verbs
