// The peer channel's two ends as byte-in/byte-out state machines, free of
// sockets, so the handshake and every rejection are testable and fuzzable.
//   server: hello(nonce_s) ->
//   client:                <- auth(nonce_c, proof_c)      [MAC: job key]
//   server: auth_ok(proof_s) ->                           [MAC: job key]
//   then request/reply frames with the session key and sequence numbers
//   1, 2, ... per direction.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "peer/wire.h"

namespace shunt::peer {

using RequestHandler = std::function<nlohmann::json(const nlohmann::json& request)>;

class ServerSession {
 public:
  ServerSession(const Key& job, const Nonce& server_nonce);
  std::vector<uint8_t> hello() const;
  // Consumes received bytes; appends what to send to *out. False means drop
  // the connection (*why says why, for one log line).
  bool on_bytes(const uint8_t* p, size_t n, const RequestHandler& h, std::vector<uint8_t>* out,
                std::string* why);
  bool authenticated() const { return state_ == State::open; }
  uint64_t requests() const { return seq_in_; }

 private:
  enum class State { wait_auth, open };
  Key job_, session_{};
  Nonce nonce_s_;
  State state_ = State::wait_auth;
  std::vector<uint8_t> buf_;
  uint64_t seq_in_ = 0, seq_out_ = 0;
};

class ClientSession {
 public:
  ClientSession(const Key& job, const Nonce& client_nonce);
  // Consumes received bytes. After the server's auth_ok, ready() is true;
  // after a reply, take_reply() returns it. False: drop (*why).
  bool on_bytes(const uint8_t* p, size_t n, std::vector<uint8_t>* out, std::string* why);
  bool ready() const { return state_ == State::open; }
  std::vector<uint8_t> request(const nlohmann::json& req);
  bool has_reply() const { return has_reply_; }
  nlohmann::json take_reply();

 private:
  enum class State { wait_hello, wait_auth_ok, open };
  Key job_, session_{};
  Nonce nonce_c_, nonce_s_{};
  State state_ = State::wait_hello;
  std::vector<uint8_t> buf_;
  uint64_t seq_in_ = 0, seq_out_ = 0;
  bool has_reply_ = false;
  nlohmann::json reply_;
};

}  // namespace shunt::peer
