// One UDP socket per rail with kernel timestamps (SO_TIMESTAMPING).
// Send stamps come back on the error queue, tagged with the kernel's
// per-socket datagram counter (SOF_TIMESTAMPING_OPT_ID), which send() mirrors
// so the caller can match them. Hardware stamps are used when the rail's NIC
// reports them (ETHTOOL_GET_TS_INFO) and its PHC (/dev/ptpN) can be read to
// map them onto the system clock; otherwise software stamps; with neither,
// user-space clock reads (worst, but still a working engine).
#pragma once
#include <netinet/in.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>

namespace shunt::clocksync {

enum class StampMode { user, software, hardware };
const char* to_string(StampMode m);

class PhcClock;

class ProbeSocket {
 public:
  ProbeSocket();
  ~ProbeSocket();
  ProbeSocket(const ProbeSocket&) = delete;
  ProbeSocket& operator=(const ProbeSocket&) = delete;

  // Binds addr:port (port 0: one the kernel picks); `want_hw` allows
  // hardware stamps if the NIC has them. `reuse_addr` sets SO_REUSEADDR (the
  // rail sockets); without it the bind fails while any socket holds the port.
  bool open(const std::string& addr, uint16_t port, bool want_hw, std::string* err,
            bool reuse_addr = true);
  int fd() const { return fd_; }
  uint16_t port() const { return port_; }  // the bound port
  StampMode mode() const { return mode_; }
  const std::string& ifname() const { return ifname_; }

  // Sends one datagram; returns the id its send stamp will carry, or -1.
  int64_t send(const sockaddr_in& to, std::span<const uint8_t> data);
  // Sends a coded pair back to back in one system call (sendmmsg): ids[i]
  // is the id datagram i's send stamp will carry, or -1 if it was not sent.
  void send_pair(const sockaddr_in& to, std::span<const uint8_t> d0, std::span<const uint8_t> d1,
                 int64_t ids[2]);
  // Sends several datagrams in one system call (sendmmsg), in order:
  // ids[i] as above for datagram i (to[i], data[i]).
  void send_many(std::span<const sockaddr_in* const> to, std::span<const std::span<const uint8_t>> data,
                 int64_t* ids);
  // Delivers every queued send stamp as (id, kernel CLOCK_REALTIME ns),
  // several per system call.
  void drain_send_stamps(const std::function<void(int64_t id, int64_t ns)>& fn);
  // Receives what is waiting, up to `max` datagrams, several per system
  // call (recvmmsg): fn(data, from, rx_ns) for each, rx_ns the kernel
  // CLOCK_REALTIME receive stamp (0 if none came); a
  // datagram longer than kMaxDatagram comes cut to that length (longer
  // than any probe, so its parser still rejects it). Returns how many came.
  static constexpr size_t kMaxDatagram = 2048;
  int recv_all(int max, const std::function<void(std::span<const uint8_t>, const sockaddr_in&, int64_t)>& fn);
  // Refreshes the PHC-to-system mapping (hardware mode; call about once a second).
  void refresh_phc();

 private:
  int64_t stamp_from_cmsg(void* msghdr_ptr) const;
  int fd_ = -1;
  uint16_t port_ = 0;
  StampMode mode_ = StampMode::user;
  std::string ifname_;
  int64_t next_id_ = 0;
  std::unique_ptr<PhcClock> phc_;
};

bool parse_ipv4(const std::string& addr, uint16_t port, sockaddr_in* out);

}  // namespace shunt::clocksync
