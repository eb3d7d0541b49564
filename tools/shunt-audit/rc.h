// One RC endpoint of a back-end measurement: a QP on one port with a
// registered buffer. The measuring side writes into the peer's buffer
// (bandwidth) and reads a few bytes back (latency); both are one-sided,
// so the other side only has to bring its QP up and wait.
#pragma once
#include <infiniband/verbs.h>

#include <nlohmann/json.hpp>
#include <string>

namespace audit {

struct RcResult {
  double mbps = 0, lat_us = 0;
  std::string error;
};

class RcEndpoint {
 public:
  // Opens dev, creates the QP (INIT) and the buffer; throws std::runtime_error.
  RcEndpoint(const std::string& dev, int port, int gid_index);
  ~RcEndpoint();
  RcEndpoint(const RcEndpoint&) = delete;
  RcEndpoint& operator=(const RcEndpoint&) = delete;
  // {"qpn","gid" (hex),"mtu" (enum),"addr","rkey"}
  nlohmann::json address() const;
  // INIT -> RTR -> RTS towards `remote` (address() of the other end); a
  // flow label gives the packets that UDP source port (0: the device's choice).
  void connect(const nlohmann::json& remote, uint32_t flow_label);
  // Writes for `ms` milliseconds, then `rounds` 64-byte reads one at a time.
  RcResult measure(int ms, int rounds);

 private:
  bool wait_one(ibv_wc* wc, int64_t deadline_ns);
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  ibv_qp* qp_ = nullptr;
  ibv_mr* mr_ = nullptr;
  char* buf_ = nullptr;
  int port_ = 1, gid_index_ = 0;
  ibv_gid gid_{};
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint64_t remote_addr_ = 0;
  uint32_t remote_rkey_ = 0;
};

}  // namespace audit
