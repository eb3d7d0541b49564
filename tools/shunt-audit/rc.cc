#include "tools/shunt-audit/rc.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <ctime>
#include <stdexcept>
#include <vector>

using nlohmann::json;

namespace audit {
namespace {

constexpr size_t kBuf = 4u << 20;     // the peer's buffer the writes land in
constexpr uint32_t kMsg = 64 * 1024;  // one write
constexpr int kDepth = 16;            // writes in flight
constexpr uint32_t kPsn = 0x2000;

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

[[noreturn]] void fail(const std::string& what, int err) {
  throw std::runtime_error(what + ": " + strerror(err));
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  for (size_t i = 0; i < n; i++) s += fmt::format("{:02x}", p[i]);
  return s;
}

}  // namespace

RcEndpoint::RcEndpoint(const std::string& dev, int port, int gid_index)
    : port_(port), gid_index_(gid_index) {
  int n = 0;
  ibv_device** list = ibv_get_device_list(&n);
  for (int i = 0; list && i < n && !ctx_; i++)
    if (dev == ibv_get_device_name(list[i])) ctx_ = ibv_open_device(list[i]);
  if (list) ibv_free_device_list(list);
  if (!ctx_) throw std::runtime_error("cannot open RDMA device " + dev);
  try {
    ibv_port_attr pa{};
    if (int rc = ibv_query_port(ctx_, port_, &pa)) fail("ibv_query_port", rc);
    if (pa.state != IBV_PORT_ACTIVE)
      throw std::runtime_error(dev + " port " + std::to_string(port_) + " is not ACTIVE");
    mtu_ = pa.active_mtu;
    if (gid_index_ < 0) gid_index_ = 0;
    if (int rc = ibv_query_gid(ctx_, port_, gid_index_, &gid_))
      fail("ibv_query_gid", rc > 0 ? rc : errno);
    pd_ = ibv_alloc_pd(ctx_);
    if (!pd_) fail("ibv_alloc_pd", errno);
    cq_ = ibv_create_cq(ctx_, 2 * kDepth + 4, nullptr, nullptr, 0);
    if (!cq_) fail("ibv_create_cq", errno);
    buf_ = static_cast<char*>(
        mmap(nullptr, kBuf, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
    if (buf_ == MAP_FAILED) buf_ = nullptr, fail("mmap", errno);
    mr_ = ibv_reg_mr(pd_, buf_, kBuf,
                     IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
    if (!mr_) fail("ibv_reg_mr", errno);
    ibv_qp_init_attr a{};
    a.send_cq = a.recv_cq = cq_;
    a.qp_type = IBV_QPT_RC;
    a.cap.max_send_wr = kDepth + 2;
    a.cap.max_recv_wr = 1;
    a.cap.max_send_sge = a.cap.max_recv_sge = 1;
    qp_ = ibv_create_qp(pd_, &a);
    if (!qp_) fail("ibv_create_qp", errno);
    ibv_qp_attr m{};
    m.qp_state = IBV_QPS_INIT;
    m.port_num = port_;
    m.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    if (int rc = ibv_modify_qp(
            qp_, &m, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
      fail("ibv_modify_qp to INIT", rc);
  } catch (...) {
    this->~RcEndpoint();
    throw;
  }
}

RcEndpoint::~RcEndpoint() {
  if (qp_) ibv_destroy_qp(qp_);
  if (mr_) ibv_dereg_mr(mr_);
  if (buf_) munmap(buf_, kBuf);
  if (cq_) ibv_destroy_cq(cq_);
  if (pd_) ibv_dealloc_pd(pd_);
  if (ctx_) ibv_close_device(ctx_);
  qp_ = nullptr, mr_ = nullptr, buf_ = nullptr, cq_ = nullptr, pd_ = nullptr, ctx_ = nullptr;
}

json RcEndpoint::address() const {
  return {{"qpn", qp_->qp_num},
          {"gid", hex(gid_.raw, 16)},
          {"mtu", int(mtu_)},
          {"addr", reinterpret_cast<uint64_t>(buf_)},
          {"rkey", mr_->rkey}};
}

void RcEndpoint::connect(const json& remote, uint32_t flow_label) {
  std::string g = remote.at("gid").get<std::string>();
  if (g.size() != 32) throw std::runtime_error("bad remote gid");
  ibv_qp_attr m{};
  m.qp_state = IBV_QPS_RTR;
  m.path_mtu = std::min(mtu_, static_cast<ibv_mtu>(remote.at("mtu").get<int>()));
  m.dest_qp_num = remote.at("qpn").get<uint32_t>();
  m.rq_psn = kPsn;
  m.max_dest_rd_atomic = 1;
  m.min_rnr_timer = 12;
  m.ah_attr.port_num = port_;
  m.ah_attr.is_global = 1;
  for (int i = 0; i < 16; i++)
    m.ah_attr.grh.dgid.raw[i] = static_cast<uint8_t>(std::stoi(g.substr(2 * i, 2), nullptr, 16));
  m.ah_attr.grh.sgid_index = gid_index_;
  m.ah_attr.grh.hop_limit = 64;
  m.ah_attr.grh.flow_label = flow_label;
  if (int rc = ibv_modify_qp(qp_, &m,
                             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                                 IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    fail("ibv_modify_qp to RTR", rc);
  std::memset(&m, 0, sizeof m);
  m.qp_state = IBV_QPS_RTS;
  m.timeout = 17;  // 0.5 s per try: a busy or virtual host answers late, and every early retry is a duplicate
  m.retry_cnt = 5;  // 7 is "forever" on some devices: a dead path must end in an error
  m.rnr_retry = 5;
  m.sq_psn = kPsn;
  m.max_rd_atomic = 1;
  if (int rc = ibv_modify_qp(qp_, &m,
                             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                                 IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
    fail("ibv_modify_qp to RTS", rc);
  remote_addr_ = remote.at("addr").get<uint64_t>();
  remote_rkey_ = remote.at("rkey").get<uint32_t>();
}

bool RcEndpoint::wait_one(ibv_wc* wc, int64_t deadline_ns) {
  for (;;) {
    int n = ibv_poll_cq(cq_, 1, wc);
    if (n > 0) return true;
    if (n < 0 || now_ns() > deadline_ns) return false;
  }
}

RcResult RcEndpoint::measure(int ms, int rounds) {
  RcResult r;
  auto post = [&](ibv_wr_opcode op, uint64_t off, uint32_t len, uint64_t id) {
    ibv_sge sge{reinterpret_cast<uint64_t>(buf_) + off, len, mr_->lkey};
    ibv_send_wr wr{}, *bad = nullptr;
    wr.wr_id = id;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.opcode = op;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = remote_addr_ + off;
    wr.wr.rdma.rkey = remote_rkey_;
    return ibv_post_send(qp_, &wr, &bad);
  };
  // Bandwidth: kDepth writes in flight, for ms milliseconds; a completion
  // missing for 5 s past the end (a path that died) ends it as an error.
  int64_t t0 = now_ns(), end = t0 + int64_t(ms) * 1000000;
  uint64_t done = 0, next = 0;
  int inflight = 0;
  ibv_wc wc{};
  while (true) {
    int64_t now = now_ns();
    while (inflight < kDepth && now < end) {
      if (int rc = post(IBV_WR_RDMA_WRITE, (next % (kBuf / kMsg)) * kMsg, kMsg, next)) {
        r.error = fmt::format("ibv_post_send: {}", strerror(rc));
        return r;
      }
      next++, inflight++;
    }
    if (inflight == 0) break;
    if (!wait_one(&wc, std::max(end, now) + 5000000000LL)) {
      r.error = "no completion within 5 s";
      return r;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      r.error = fmt::format("write completed with {}", ibv_wc_status_str(wc.status));
      return r;
    }
    inflight--, done++;
  }
  double secs = double(now_ns() - t0) / 1e9;
  r.mbps = double(done) * kMsg / secs / 1e6;
  // Latency: one 64-byte read at a time; the 10th percentile of the round
  // trips (a path's own delay, less the host's scheduling noise, which
  // on a busy or virtual host is larger than the path's by far).
  std::vector<double> rtt;
  for (int i = 0; i < rounds; i++) {
    int64_t s = now_ns();
    if (int rc = post(IBV_WR_RDMA_READ, 0, 64, 1u << 31)) {
      r.error = fmt::format("ibv_post_send (read): {}", strerror(rc));
      return r;
    }
    if (!wait_one(&wc, s + 5000000000LL)) {
      r.error = "read: no completion within 5 s";
      return r;
    }
    if (wc.status != IBV_WC_SUCCESS) {
      r.error = fmt::format("read completed with {}", ibv_wc_status_str(wc.status));
      return r;
    }
    rtt.push_back(double(now_ns() - s) / 1e3);
  }
  std::sort(rtt.begin(), rtt.end());
  r.lat_us = rtt.empty() ? 0 : rtt[rtt.size() / 10];
  return r;
}

}  // namespace audit
