// In-band rail health: one sock_diag dump of the namespace's TCP sockets
// (MPTCP subflows included) says, per local address, whether every subflow
// with data outstanding is stuck in retransmission timeouts.
#pragma once
#include <netinet/in.h>

#include <string>
#include <vector>

namespace shunt::sock {

struct AddrHealth {
  in6_addr addr{};  // IPv4 in the first 4 bytes
  int busy = 0;     // established subflows with unacknowledged data
  int stalled = 0;  // of those, in RTO backoff with no ACK for a while
  int backing_off = 0;  // subflows (busy or not) whose last RTO has not been answered yet
};

// Fills `out` (one entry per address asked for) from one dump; false when
// sock_diag cannot be read.
bool subflow_health(const std::vector<in6_addr>& addrs, int family, std::vector<AddrHealth>* out,
                    std::string* err);

}  // namespace shunt::sock
