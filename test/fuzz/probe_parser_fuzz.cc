// libFuzzer target for the probe parser: any byte string must be decoded or
// rejected without reading outside the input, and whatever decodes must
// encode back to the same bytes. Inputs whose first byte is odd are re-signed
// with the key first, so the fuzzer also explores the field checks behind
// authentication; the others exercise rejection of forged tags.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "clocksync/wire.h"

using namespace shunt::clocksync;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const Key key = derive_probe_key("fuzz");
  if (size == 0) return 0;
  bool resign = data[0] & 1;
  std::vector<uint8_t> buf(data + 1, data + size);
  if (resign) sign(buf, key);
  Probe p;
  if (decode(buf, key, &p) == DecodeStatus::ok) {
    uint8_t out[kMaxProbeSize];
    size_t n = encode(p, key, out);
    if (n != buf.size() || std::memcmp(out, buf.data(), n) != 0) __builtin_trap();
  }
  return 0;
}
