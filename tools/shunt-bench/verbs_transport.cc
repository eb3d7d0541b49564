#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/transport.h"
namespace bench {
std::unique_ptr<Transport> make_verbs_transport(const Options&, Bootstrap&, size_t, Progress&) {
  throw BenchError("verbs: not yet");
}
}
