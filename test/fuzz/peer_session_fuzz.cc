// libFuzzer target: arbitrary bytes from the network into the peer
// channel's frame parser and both ends' session state machines. Any crash,
// leak or undefined behaviour is a finding; rejections are expected.
#include <cstddef>
#include <cstdint>

#include "interpose/peer/session.h"

using namespace shunt::peer;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Key key = job_key_from("fuzz");
  static const Nonce nonce{};
  Frame f;
  size_t used = 0;
  std::string why;
  parse_frame(data, size, &f, &used, &why);
  if (used) verify_frame(f, key);

  // The first byte splits the input so framing is exercised across reads.
  size_t cut = size ? data[0] % (size + 1) : 0;
  ServerSession s(key, nonce);
  std::vector<uint8_t> out;
  auto echo = [](const nlohmann::json& r) { return r; };
  if (s.on_bytes(data, cut, echo, &out, &why)) s.on_bytes(data + cut, size - cut, echo, &out, &why);

  ClientSession c(key, nonce);
  if (c.on_bytes(data, cut, &out, &why)) c.on_bytes(data + cut, size - cut, &out, &why);
  if (c.has_reply()) c.take_reply();
  return 0;
}
