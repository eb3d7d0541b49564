#include "interpose/socket/mptcp_info.h"

#include <arpa/inet.h>
#include <linux/mptcp.h>
#include <netinet/in.h>
#include <linux/tcp.h>
#include <sys/socket.h>

#include <cstring>
#include <string>

#include "interpose/socket/mptcp_upgrade.h"

namespace shunt::sock {

namespace {
constexpr int kMaxSubflows = 8;

std::string addr_str(const sockaddr* a) {
  char buf[INET6_ADDRSTRLEN] = "";
  if (a->sa_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(a);
    inet_ntop(AF_INET, &s->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(s->sin_port));
  }
  if (a->sa_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(a);
    inet_ntop(AF_INET6, &s->sin6_addr, buf, sizeof buf);
    return "[" + std::string(buf) + "]:" + std::to_string(ntohs(s->sin6_port));
  }
  return "";
}

const char* tcp_state(int s) {
  static const char* names[] = {"?",         "established", "syn-sent", "syn-recv", "fin-wait-1", "fin-wait-2",
                                "time-wait", "close",       "close-wait", "last-ack", "listen",    "closing"};
  return s >= 0 && s < 12 ? names[s] : "?";
}

// One MPTCP_TCPINFO or MPTCP_SUBFLOW_ADDRS call: a header, then one element
// per subflow, each `elem` bytes as this build knows them.
template <typename T>
int subflow_array(int fd, int opt, T* out) {
  struct {
    mptcp_subflow_data d;
    T v[kMaxSubflows];
  } buf{};
  buf.d.size_subflow_data = sizeof buf.d;
  buf.d.size_user = sizeof(T);
  socklen_t len = sizeof buf;
  if (getsockopt(fd, kSolMptcp, opt, &buf, &len) != 0) return -1;
  int n = std::min<int>(buf.d.num_subflows, kMaxSubflows);
  if (len < sizeof buf.d + n * sizeof(T)) n = (len - sizeof buf.d) / sizeof(T);
  memcpy(out, buf.v, n * sizeof(T));
  return n;
}
}  // namespace

nlohmann::json mptcp_json(int fd) {
  mptcp_info mi{};
  socklen_t len = sizeof mi;
  if (getsockopt(fd, kSolMptcp, MPTCP_INFO, &mi, &len) != 0) return nullptr;
  nlohmann::json j = {{"fallback", (mi.mptcpi_flags & MPTCP_INFO_FLAG_FALLBACK) != 0},
                      {"token", mi.mptcpi_token},
                      {"joined_subflows", mi.mptcpi_subflows},
                      {"add_addr_accepted", mi.mptcpi_add_addr_accepted},
                      {"write_seq", mi.mptcpi_write_seq},
                      {"snd_una", mi.mptcpi_snd_una},
                      {"rcv_nxt", mi.mptcpi_rcv_nxt}};
  tcp_info ti[kMaxSubflows];
  mptcp_subflow_addrs ad[kMaxSubflows];
  int n = subflow_array(fd, MPTCP_TCPINFO, ti);
  int na = subflow_array(fd, MPTCP_SUBFLOW_ADDRS, ad);
  nlohmann::json subs = nlohmann::json::array();
  for (int i = 0; i < n; i++) {
    const tcp_info& t = ti[i];
    nlohmann::json s = {{"state", tcp_state(t.tcpi_state)},
                        {"rtt_us", t.tcpi_rtt},
                        {"rttvar_us", t.tcpi_rttvar},
                        {"rto_us", t.tcpi_rto},
                        {"backoff", t.tcpi_backoff},
                        {"retransmits", t.tcpi_total_retrans},
                        {"unacked", t.tcpi_unacked},
                        {"bytes_sent", t.tcpi_bytes_sent},
                        {"bytes_acked", t.tcpi_bytes_acked},
                        {"bytes_received", t.tcpi_bytes_received}};
    if (i < na && n == na) {  // the two calls walk the same list; a race can change it
      s["local"] = addr_str(&ad[i].sa_local);
      s["remote"] = addr_str(&ad[i].sa_remote);
    }
    subs.push_back(std::move(s));
  }
  j["subflow"] = std::move(subs);
  return j;
}

}  // namespace shunt::sock
