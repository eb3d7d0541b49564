#include "interpose/verbs/retransmits.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace shunt::verbs {

namespace {
std::optional<uint64_t> read_counter(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  char buf[32];
  ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return std::nullopt;
  buf[n] = 0;
  char* end = nullptr;
  uint64_t v = strtoull(buf, &end, 10);
  if (end == buf) return std::nullopt;
  return v;
}
}  // namespace

std::optional<uint64_t> port_retransmits(const std::string& device, int port, const std::string& root) {
  std::string dir = root + "/" + device + "/ports/" + std::to_string(port) + "/hw_counters/";
  for (const char* name : {"completer_retry_err", "local_ack_timeout_err"})
    if (auto v = read_counter(dir + name)) return v;
  return std::nullopt;
}

int64_t RetransmitWatch::last_rise_ms(const std::string& device, int port, int64_t now_ms) {
  auto v = port_retransmits(device, port, root_);
  if (!v) return now_ms;
  std::string key = device + "/" + std::to_string(port);
  auto it = seen_.find(key);
  if (it == seen_.end()) {
    seen_[key] = {*v, -1};
    return -1;
  }
  if (*v != it->second.count) {
    it->second.count = *v;
    it->second.rose_ms = now_ms;
  }
  return it->second.rose_ms;
}

}  // namespace shunt::verbs
