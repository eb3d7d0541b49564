// One RDMA device as the benchmark uses it: context, protection domain, a
// completion queue, the chosen port and GID, and RC QPs brought up to RTS
// from the peer's published address.
#pragma once
#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

#include "tools/shunt-bench/options.h"

namespace bench {

// What a rank publishes so a peer can address it.
struct VerbsAddr {
  uint8_t gid[16];
  uint16_t lid;
  uint8_t mtu;  // enum ibv_mtu
  uint8_t pad[5];
  uint64_t region_addr;
  uint32_t region_rkey;
  uint32_t credit_rkey;
  uint64_t credit_addr;
};

class VerbsDevice {
 public:
  // cq_depth: completions that can be outstanding at once (capped by the device).
  VerbsDevice(const Options& o, int cq_depth);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  ibv_context* ctx() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  int port() const { return port_; }
  int gid_index() const { return gid_index_; }
  const ibv_gid& gid() const { return gid_; }
  uint16_t lid() const { return lid_; }
  ibv_mtu mtu() const { return mtu_; }
  uint32_t max_msg() const { return max_msg_; }
  const std::string& name() const { return name_; }
  bool roce() const { return roce_; }

  ibv_mr* register_memory(void* addr, size_t len);
  // An RC QP on this device's CQ, in INIT. *inline_ok tells whether the
  // device granted inline data (for the credit writes).
  ibv_qp* create_qp(uint32_t send_depth, uint32_t recv_depth, bool* inline_ok);
  // INIT -> RTR -> RTS towards remote QP `rqpn` at `remote`.
  void connect_qp(ibv_qp* qp, uint32_t rqpn, const VerbsAddr& remote, const Options& o);

 private:
  void choose_gid(int requested);

  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int port_ = 1;
  int gid_index_ = 0;
  ibv_gid gid_{};
  uint16_t lid_ = 0;
  ibv_mtu mtu_ = IBV_MTU_1024;
  uint32_t max_msg_ = 1u << 30;
  bool roce_ = true;
  std::string name_;
};

const char* mtu_bytes(ibv_mtu m);

}  // namespace bench
