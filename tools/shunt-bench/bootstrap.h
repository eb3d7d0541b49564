// The out-of-band channel between ranks: rank 0 listens on the bootstrap
// address, every other rank connects to it. Used to exchange connection
// details (QP numbers, GIDs, rkeys, tcp addresses), for barriers and to
// gather per-rank results.
#pragma once
#include <string>
#include <vector>

namespace bench {

class Bootstrap {
 public:
  Bootstrap(int rank, int world, const std::string& host_port, double timeout_s);
  ~Bootstrap();
  Bootstrap(const Bootstrap&) = delete;
  Bootstrap& operator=(const Bootstrap&) = delete;

  int rank() const { return rank_; }
  int world() const { return world_; }

  // Every rank contributes one blob; every rank gets all blobs, by rank.
  std::vector<std::string> allgather(const std::string& mine);
  void barrier() { allgather({}); }

  // The local address this host uses to reach the others (the bootstrap
  // socket's own end), a good default for the tcp transport's listener.
  const std::string& local_addr() const { return local_addr_; }

  // How long a collective waits for a slow rank before it is an error.
  void set_wait_s(double s) { wait_s_ = s; }

 private:
  int rank_, world_;
  double wait_s_;
  std::vector<int> fds_;  // rank 0: fd per rank (fds_[0] unused); others: fds_[0] to rank 0
  std::string local_addr_;
};

}  // namespace bench
