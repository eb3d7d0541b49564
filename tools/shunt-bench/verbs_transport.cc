// The verbs transport's data path.
//
// write_imm: a chunk is RDMA WRITEs into the peer's region, the last one a
//   WRITE_WITH_IMM (imm = per-peer sequence number) that consumes one
//   receive at the peer and tells it the chunk has landed.
// send: a chunk is SENDs of at most --seg bytes, each into a receive the
//   peer posted over its buffer.
// Flow control: a receiver posts its receives for an exchange, then RDMA
// WRITEs its cumulative count of posted receives into the sender's credit
// slot; a sender posts nothing the peer has not granted. So a buffer is
// never written while its owner may still read it, and no SEND meets an
// empty receive queue.
#include <arpa/inet.h>
#include <time.h>

#include <chrono>
#include <cstring>

#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/verbs_state.h"

namespace bench {
namespace {

const char* status_name(ibv_wc_status s) {
  switch (s) {
    case IBV_WC_SUCCESS: return "IBV_WC_SUCCESS";
    case IBV_WC_LOC_LEN_ERR: return "IBV_WC_LOC_LEN_ERR";
    case IBV_WC_LOC_QP_OP_ERR: return "IBV_WC_LOC_QP_OP_ERR";
    case IBV_WC_LOC_PROT_ERR: return "IBV_WC_LOC_PROT_ERR";
    case IBV_WC_WR_FLUSH_ERR: return "IBV_WC_WR_FLUSH_ERR";
    case IBV_WC_MW_BIND_ERR: return "IBV_WC_MW_BIND_ERR";
    case IBV_WC_BAD_RESP_ERR: return "IBV_WC_BAD_RESP_ERR";
    case IBV_WC_LOC_ACCESS_ERR: return "IBV_WC_LOC_ACCESS_ERR";
    case IBV_WC_REM_INV_REQ_ERR: return "IBV_WC_REM_INV_REQ_ERR";
    case IBV_WC_REM_ACCESS_ERR: return "IBV_WC_REM_ACCESS_ERR";
    case IBV_WC_REM_OP_ERR: return "IBV_WC_REM_OP_ERR";
    case IBV_WC_RETRY_EXC_ERR: return "IBV_WC_RETRY_EXC_ERR";
    case IBV_WC_RNR_RETRY_EXC_ERR: return "IBV_WC_RNR_RETRY_EXC_ERR";
    case IBV_WC_REM_ABORT_ERR: return "IBV_WC_REM_ABORT_ERR";
    case IBV_WC_FATAL_ERR: return "IBV_WC_FATAL_ERR";
    case IBV_WC_RESP_TIMEOUT_ERR: return "IBV_WC_RESP_TIMEOUT_ERR";
    case IBV_WC_GENERAL_ERR: return "IBV_WC_GENERAL_ERR";
    default: return "IBV_WC_?";
  }
}

const char* kind_name(WrKind k) {
  switch (k) {
    case kData: return "data";
    case kCredit: return "credit write";
    case kRecv: return "receive";
  }
  return "?";
}

}  // namespace

void VerbsTransport::exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) {
  open_ = 0;
  for (const auto& r : recvs)
    if (r.len) post_receives(r);
  for (const auto& s : sends)
    if (s.len) queue_sends(s);
  auto last = std::chrono::steady_clock::now();
  int idle = 0;
  while (open_ > 0) {
    bool moved = post_ready_sends();
    moved |= poll_completions();
    if (moved) {
      idle = 0;
      continue;
    }
    if (idle++ == 0) last = std::chrono::steady_clock::now();
    // Spin briefly, then back off: on a small guest the device's own work
    // shares the CPU with us.
    if (idle > 2000) {
      timespec ts{0, 20000};
      nanosleep(&ts, nullptr);
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - last).count() > o_.stall_timeout_s) {
        prog_.errors.fetch_add(1, std::memory_order_relaxed);
        throw BenchError("verbs: no progress for " + std::to_string(static_cast<int>(o_.stall_timeout_s)) + " s (" +
                         std::to_string(open_) + " operations open)");
      }
    }
  }
}

void VerbsTransport::post_receives(const RecvOp& r) {
  Peer& p = peers_[r.peer];
  bool imm = o_.verb == Verb::write_imm;
  uint32_t n = imm ? 1 : segments(r.len);
  if (n > kRecvDepth)
    throw BenchError("verbs: a chunk of " + std::to_string(r.len) + " bytes needs " + std::to_string(n) +
                     " receives (queue holds " + std::to_string(kRecvDepth) + "): raise --seg");
  for (uint32_t i = 0; i < n; i++) {
    ibv_sge sge{};
    ibv_recv_wr wr{};
    ibv_recv_wr* bad = nullptr;
    uint64_t len = r.len;
    if (!imm) {  // write_imm lands no data in the receive: no scatter list
      len = std::min<uint64_t>(seg_, r.len - uint64_t(i) * seg_);
      sge.addr = reinterpret_cast<uint64_t>(mem_ + r.local_off) + uint64_t(i) * seg_;
      sge.length = static_cast<uint32_t>(len);
      sge.lkey = mr_->lkey;
      wr.sg_list = &sge;
      wr.num_sge = 1;
    }
    wr.wr_id = wr_id(kRecv, r.peer, len);
    if (int rc = ibv_post_recv(p.qp, &wr, &bad)) post_failed("ibv_post_recv", r.peer, rc);
    open_++;
  }
  grant_credit(r.peer, n);
}

void VerbsTransport::grant_credit(int peer, uint64_t n) {
  Peer& p = peers_[peer];
  p.rx_credit_given += n;
  CreditSlot& src = credit_out_[peer];
  src.v = p.rx_credit_given;
  src.nv = ~p.rx_credit_given;
  ibv_sge sge{reinterpret_cast<uint64_t>(&src), sizeof src, credit_out_mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = wr_id(kCredit, peer, 0);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.send_flags = IBV_SEND_SIGNALED | (inline_ok_ ? IBV_SEND_INLINE : 0);
  wr.wr.rdma.remote_addr = p.addr.credit_addr + uint64_t(rank_) * sizeof(CreditSlot);
  wr.wr.rdma.rkey = p.addr.credit_rkey;
  while (p.tx_outstanding >= kSendDepth) poll_completions();
  if (int rc = ibv_post_send(p.qp, &wr, &bad)) post_failed("ibv_post_send (credit)", peer, rc);
  p.tx_outstanding++;
  credit_wrs_++;
}

void VerbsTransport::queue_sends(const SendOp& s) {
  Peer& p = peers_[s.peer];
  bool imm = o_.verb == Verb::write_imm;
  uint32_t n = segments(s.len);
  for (uint32_t i = 0; i < n; i++) {
    uint64_t off = uint64_t(i) * seg_;
    Segment g;
    g.local = reinterpret_cast<uint64_t>(mem_ + s.local_off) + off;
    g.remote = p.addr.region_addr + s.remote_off + off;
    g.len = static_cast<uint32_t>(std::min<uint64_t>(seg_, s.len - off));
    g.last = i + 1 == n;
    g.needs_credit = imm ? i == 0 : true;
    p.tx.push_back(g);
    open_++;
  }
}

void VerbsTransport::refresh_credit(int peer) {
  uint64_t v = __atomic_load_n(&credit_in_[peer].v, __ATOMIC_ACQUIRE);
  uint64_t nv = __atomic_load_n(&credit_in_[peer].nv, __ATOMIC_ACQUIRE);
  if (nv == ~v && v > peers_[peer].tx_credit_seen) peers_[peer].tx_credit_seen = v;
}

bool VerbsTransport::post_ready_sends() {
  bool moved = false;
  bool imm = o_.verb == Verb::write_imm;
  for (int peer = 0; peer < world_; peer++) {
    Peer& p = peers_[peer];
    while (!p.tx.empty() && p.tx_outstanding < kSendDepth - kCreditReserve) {
      const Segment& g = p.tx.front();
      if (g.needs_credit && p.tx_credit_used >= p.tx_credit_seen) {
        refresh_credit(peer);
        if (p.tx_credit_used >= p.tx_credit_seen) break;
      }
      ibv_sge sge{g.local, g.len, mr_->lkey};
      ibv_send_wr wr{};
      ibv_send_wr* bad = nullptr;
      wr.wr_id = wr_id(kData, peer, g.len);
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (imm) {
        wr.opcode = g.last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        if (g.last) wr.imm_data = htonl(p.imm_next++);
        wr.wr.rdma.remote_addr = g.remote;
        wr.wr.rdma.rkey = p.addr.region_rkey;
      } else {
        wr.opcode = IBV_WR_SEND;
      }
      if (int rc = ibv_post_send(p.qp, &wr, &bad)) post_failed("ibv_post_send", peer, rc);
      if (g.needs_credit) p.tx_credit_used++;
      p.tx_outstanding++;
      p.tx.pop_front();
      moved = true;
    }
  }
  return moved;
}

bool VerbsTransport::poll_completions() {
  ibv_wc wc[32];
  int n = ibv_poll_cq(dev_.cq(), 32, wc);
  if (n < 0) {
    prog_.errors.fetch_add(1, std::memory_order_relaxed);
    throw BenchError("verbs: ibv_poll_cq failed (" + std::to_string(n) + ")");
  }
  for (int i = 0; i < n; i++)
    if (wc[i].status != IBV_WC_SUCCESS) {
      int bad = 0;
      for (int k = i; k < n; k++) bad += wc[k].status != IBV_WC_SUCCESS;
      prog_.errors.fetch_add(bad, std::memory_order_relaxed);
      completion_failed(wc[i]);
    }
  for (int i = 0; i < n; i++) {
    const ibv_wc& c = wc[i];
    int peer = wr_peer(c.wr_id);
    Peer& p = peers_[peer];
    switch (wr_kind(c.wr_id)) {
      case kData:
        p.tx_outstanding--;
        open_--;
        prog_.delivered(wr_bytes(c.wr_id));
        break;
      case kCredit:
        p.tx_outstanding--;
        credit_wrs_--;
        break;
      case kRecv:
        if (o_.verb == Verb::write_imm) {
          uint32_t got = ntohl(c.imm_data);
          if (c.opcode != IBV_WC_RECV_RDMA_WITH_IMM || !(c.wc_flags & IBV_WC_WITH_IMM) || got != p.imm_expect) {
            prog_.errors.fetch_add(1, std::memory_order_relaxed);
            throw BenchError("verbs: receive from rank " + std::to_string(peer) + " out of order: imm " +
                             std::to_string(got) + ", expected " + std::to_string(p.imm_expect));
          }
          p.imm_expect++;
        } else if (c.opcode != IBV_WC_RECV || c.byte_len != wr_bytes(c.wr_id)) {
          prog_.errors.fetch_add(1, std::memory_order_relaxed);
          throw BenchError("verbs: receive from rank " + std::to_string(peer) + " of " + std::to_string(c.byte_len) +
                           " bytes, expected " + std::to_string(wr_bytes(c.wr_id)));
        }
        open_--;
        break;
    }
  }
  return n > 0;
}

void VerbsTransport::completion_failed(const ibv_wc& wc) {
  int peer = wr_peer(wc.wr_id);
  char vendor[16];
  snprintf(vendor, sizeof vendor, "0x%x", wc.vendor_err);
  throw BenchError("verbs: " + std::string(kind_name(wr_kind(wc.wr_id))) + " completion on QP " +
                   std::to_string(wc.qp_num) + " (to rank " + std::to_string(peer) + ") failed: " +
                   status_name(wc.status) + " (" + std::to_string(static_cast<int>(wc.status)) + ", " +
                   ibv_wc_status_str(wc.status) + ", vendor_err " + vendor + ")");
}

void VerbsTransport::post_failed(const char* what, int peer, int rc) {
  prog_.errors.fetch_add(1, std::memory_order_relaxed);
  throw BenchError(std::string("verbs: ") + what + " to rank " + std::to_string(peer) + " failed: " + errno_text(rc));
}

}  // namespace bench
