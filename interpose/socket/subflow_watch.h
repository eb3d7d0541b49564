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

// One rail as the steering thread's look sees it.
struct RailLook {
  bool backup = false;       // its endpoint is marked backup
  bool probes_dead = false;  // the probe engine finds some peer's path on it dead
  AddrHealth health;         // its subflows (zeros without a dump)
};

// Whether the steering thread looks again within a tick (50 ms, a
// sock_diag dump each): a subflow of a rail still in service is busy or
// backing off (it may be stuck), or a backup rail whose probes came back
// waits out its hold on its subflows. Not for a rail held as backup because
// its probes are lost: only the probes can restore it, and the engine pokes
// the thread when they change. (A rail lost for good kept the thread
// dumping 20 times a second, about a tenth of a one-CPU soft-RoCE guest.)
bool look_again_soon(const std::vector<RailLook>& rails);

// Fills `out` (one entry per address asked for) from one dump; false when
// sock_diag cannot be read.
bool subflow_health(const std::vector<in6_addr>& addrs, int family, std::vector<AddrHealth>* out,
                    std::string* err);

}  // namespace shunt::sock
