// libFuzzer target for the peer channel, as its listener runs it:
//  - an input whose first byte is even is raw bytes from the network into
//    the frame parser and both ends' session state machines (rejections
//    are expected);
//  - an odd first byte makes the rest the payload of requests (split at
//    '\n', up to 8) that a client holding the job key sends once the
//    handshake is done, answered by the real handlers the channel runs:
//    a process's bundle_answer (bit 1 clear) or the host agent's
//    peer_answer (bit 1 set). Every reply must reach the client as JSON,
//    and the handlers, also called directly, never throw.
// Any crash, leak, undefined behaviour or trap is a finding.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "interpose/verbs/bundle.h"
#include "peer/session.h"

namespace shunt::agent {
nlohmann::json peer_answer(const nlohmann::json& req);  // peer_service.cc
}

using namespace shunt;
using namespace shunt::peer;

namespace {

void raw_bytes(const uint8_t* data, size_t size, const RequestHandler& h) {
  static const Key key = job_key_from("fuzz");
  Frame f;
  size_t used = 0;
  std::string why;
  parse_frame(data, size, &f, &used, &why);
  if (used) verify_frame(f, key);
  // The first byte splits the input so framing is exercised across reads.
  size_t cut = size ? data[0] % (size + 1) : 0;
  ServerSession s(key, random_nonce());
  std::vector<uint8_t> out;
  if (s.on_bytes(data, cut, h, &out, &why)) s.on_bytes(data + cut, size - cut, h, &out, &why);
  ClientSession c(key, random_nonce());
  if (c.on_bytes(data, cut, &out, &why)) c.on_bytes(data + cut, size - cut, &out, &why);
  if (c.has_reply()) c.take_reply();
}

// One session for every input, its handshake done once: a request never
// drops the connection (else: trap), so it stays open, and its sequence
// numbers go on from input to input.
struct Open {
  Key key = job_key_from("fuzz");
  Nonce ns{1}, nc{2};
  ServerSession s{key, ns};
  ClientSession c{key, nc};
  Key session = session_key(key, ns, nc);
  Open() {
    std::string why;
    std::vector<uint8_t> to_s, to_c = s.hello();
    const RequestHandler none = [](const nlohmann::json&) { return nlohmann::json(); };
    for (int i = 0; i < 2 && !c.ready(); i++) {  // hello -> auth -> auth_ok
      to_s.clear();
      if (!c.on_bytes(to_c.data(), to_c.size(), &to_s, &why)) __builtin_trap();
      to_c.clear();
      if (!to_s.empty() && !s.on_bytes(to_s.data(), to_s.size(), none, &to_c, &why)) __builtin_trap();
    }
    if (!c.ready() || !s.authenticated()) __builtin_trap();
  }
};

void requests(std::string_view payloads, const RequestHandler& h) {
  static Open* o = new Open;
  std::string why;
  std::vector<uint8_t> unused;
  for (int n = 0; n < 8 && !payloads.empty(); n++) {
    size_t nl = payloads.find('\n');
    Frame f;
    f.type = FrameType::request;
    f.seq = o->s.requests() + 1;
    f.payload = std::string(payloads.substr(0, nl));
    payloads.remove_prefix(nl == std::string_view::npos ? payloads.size() : nl + 1);
    if (f.payload.size() > kMaxPayload) f.payload.resize(kMaxPayload);
    // The handlers themselves never throw (the session would turn it into
    // an error reply, hiding it from the fuzzer).
    if (auto j = nlohmann::json::parse(f.payload, nullptr, false); j.is_object()) try {
        h(j);
      } catch (...) {
        __builtin_trap();
      }
    auto req = encode_frame(f, o->session);
    std::vector<uint8_t> rep;
    if (!o->s.on_bytes(req.data(), req.size(), h, &rep, &why)) __builtin_trap();  // a request never drops the connection
    if (!o->c.on_bytes(rep.data(), rep.size(), &unused, &why) || !o->c.has_reply()) __builtin_trap();  // its reply is JSON
    o->c.take_reply();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const RequestHandler handler = data[0] & 2 ? RequestHandler(agent::peer_answer) : RequestHandler(verbs::bundle_answer);
  if (!(data[0] & 1)) raw_bytes(data, size, handler);
  else requests(std::string_view(reinterpret_cast<const char*>(data) + 1, size - 1), handler);
  return 0;
}
