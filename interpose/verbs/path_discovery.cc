#include "interpose/verbs/path_discovery.h"

#include <arpa/inet.h>
#include <linux/errqueue.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "core/mono.h"

namespace shunt::verbs {

namespace {
// The offender of one ICMP time exceeded in fd's error queue, or "".
std::string read_offender(int fd, bool* reached) {
  char data[64], ctl[512];
  for (;;) {
    iovec iov{data, sizeof data};
    sockaddr_in from{};
    msghdr m{};
    m.msg_name = &from;
    m.msg_namelen = sizeof from;
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof ctl;
    if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0) return "";
    for (cmsghdr* c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
      if (c->cmsg_level != IPPROTO_IP || c->cmsg_type != IP_RECVERR) continue;
      auto* ee = reinterpret_cast<sock_extended_err*>(CMSG_DATA(c));
      if (ee->ee_origin != SO_EE_ORIGIN_ICMP) continue;
      if (ee->ee_type == 3) *reached = true;  // unreachable: it got to the peer (or no route)
      if (ee->ee_type != 11) continue;        // time exceeded
      auto* off = reinterpret_cast<const sockaddr_in*>(SO_EE_OFFENDER(ee));
      if (off->sin_family != AF_INET) continue;
      char s[INET_ADDRSTRLEN];
      if (inet_ntop(AF_INET, &off->sin_addr, s, sizeof s)) return s;
    }
  }
}
}  // namespace

int64_t discovery_deadline(int64_t start_ms, int wait_ms, int routers, int64_t last_new_ms) {
  const int64_t cap = start_ms + discovery_cap_ms(wait_ms);
  if (routers == 0) return start_ms + wait_ms;  // no router out there (a peer on the same switch)
  if (routers == 1) return cap;
  const int64_t grace = std::max<int64_t>(20, (last_new_ms - start_ms) / 4);
  return std::min(cap, std::max(start_ms + wait_ms, last_new_ms + grace));
}

int hop_send(const std::string& local_ip, const std::string& remote_ip, uint16_t sport, int ttl,
             uint16_t dst_port) {
  sockaddr_in dst{}, src{};
  dst.sin_family = src.sin_family = AF_INET;
  dst.sin_port = htons(dst_port);
  src.sin_port = htons(sport);
  if (inet_pton(AF_INET, remote_ip.c_str(), &dst.sin_addr) != 1 ||
      inet_pton(AF_INET, local_ip.c_str(), &src.sin_addr) != 1 || ttl < 1)
    return -1;
  int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  const int one = 1;
  // Not a RoCE packet (one zero byte, no BTH): should it reach the peer
  // after all, its device drops it as malformed. No SO_REUSEADDR: a port
  // another socket holds stays unknown, never shared.
  const char z = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof src) != 0 ||
      setsockopt(fd, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) != 0 ||
      setsockopt(fd, IPPROTO_IP, IP_RECVERR, &one, sizeof one) != 0 ||
      sendto(fd, &z, 1, 0, reinterpret_cast<sockaddr*>(&dst), sizeof dst) != 1) {
    close(fd);
    return -1;
  }
  return fd;
}

bool hop_answer(int fd, std::string* hop) {
  pollfd p{fd, 0, 0};
  if (fd < 0 || poll(&p, 1, 0) <= 0 || !(p.revents & POLLERR)) return false;
  bool reached = false;
  *hop = read_offender(fd, &reached);
  return !hop->empty() || reached;
}

std::vector<std::string> hops_of_ports(const std::string& local_ip, const std::string& remote_ip,
                                       const std::vector<uint16_t>& sports, int ttl, int wait_ms, int max_ms,
                                       uint16_t dst_port) {
  std::vector<std::string> out(sports.size());
  if (wait_ms <= 0) return out;  // (bad addresses or TTL: hop_send sends nothing)
  std::vector<int> fds(sports.size(), -1);
  std::vector<pollfd> pfd;
  std::vector<size_t> of;
  for (size_t i = 0; i < sports.size(); i++) {
    const int fd = hop_send(local_ip, remote_ip, sports[i], ttl, dst_port);
    if (fd < 0) continue;
    fds[i] = fd;
    pfd.push_back({fd, 0, 0});  // POLLERR is always reported
    of.push_back(i);
  }
  const int64_t start = mono_ms();
  std::set<std::string> routers;
  int64_t last_new = start;
  size_t left = pfd.size();
  while (left > 0) {
    int64_t now = mono_ms();
    int64_t end = discovery_deadline(start, wait_ms, static_cast<int>(routers.size()), last_new);
    if (max_ms >= 0) end = std::min(end, start + max_ms);
    if (now >= end) break;
    int n = poll(pfd.data(), pfd.size(), static_cast<int>(end - now));
    if (n <= 0) continue;
    now = mono_ms();
    for (size_t k = 0; k < pfd.size(); k++) {
      if (pfd[k].fd < 0 || !(pfd[k].revents & POLLERR)) continue;
      bool reached = false;
      std::string hop = read_offender(pfd[k].fd, &reached);
      if (!hop.empty() || reached) {
        out[of[k]] = hop;
        pfd[k].fd = -1;  // done with it (poll skips negative fds)
        left--;
        if (!hop.empty() && routers.insert(hop).second) last_new = now;
      }
    }
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  return out;
}

std::vector<int> balanced_pick(const std::vector<std::string>& hops, int want) {
  std::vector<int> pick;
  std::map<std::string, std::vector<int>> by_hop;
  std::vector<int> unknown;
  for (int i = 0; i < static_cast<int>(hops.size()); i++)
    (hops[i].empty() ? unknown : by_hop[hops[i]]).push_back(i);
  if (by_hop.size() < 2) {
    for (int i = 0; i < static_cast<int>(hops.size()) && static_cast<int>(pick.size()) < want; i++) pick.push_back(i);
    return pick;
  }
  // Round robin over the hops, the one whose first candidate comes first leading.
  std::vector<std::vector<int>*> order;
  for (auto& [h, v] : by_hop) order.push_back(&v);
  std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->front() < b->front(); });
  for (size_t round = 0; static_cast<int>(pick.size()) < want; round++) {
    bool any = false;
    for (auto* v : order)
      if (round < v->size() && static_cast<int>(pick.size()) < want) pick.push_back((*v)[round]), any = true;
    if (!any) break;
  }
  for (size_t k = 0; k < unknown.size() && static_cast<int>(pick.size()) < want; k++) pick.push_back(unknown[k]);
  return pick;
}

std::vector<uint16_t> candidate_ports(const std::string& local, const std::string& peer, int n, uint64_t salt) {
  std::seed_seq seq{std::hash<std::string>{}(local + "/" + peer), static_cast<size_t>(salt), static_cast<size_t>(salt >> 32)};
  std::mt19937 rng(seq);
  std::uniform_int_distribution<int> label(1, 0x3fff);
  std::vector<uint16_t> out;
  n = std::clamp(n, 0, 0x3fff);
  while (static_cast<int>(out.size()) < n) {
    auto p = static_cast<uint16_t>(0xC000 | label(rng));
    if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
  }
  return out;
}

void HopCache::prune(int64_t now_ms) {
  std::erase_if(slots_, [&](const auto& kv) { return !kv.second.running && now_ms - kv.second.e.at_ms >= ttl_ms_; });
  while (!slots_.empty() && slots_.size() >= limits_.max_entries) {  // room for one more
    auto oldest = slots_.end();
    for (auto it = slots_.begin(); it != slots_.end(); ++it)
      if (!it->second.running && (oldest == slots_.end() || it->second.touched_ms < oldest->second.touched_ms))
        oldest = it;
    if (oldest == slots_.end()) break;  // every one running: bounded by max_running
    slots_.erase(oldest);
  }
}

std::optional<HopCache::Entry> HopCache::get(const std::string& local, const std::string& peer, int candidates,
                                             int64_t now_ms, bool* busy) {
  if (busy) *busy = false;
  std::unique_lock g(mu_);
  const Key key{local, peer};
  auto it = slots_.find(key);
  if (it != slots_.end()) {
    const Slot& s = it->second;
    if (s.have && now_ms - s.e.at_ms < ttl_ms_ && static_cast<int>(s.e.ports.size()) >= candidates) return s.e;
    if (s.running) return std::nullopt;
  }
  // Fresh ports each time: ports of the last round may be bound by now
  // (the agent's probes of the shadows that took them), and binding is how
  // a discovery datagram gets its source port.
  std::vector<uint16_t> ports = candidate_ports(local, peer, candidates, static_cast<uint64_t>(now_ms) ^ (++draws_ << 40));
  const int n = static_cast<int>(ports.size());
  if (running_ >= limits_.max_running || running_ports_ + n > limits_.max_ports) {
    if (busy) *busy = true;
    return std::nullopt;
  }
  if (it == slots_.end()) {
    prune(now_ms);
    it = slots_.emplace(key, Slot{}).first;
  }
  it->second.running = true;
  it->second.touched_ms = now_ms;
  running_++;
  running_ports_ += n;
  g.unlock();
  spawn_([this, key, ports, now_ms, n] {
    std::vector<std::string> hops;
    try {
      hops = probe_(key.first, key.second, ports);
    } catch (...) {  // (out of memory): the ports stay unknown, and the round still ends
      hops.clear();
    }
    hops.resize(ports.size());
    std::lock_guard l(mu_);
    running_--;
    running_ports_ -= n;
    Slot& t = slots_[key];  // a running slot is never pruned: still there
    t.e.ports = ports;
    t.e.hops = std::move(hops);
    t.e.at_ms = now_ms;  // the TTL counts from when the datagrams went
    t.have = true;
    t.running = false;
  });
  g.lock();
  it = slots_.find(key);  // (pruned meanwhile where the round already ended)
  if (it == slots_.end()) return std::nullopt;
  const Slot& s = it->second;
  if (s.have && !s.running && static_cast<int>(s.e.ports.size()) >= candidates && s.e.ports == ports) return s.e;
  return std::nullopt;
}

size_t HopCache::entries() {
  std::lock_guard l(mu_);
  return slots_.size();
}

int HopCache::running_ports() {
  std::lock_guard l(mu_);
  return running_ports_;
}

}  // namespace shunt::verbs
