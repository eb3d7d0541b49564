// Setting up the verbs transport: memory, one RC QP per peer, and the
// address exchange over the bootstrap.
#include <arpa/inet.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "tools/shunt-bench/bootstrap.h"
#include "tools/shunt-bench/net.h"
#include "tools/shunt-bench/verbs_state.h"

namespace bench {

VerbsTransport::VerbsTransport(const Options& o, Bootstrap& bs, size_t region, Progress& prog)
    : o_(o), rank_(bs.rank()), world_(bs.world()), region_(region), prog_(prog),
      dev_(o, (world_ - 1) * int(kSendDepth + kRecvDepth) + 16), peers_(world_) {
  seg_ = static_cast<uint32_t>(std::min<uint64_t>({uint64_t(o.seg_bytes), uint64_t(dev_.max_msg()), uint64_t(1) << 30}));
  if (seg_ == 0) throw BenchError("verbs: --seg must be positive");
  mem_ = static_cast<char*>(
      mmap(nullptr, region_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0));
  if (mem_ == MAP_FAILED) {
    mem_ = nullptr;
    throw BenchError("verbs: cannot allocate " + std::to_string(region_) + " bytes");
  }
  credit_in_ = new CreditSlot[world_]();
  credit_out_ = new CreditSlot[world_]();
  try {
    mr_ = dev_.register_memory(mem_, region_);
    credit_in_mr_ = dev_.register_memory(credit_in_, sizeof(CreditSlot) * world_);
    credit_out_mr_ = dev_.register_memory(credit_out_, sizeof(CreditSlot) * world_);
    connect_all(bs);
  } catch (...) {
    release();
    throw;
  }
}

VerbsTransport::~VerbsTransport() { release(); }

void VerbsTransport::release() {
  for (auto& p : peers_) {
    if (p.qp) ibv_destroy_qp(p.qp);
    p.qp = nullptr;
  }
  for (ibv_mr** mr : {&mr_, &credit_in_mr_, &credit_out_mr_}) {
    if (*mr) ibv_dereg_mr(*mr);
    *mr = nullptr;
  }
  delete[] credit_in_;
  delete[] credit_out_;
  credit_in_ = credit_out_ = nullptr;
  if (mem_) munmap(mem_, region_);
  mem_ = nullptr;
}

std::string VerbsTransport::describe() const {
  char gid[INET6_ADDRSTRLEN] = "?";
  inet_ntop(AF_INET6, dev_.gid().raw, gid, sizeof gid);
  return "verbs " + dev_.name() + " port " + std::to_string(dev_.port()) + " gid[" +
         std::to_string(dev_.gid_index()) + "] " + gid + " mtu " + mtu_bytes(dev_.mtu()) + " " + to_string(o_.verb);
}

// Each rank publishes its address and one QP number per peer; rank r
// connects its QP for p to p's QP for r.
void VerbsTransport::connect_all(Bootstrap& bs) {
  VerbsAddr me{};
  std::memcpy(me.gid, dev_.gid().raw, 16);
  me.lid = dev_.lid();
  me.mtu = static_cast<uint8_t>(dev_.mtu());
  me.region_addr = reinterpret_cast<uint64_t>(mem_);
  me.region_rkey = mr_->rkey;
  me.credit_addr = reinterpret_cast<uint64_t>(credit_in_);
  me.credit_rkey = credit_in_mr_->rkey;
  std::string blob(reinterpret_cast<const char*>(&me), sizeof me);
  for (int p = 0; p < world_; p++) {
    uint32_t qpn = 0;
    if (p != rank_) {
      bool inl = false;
      peers_[p].qp = dev_.create_qp(kSendDepth, kRecvDepth, &inl);
      inline_ok_ = inline_ok_ && inl;
      qpn = peers_[p].qp->qp_num;
    }
    blob.append(reinterpret_cast<const char*>(&qpn), sizeof qpn);
  }
  auto all = bs.allgather(blob);
  for (int p = 0; p < world_; p++) {
    if (p == rank_) continue;
    if (all[p].size() != sizeof(VerbsAddr) + world_ * sizeof(uint32_t))
      throw BenchError("verbs: bad address blob from rank " + std::to_string(p));
    std::memcpy(&peers_[p].addr, all[p].data(), sizeof(VerbsAddr));
    uint32_t rqpn;
    std::memcpy(&rqpn, all[p].data() + sizeof(VerbsAddr) + rank_ * sizeof(uint32_t), sizeof rqpn);
    dev_.connect_qp(peers_[p].qp, rqpn, peers_[p].addr, o_);
  }
  bs.barrier();  // every QP is at RTR before anyone sends
}

}  // namespace bench

namespace bench {
std::unique_ptr<Transport> make_verbs_transport(const Options& o, Bootstrap& bs, size_t region, Progress& prog) {
  return std::make_unique<VerbsTransport>(o, bs, region, prog);
}
}  // namespace bench
