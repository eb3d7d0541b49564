#include "interpose/verbs/retransmits.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>

namespace shunt::verbs {

namespace {
// The count in an open counter file, read from its start.
std::optional<uint64_t> read_at_start(int fd) {
  char buf[32];
  ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
  if (n <= 0) return std::nullopt;
  buf[n] = 0;
  char* end = nullptr;
  uint64_t v = strtoull(buf, &end, 10);
  if (end == buf) return std::nullopt;
  return v;
}

// The port's counter file, opened; -1 when it has neither.
int open_counter(const std::string& device, int port, const std::string& root) {
  std::string dir = root + "/" + device + "/ports/" + std::to_string(port) + "/hw_counters/";
  for (const char* name : {"completer_retry_err", "local_ack_timeout_err"}) {
    int fd = open((dir + name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    if (read_at_start(fd)) return fd;
    close(fd);
  }
  return -1;
}
}  // namespace

std::optional<uint64_t> port_retransmits(const std::string& device, int port, const std::string& root) {
  int fd = open_counter(device, port, root);
  if (fd < 0) return std::nullopt;
  auto v = read_at_start(fd);
  close(fd);
  return v;
}

RetransmitWatch::~RetransmitWatch() {
  for (auto& [key, s] : seen_)
    if (s.fd >= 0) close(s.fd);
}

std::optional<uint64_t> RetransmitWatch::read(const std::string& device, int port, Seen& s) {
  if (s.fd >= 0)
    if (auto v = read_at_start(s.fd)) return v;
  if (s.fd >= 0) close(s.fd);  // the device went away, or was replaced: open it again
  s.fd = open_counter(device, port, root_);
  return s.fd < 0 ? std::nullopt : read_at_start(s.fd);
}

int64_t RetransmitWatch::last_rise_ms(const std::string& device, int port, int64_t now_ms) {
  Seen& s = seen_[device + "/" + std::to_string(port)];
  auto v = read(device, port, s);
  if (!v) return now_ms;
  if (s.known && *v != s.count) s.rose_ms = now_ms;  // the first read is the baseline
  s.known = true;
  s.count = *v;
  return s.rose_ms;
}

}  // namespace shunt::verbs
