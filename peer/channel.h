// The peer channel over TCP: the host agent's listener (a host service) and
// the client call other hosts' shims use. Sessions: session.h.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "peer/session.h"

namespace shunt::peer {

// Starts the listener thread (SHUNT_PEER_ADDR:SHUNT_PEER_PORT) answering
// requests with `h`; false (and one log line) when it cannot listen.
bool start_listener(const std::string& addr, int port, const Key& job, RequestHandler h);
void stop_listener();

// Starts (once) this process's own listener on an ephemeral port of every
// address, for requests about the verbs objects it owns (bundle setup);
// returns the port, 0 when it cannot listen. Remote shims find the port by
// asking the host agent ("locate").
int start_process_listener(const Key& job, RequestHandler h);

// Connects to a peer's agent, authenticates with the job key, sends one
// request and returns its reply, or nullopt with *err set.
std::optional<nlohmann::json> call(const std::string& addr, int port, const Key& job,
                                   const nlohmann::json& req, int timeout_ms, std::string* err);

// One round of a request to a peer: sent on each of its addresses at once,
// each on a new connection; the first reply wins (*winner: its address's
// index). A connection whose route died (a dead spine drops its SYN or its
// reply) would hold the round for the whole timeout; so where no reply came
// within hedge_ms, the round opens new connections to every address again
// (new source ports: new draws of the fabric's ECMP hash, both ways), up to
// `hedges` per address. The request goes several times: a request that
// changes state must carry an id the peer answers the same way each time
// (the peer serves its connections one after another).
std::optional<nlohmann::json> race(const std::vector<std::string>& addrs, int port, const Key& job,
                                   const nlohmann::json& req, int timeout_ms, size_t* winner, std::string* err,
                                   int hedge_ms = 150, int hedges = 6);

// Which connection still to authenticate gives way to a new one from
// `addr` (an index into `pending`, their addresses oldest first; -1: none).
// Where `addr` holds per_addr of them already, its own oldest; else, where
// `max` are pending, the oldest of the address that holds the most.
int pending_to_evict(const std::vector<uint32_t>& pending, uint32_t addr, int per_addr, int max);

// Whether `peer` (an address) fails the job key's check for the first time
// in this process: said once per peer, for the first kMaxKeyMismatchPeers.
constexpr size_t kMaxKeyMismatchPeers = 256;
bool first_key_mismatch(const std::string& peer);

// Counters of the listener (for tests and metrics).
struct ListenerCounters {
  uint64_t accepted = 0, authenticated = 0, dropped = 0, requests = 0;
};
ListenerCounters listener_counters();

}  // namespace shunt::peer
