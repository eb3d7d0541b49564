// The verbs transport's state: one RC QP per peer, the credit slots and the
// queues of the exchange in progress. Set-up is in verbs_connect.cc, the
// data path in verbs_transport.cc.
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

#include "tools/shunt-bench/transport.h"
#include "tools/shunt-bench/verbs_device.h"

namespace bench {

constexpr uint32_t kSendDepth = 256;
constexpr uint32_t kRecvDepth = 512;
constexpr uint32_t kCreditReserve = 8;  // send slots kept for credit writes

// A credit slot written by the peer: the count and its complement, so a
// torn read is recognised and ignored.
struct alignas(16) CreditSlot {
  uint64_t v;
  uint64_t nv;
};

// wr_id: kind (2 bits) | peer (16 bits) | bytes (46 bits).
enum WrKind : uint64_t { kData = 1, kCredit = 2, kRecv = 3 };
inline uint64_t wr_id(WrKind k, int peer, uint64_t bytes) {
  return (uint64_t(k) << 62) | (uint64_t(peer) << 46) | bytes;
}
inline WrKind wr_kind(uint64_t id) { return static_cast<WrKind>(id >> 62); }
inline int wr_peer(uint64_t id) { return static_cast<int>((id >> 46) & 0xffff); }
inline uint64_t wr_bytes(uint64_t id) { return id & ((1ull << 46) - 1); }

struct Segment {
  uint64_t local, remote;
  uint32_t len;
  bool last;          // ends the chunk (carries the immediate in write_imm)
  bool needs_credit;  // consumes one receive at the peer
};

struct Peer {
  ibv_qp* qp = nullptr;
  VerbsAddr addr{};
  std::deque<Segment> tx;        // not yet posted
  uint64_t tx_credit_used = 0;   // cumulative receives we have consumed at the peer
  uint64_t tx_credit_seen = 0;   // cumulative receives the peer has granted
  uint32_t tx_outstanding = 0;   // posted, not completed (data and credit writes)
  uint32_t imm_next = 0;         // write_imm: sequence number we send next
  uint32_t imm_expect = 0;       // write_imm: sequence number we expect next
  uint64_t rx_credit_given = 0;  // cumulative receives granted to the peer
};

class VerbsTransport final : public Transport {
 public:
  VerbsTransport(const Options& o, Bootstrap& bs, size_t region, Progress& prog);
  ~VerbsTransport() override;

  char* base() override { return mem_; }
  size_t region_bytes() const override { return region_; }
  std::string describe() const override;
  void exchange(const std::vector<SendOp>& sends, const std::vector<RecvOp>& recvs) override;

 private:
  void connect_all(Bootstrap& bs);
  void release();
  void post_receives(const RecvOp& r);
  void queue_sends(const SendOp& s);
  void grant_credit(int peer, uint64_t n);
  void refresh_credit(int peer);
  bool post_ready_sends();
  bool poll_completions();
  [[noreturn]] void completion_failed(const ibv_wc& wc);
  [[noreturn]] void post_failed(const char* what, int peer, int rc);
  uint32_t segments(size_t len) const { return static_cast<uint32_t>((len + seg_ - 1) / seg_); }

  const Options& o_;
  int rank_, world_;
  size_t region_;
  Progress& prog_;
  VerbsDevice dev_;
  std::vector<Peer> peers_;
  uint32_t seg_ = 0;
  bool inline_ok_ = true;  // every QP took inline data
  char* mem_ = nullptr;
  CreditSlot* credit_in_ = nullptr;   // peers write the credits they grant us here
  CreditSlot* credit_out_ = nullptr;  // source of our credit writes when not inline
  ibv_mr* mr_ = nullptr;
  ibv_mr* credit_in_mr_ = nullptr;
  ibv_mr* credit_out_mr_ = nullptr;
  uint64_t open_ = 0;      // data segments and receives of this exchange not yet complete
  uint64_t credit_wrs_ = 0;  // credit writes posted, not completed
};

}  // namespace bench
