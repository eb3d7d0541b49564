#include "clocksync/probe_socket.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <linux/errqueue.h>
#include <linux/ethtool.h>
#include <linux/net_tstamp.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "clocksync/phc.h"

namespace shunt::clocksync {

const char* to_string(StampMode m) {
  switch (m) {
    case StampMode::user: return "user";
    case StampMode::software: return "software";
    case StampMode::hardware: return "hardware";
  }
  return "?";
}

bool parse_ipv4(const std::string& addr, uint16_t port, sockaddr_in* out) {
  std::memset(out, 0, sizeof(*out));
  out->sin_family = AF_INET;
  out->sin_port = htons(port);
  return inet_pton(AF_INET, addr.c_str(), &out->sin_addr) == 1;
}

namespace {

int64_t realtime_now() {
  timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string ifname_of(const in_addr& a) {
  ifaddrs* ifs = nullptr;
  std::string name;
  if (getifaddrs(&ifs) != 0) return name;
  for (ifaddrs* i = ifs; i; i = i->ifa_next)
    if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
        reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr == a.s_addr) {
      name = i->ifa_name;
      break;
    }
  freeifaddrs(ifs);
  return name;
}

// The PHC index if the interface stamps both directions in hardware, else -1.
int hw_phc_index(int fd, const std::string& ifname) {
  ethtool_ts_info info{};
  info.cmd = ETHTOOL_GET_TS_INFO;
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&info);
  if (ioctl(fd, SIOCETHTOOL, &ifr) != 0) return -1;
  const uint32_t need = SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE |
                        SOF_TIMESTAMPING_RAW_HARDWARE;
  if ((info.so_timestamping & need) != need || info.phc_index < 0) return -1;
  if (!(info.tx_types & (1u << HWTSTAMP_TX_ON))) return -1;
  return info.phc_index;
}

bool enable_hw(int fd, const std::string& ifname) {
  hwtstamp_config cfg{};
  ifreq ifr{};
  std::strncpy(ifr.ifr_name, ifname.c_str(), IFNAMSIZ - 1);
  ifr.ifr_data = reinterpret_cast<char*>(&cfg);
  // Keep an existing configuration (e.g. ptp4l's) if it already stamps what we need.
  if (ioctl(fd, SIOCGHWTSTAMP, &ifr) == 0 && cfg.tx_type == HWTSTAMP_TX_ON &&
      cfg.rx_filter == HWTSTAMP_FILTER_ALL)
    return true;
  cfg = {};
  cfg.tx_type = HWTSTAMP_TX_ON;
  cfg.rx_filter = HWTSTAMP_FILTER_ALL;
  return ioctl(fd, SIOCSHWTSTAMP, &ifr) == 0 && cfg.rx_filter != HWTSTAMP_FILTER_NONE;
}

}  // namespace

ProbeSocket::ProbeSocket() = default;

ProbeSocket::~ProbeSocket() {
  if (fd_ >= 0) close(fd_);
}

bool ProbeSocket::open(const std::string& addr, uint16_t port, bool want_hw, std::string* err,
                       bool reuse_addr) {
  sockaddr_in sa;
  if (!parse_ipv4(addr, port, &sa)) {
    if (err) *err = "not an IPv4 address: " + addr;
    return false;
  }
  fd_ = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    if (err) *err = std::string("socket: ") + strerror(errno);
    return false;
  }
  int one = 1;
  if (reuse_addr) setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  socklen_t len = sizeof(sa);
  if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    if (err) *err = "bind " + addr + ":" + std::to_string(port) + ": " + strerror(errno);
    close(fd_);
    fd_ = -1;
    return false;
  }
  port_ = ntohs(sa.sin_port);
  // Probes are the lowest-latency traffic we can make them.
  int prio = 6;
  setsockopt(fd_, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio));
  ifname_ = ifname_of(sa.sin_addr);

  uint32_t flags = SOF_TIMESTAMPING_OPT_ID | SOF_TIMESTAMPING_OPT_TSONLY;
  int phc = want_hw && !ifname_.empty() ? hw_phc_index(fd_, ifname_) : -1;
  if (phc >= 0 && enable_hw(fd_, ifname_)) {
    auto clk = std::make_unique<PhcClock>();
    std::string perr;
    if (clk->open(phc, &perr)) {
      phc_ = std::move(clk);
      flags |= SOF_TIMESTAMPING_TX_HARDWARE | SOF_TIMESTAMPING_RX_HARDWARE |
               SOF_TIMESTAMPING_RAW_HARDWARE;
      mode_ = StampMode::hardware;
    }
  }
  if (mode_ != StampMode::hardware)
    flags |= SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE | SOF_TIMESTAMPING_SOFTWARE;
  if (setsockopt(fd_, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags)) == 0) {
    if (mode_ != StampMode::hardware) mode_ = StampMode::software;
  } else {
    mode_ = StampMode::user;
    phc_.reset();
  }
  next_id_ = 0;
  return true;
}

int64_t ProbeSocket::send(const sockaddr_in& to, std::span<const uint8_t> data) {
  ssize_t n = sendto(fd_, data.data(), data.size(), 0, reinterpret_cast<const sockaddr*>(&to),
                     sizeof(to));
  if (n != ssize_t(data.size())) return -1;
  return next_id_++;
}

int64_t ProbeSocket::stamp_from_cmsg(void* mp) const {
  auto* msg = static_cast<msghdr*>(mp);
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SO_TIMESTAMPING) continue;
    scm_timestamping ts;
    std::memcpy(&ts, CMSG_DATA(c), sizeof(ts));
    if (mode_ == StampMode::hardware && (ts.ts[2].tv_sec || ts.ts[2].tv_nsec))
      return phc_->to_system(int64_t(ts.ts[2].tv_sec) * 1'000'000'000 + ts.ts[2].tv_nsec);
    if (ts.ts[0].tv_sec || ts.ts[0].tv_nsec)
      return int64_t(ts.ts[0].tv_sec) * 1'000'000'000 + ts.ts[0].tv_nsec;
  }
  return 0;
}

void ProbeSocket::send_pair(const sockaddr_in& to, std::span<const uint8_t> d0,
                            std::span<const uint8_t> d1, int64_t ids[2]) {
  const sockaddr_in* dest[2] = {&to, &to};
  const std::span<const uint8_t> data[2] = {d0, d1};
  send_many(dest, data, ids);
}

void ProbeSocket::send_many(std::span<const sockaddr_in* const> to, std::span<const std::span<const uint8_t>> data,
                            int64_t* ids) {
  const size_t n = std::min(to.size(), data.size());
  std::vector<iovec> iov(n);
  std::vector<mmsghdr> m(n);
  for (size_t i = 0; i < n; i++) {
    iov[i] = {const_cast<uint8_t*>(data[i].data()), data[i].size()};
    m[i] = {};
    m[i].msg_hdr.msg_name = const_cast<sockaddr_in*>(to[i]);
    m[i].msg_hdr.msg_namelen = sizeof(sockaddr_in);
    m[i].msg_hdr.msg_iov = &iov[i];
    m[i].msg_hdr.msg_iovlen = 1;
  }
  int sent = n ? sendmmsg(fd_, m.data(), unsigned(n), 0) : 0;
  // Every datagram sent counts in the kernel's stamp ids, whole or not.
  for (size_t i = 0; i < n; i++)
    ids[i] = int(i) < sent ? (m[i].msg_len == iov[i].iov_len ? next_id_++ : (next_id_++, -1)) : -1;
}

void ProbeSocket::drain_send_stamps(const std::function<void(int64_t, int64_t)>& fn) {
  constexpr int kBatch = 8;
  char ctrl[kBatch][512];
  char dummy[kBatch][64];
  iovec iov[kBatch];
  mmsghdr m[kBatch];
  for (int round = 0; round < 32; round++) {
    for (int i = 0; i < kBatch; i++) {
      iov[i] = {dummy[i], sizeof(dummy[i])};
      m[i] = {};
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_control = ctrl[i];
      m[i].msg_hdr.msg_controllen = sizeof(ctrl[i]);
    }
    int n = recvmmsg(fd_, m, kBatch, MSG_ERRQUEUE | MSG_DONTWAIT, nullptr);
    if (n <= 0) return;
    for (int k = 0; k < n; k++) {
      msghdr& msg = m[k].msg_hdr;
      int64_t stamp = stamp_from_cmsg(&msg);
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
        if (!((c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) ||
              (c->cmsg_level == SOL_IPV6 && c->cmsg_type == IPV6_RECVERR)))
          continue;
        sock_extended_err ee;
        std::memcpy(&ee, CMSG_DATA(c), sizeof(ee));
        if (ee.ee_errno == ENOMSG && ee.ee_origin == SO_EE_ORIGIN_TIMESTAMPING && stamp)
          fn(int64_t(ee.ee_data), stamp);
      }
    }
    if (n < kBatch) return;  // the queue was empty after these: no call to learn it
  }
}

int ProbeSocket::recv_all(int max,
                          const std::function<void(std::span<const uint8_t>, const sockaddr_in&, int64_t)>& fn) {
  constexpr int kBatch = 8;
  // On the stack: a thread_local this size overflowed the static TLS block
  // that libshunt's initial-exec variables put it in (dlopen failed).
  uint8_t buf[kBatch][kMaxDatagram];
  char ctrl[kBatch][512];
  sockaddr_in from[kBatch];
  iovec iov[kBatch];
  mmsghdr m[kBatch];
  int got = 0;
  while (got < max) {
    int want = std::min(kBatch, max - got);
    for (int i = 0; i < want; i++) {
      iov[i] = {buf[i], sizeof(buf[i])};
      m[i] = {};
      m[i].msg_hdr.msg_name = &from[i];
      m[i].msg_hdr.msg_namelen = sizeof(from[i]);
      m[i].msg_hdr.msg_iov = &iov[i];
      m[i].msg_hdr.msg_iovlen = 1;
      m[i].msg_hdr.msg_control = ctrl[i];
      m[i].msg_hdr.msg_controllen = sizeof(ctrl[i]);
    }
    int n = recvmmsg(fd_, m, unsigned(want), MSG_DONTWAIT | MSG_TRUNC, nullptr);
    if (n <= 0) break;
    for (int k = 0; k < n; k++) {
      int64_t rx = mode_ == StampMode::user ? realtime_now() : stamp_from_cmsg(&m[k].msg_hdr);
      // Longer than the buffer: cut to it, still longer than any probe.
      fn({buf[k], std::min<size_t>(m[k].msg_len, kMaxDatagram)}, from[k], rx);
    }
    got += n;
    if (n < want) break;  // nothing more was waiting
  }
  return got;
}

void ProbeSocket::refresh_phc() {
  if (phc_) phc_->refresh();
}

}  // namespace shunt::clocksync
