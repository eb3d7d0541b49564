// How often a device port retransmitted on an ACK timeout, from the
// hw_counters the kernel exposes in sysfs: rdma_rxe's completer_retry_err,
// mlx5's local_ack_timeout_err. The stall watch of bundles reads it to tell
// a dead route (the device keeps retransmitting) from a quiet one.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace shunt::verbs {

// nullopt: the port exposes neither counter.
std::optional<uint64_t> port_retransmits(const std::string& device, int port,
                                         const std::string& root = "/sys/class/infiniband");

// When each port's count last rose, as seen by successive reads. Each
// port's counter file stays open and is read again from its start (an
// open and a close per read were most of the stall watch's CPU on a
// one-CPU emulated guest).
class RetransmitWatch {
 public:
  explicit RetransmitWatch(std::string root = "/sys/class/infiniband") : root_(std::move(root)) {}
  ~RetransmitWatch();
  RetransmitWatch(const RetransmitWatch&) = delete;
  RetransmitWatch& operator=(const RetransmitWatch&) = delete;
  // Reads the port now; returns when (now_ms or earlier) its count was last
  // seen to rise, -1 when never, or now_ms when the port has no counter (a
  // stall alone must then decide).
  int64_t last_rise_ms(const std::string& device, int port, int64_t now_ms);

 private:
  struct Seen {
    int fd = -1;
    bool known = false;  // count holds a read
    uint64_t count = 0;
    int64_t rose_ms = -1;
  };
  std::optional<uint64_t> read(const std::string& device, int port, Seen& s);
  std::string root_;
  std::map<std::string, Seen> seen_;
};

}  // namespace shunt::verbs
