#include "tools/shunt-bench/verbs_device.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

#include "tools/shunt-bench/net.h"

namespace bench {
namespace {

constexpr uint32_t kPsn = 0x1000;  // any 24-bit value agreed by both ends

bool ipv4_mapped(const ibv_gid& g) {
  static const uint8_t prefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(g.raw, prefix, sizeof prefix) == 0;
}

[[noreturn]] void fail(const std::string& what, int err) { throw BenchError("verbs: " + what + ": " + errno_text(err)); }

}  // namespace

const char* mtu_bytes(ibv_mtu m) {
  switch (m) {
    case IBV_MTU_256: return "256";
    case IBV_MTU_512: return "512";
    case IBV_MTU_1024: return "1024";
    case IBV_MTU_2048: return "2048";
    case IBV_MTU_4096: return "4096";
  }
  return "?";
}

VerbsDevice::VerbsDevice(const Options& o, int cq_depth) : port_(o.ib_port) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  if (!list || n == 0) {
    if (list) ibv_free_device_list(list);
    throw BenchError("verbs: no RDMA devices found");
  }
  ibv_device* dev = nullptr;
  for (int i = 0; i < n && !dev; i++)
    if (o.device.empty() || o.device == ibv_get_device_name(list[i])) dev = list[i];
  if (!dev) {
    ibv_free_device_list(list);
    throw BenchError("verbs: no RDMA device named " + o.device);
  }
  name_ = ibv_get_device_name(dev);
  ctx_ = ibv_open_device(dev);
  ibv_free_device_list(list);
  if (!ctx_) fail("ibv_open_device " + name_, errno);

  ibv_port_attr pa{};
  if (int rc = ibv_query_port(ctx_, port_, &pa)) fail("ibv_query_port " + name_, rc);
  if (pa.state != IBV_PORT_ACTIVE)
    throw BenchError("verbs: port " + std::to_string(port_) + " of " + name_ + " is " + ibv_port_state_str(pa.state));
  lid_ = pa.lid;
  mtu_ = pa.active_mtu;
  max_msg_ = pa.max_msg_sz;
  roce_ = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
  choose_gid(o.gid_index);

  ibv_device_attr da{};
  if (int rc = ibv_query_device(ctx_, &da)) fail("ibv_query_device", rc);
  pd_ = ibv_alloc_pd(ctx_);
  if (!pd_) fail("ibv_alloc_pd", errno);
  int cqe = std::min(da.max_cqe, cq_depth);
  cq_ = ibv_create_cq(ctx_, cqe, nullptr, nullptr, 0);
  if (!cq_) fail("ibv_create_cq", errno);
}

VerbsDevice::~VerbsDevice() {
  if (cq_) ibv_destroy_cq(cq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
}

// Default: the first RoCEv2 GID that carries an IPv4 address (what a
// routed RoCE fabric uses), else the first RoCEv2 GID, else index 0.
void VerbsDevice::choose_gid(int requested) {
  if (requested >= 0) {
    gid_index_ = requested;
  } else if (roce_) {
    ibv_port_attr pa{};
    ibv_query_port(ctx_, port_, &pa);
    int any_v2 = -1, v4_v2 = -1;
    for (int i = 0; i < pa.gid_tbl_len && v4_v2 < 0; i++) {
      ibv_gid_entry e{};
      if (ibv_query_gid_ex(ctx_, port_, i, &e, 0) != 0) continue;
      if (e.gid_type != IBV_GID_TYPE_ROCE_V2) continue;
      ibv_gid g;
      std::memcpy(g.raw, e.gid.raw, sizeof g.raw);
      if (any_v2 < 0) any_v2 = i;
      if (ipv4_mapped(g)) v4_v2 = i;
    }
    gid_index_ = v4_v2 >= 0 ? v4_v2 : any_v2 >= 0 ? any_v2 : 0;
  }
  if (int rc = ibv_query_gid(ctx_, port_, gid_index_, &gid_))
    fail("ibv_query_gid index " + std::to_string(gid_index_), rc > 0 ? rc : errno);
}

ibv_mr* VerbsDevice::register_memory(void* addr, size_t len) {
  ibv_mr* mr = ibv_reg_mr(pd_, addr, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!mr) fail("ibv_reg_mr of " + std::to_string(len) + " bytes", errno);
  return mr;
}

ibv_qp* VerbsDevice::create_qp(uint32_t send_depth, uint32_t recv_depth, bool* inline_ok) {
  ibv_qp_init_attr a{};
  a.send_cq = cq_;
  a.recv_cq = cq_;
  a.qp_type = IBV_QPT_RC;
  a.cap.max_send_wr = send_depth;
  a.cap.max_recv_wr = recv_depth;
  a.cap.max_send_sge = 1;
  a.cap.max_recv_sge = 1;
  a.cap.max_inline_data = 64;
  ibv_qp* qp = ibv_create_qp(pd_, &a);
  *inline_ok = qp != nullptr;
  if (!qp) {  // some devices refuse inline data: go without
    a.cap.max_inline_data = 0;
    qp = ibv_create_qp(pd_, &a);
  }
  if (!qp) fail("ibv_create_qp", errno);
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_INIT;
  m.pkey_index = 0;
  m.port_num = port_;
  m.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  if (int rc = ibv_modify_qp(qp, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) {
    ibv_destroy_qp(qp);
    fail("ibv_modify_qp to INIT", rc);
  }
  return qp;
}

void VerbsDevice::connect_qp(ibv_qp* qp, uint32_t rqpn, const VerbsAddr& remote, const Options& o) {
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_RTR;
  m.path_mtu = std::min(mtu_, static_cast<ibv_mtu>(remote.mtu));
  m.dest_qp_num = rqpn;
  m.rq_psn = kPsn;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 12;  // 0.64 ms
  m.ah_attr.port_num = port_;
  m.ah_attr.dlid = remote.lid;
  static const uint8_t zero[16] = {};
  if (roce_ || std::memcmp(remote.gid, zero, 16) != 0) {
    m.ah_attr.is_global = 1;
    std::memcpy(m.ah_attr.grh.dgid.raw, remote.gid, 16);
    m.ah_attr.grh.sgid_index = gid_index_;
    m.ah_attr.grh.hop_limit = 64;
  }
  int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
             IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
  if (int rc = ibv_modify_qp(qp, &m, mask)) fail("ibv_modify_qp to RTR (remote qpn " + std::to_string(rqpn) + ")", rc);

  std::memset(&m, 0, sizeof m);
  m.qp_state = IBV_QPS_RTS;
  m.timeout = o.qp_timeout;
  m.retry_cnt = o.retry_cnt;
  m.rnr_retry = 7;  // RNR: wait for the receiver indefinitely
  m.sq_psn = kPsn;
  m.max_rd_atomic = 1;
  mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
  if (int rc = ibv_modify_qp(qp, &m, mask)) fail("ibv_modify_qp to RTS", rc);
}

}  // namespace bench
