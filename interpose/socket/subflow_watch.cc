#include "interpose/socket/subflow_watch.h"

#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/inet_diag.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>

#include <cstring>

namespace shunt::sock {

namespace {
// No ACK for this long with data outstanding and at least one RTO fired:
// the subflow is stuck, not merely slow.
constexpr uint32_t kStallMs = 300;

struct Walk {
  const std::vector<in6_addr>* addrs;
  std::vector<AddrHealth>* out;
  int family;
};

int on_socket(const nlmsghdr* nlh, void* data) {
  auto* w = static_cast<Walk*>(data);
  auto* msg = static_cast<const inet_diag_msg*>(mnl_nlmsg_get_payload(nlh));
  size_t alen = w->family == AF_INET ? 4 : 16;
  int idx = -1;
  for (size_t i = 0; i < w->addrs->size(); i++)
    if (memcmp(&(*w->addrs)[i], msg->id.idiag_src, alen) == 0) idx = static_cast<int>(i);
  if (idx < 0) return MNL_CB_OK;
  auto* end = reinterpret_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
  for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(inet_diag_msg)));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    if (mnl_attr_get_type(a) != INET_DIAG_INFO) continue;
    tcp_info ti{};
    memcpy(&ti, mnl_attr_get_payload(a), std::min<size_t>(sizeof ti, mnl_attr_get_payload_len(a)));
    AddrHealth& h = (*w->out)[idx];
    if (ti.tcpi_retransmits >= 1) h.backing_off++;
    if (ti.tcpi_unacked == 0) break;
    h.busy++;
    // Nothing new sent for a while either: a subflow that just got fresh
    // data after a long silence (a restored rail) is not stuck yet.
    if (ti.tcpi_retransmits >= 1 && ti.tcpi_last_ack_recv >= kStallMs && ti.tcpi_last_data_sent >= kStallMs)
      h.stalled++;
    break;
  }
  return MNL_CB_OK;
}
}  // namespace

bool subflow_health(const std::vector<in6_addr>& addrs, int family, std::vector<AddrHealth>* out,
                    std::string* err) {
  out->assign(addrs.size(), AddrHealth{});
  for (size_t i = 0; i < addrs.size(); i++) (*out)[i].addr = addrs[i];
  mnl_socket* nl = mnl_socket_open(NETLINK_SOCK_DIAG);
  if (!nl || mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
    *err = std::string("sock_diag: ") + strerror(errno);
    if (nl) mnl_socket_close(nl);
    return false;
  }
  alignas(nlmsghdr) char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  nlh->nlmsg_type = SOCK_DIAG_BY_FAMILY;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
  uint32_t seq = nlh->nlmsg_seq = 1;
  auto* req = static_cast<inet_diag_req_v2*>(mnl_nlmsg_put_extra_header(nlh, sizeof(inet_diag_req_v2)));
  req->sdiag_family = static_cast<uint8_t>(family);
  req->sdiag_protocol = IPPROTO_TCP;
  req->idiag_states = 1u << 1;  // TCP_ESTABLISHED
  req->idiag_ext = 1u << (INET_DIAG_INFO - 1);
  bool ok = mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) >= 0;
  Walk w{&addrs, out, family};
  while (ok) {
    ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof buf);
    if (n < 0) {
      ok = false;
      break;
    }
    int r = mnl_cb_run(buf, n, seq, mnl_socket_get_portid(nl), on_socket, &w);
    if (r < 0) ok = false;
    if (r <= MNL_CB_STOP) break;
  }
  if (!ok) *err = std::string("sock_diag dump: ") + strerror(errno);
  mnl_socket_close(nl);
  return ok;
}

bool look_again_soon(const std::vector<RailLook>& rails) {
  for (const auto& r : rails) {
    if (r.backup && r.probes_dead) continue;
    if (r.backup || r.health.busy > 0 || r.health.backing_off > 0) return true;
  }
  return false;
}

}  // namespace shunt::sock
