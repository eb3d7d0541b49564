#include "interpose/socket/mptcp_pm.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libmnl/libmnl.h>
#include <linux/genetlink.h>
#include <linux/mptcp.h>

#include <cstring>

namespace shunt::sock {

namespace {
struct Parsed {
  std::vector<Endpoint>* dump = nullptr;
  uint32_t* limits = nullptr;  // [subflows, add_addr_accepted]
  uint16_t family_id = 0;
};

Endpoint parse_endpoint(const nlattr* nest) {
  Endpoint e;
  auto* end = static_cast<const char*>(mnl_attr_get_payload(nest)) + mnl_attr_get_payload_len(nest);
  for (auto* a = static_cast<const nlattr*>(mnl_attr_get_payload(nest));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    switch (mnl_attr_get_type(a)) {
      case MPTCP_PM_ADDR_ATTR_FAMILY: e.family = mnl_attr_get_u16(a); break;
      case MPTCP_PM_ADDR_ATTR_ID: e.id = mnl_attr_get_u8(a); break;
      case MPTCP_PM_ADDR_ATTR_ADDR4: memcpy(&e.addr, mnl_attr_get_payload(a), 4); break;
      case MPTCP_PM_ADDR_ATTR_ADDR6: memcpy(&e.addr, mnl_attr_get_payload(a), 16); break;
      case MPTCP_PM_ADDR_ATTR_PORT: e.port = mnl_attr_get_u16(a); break;
      case MPTCP_PM_ADDR_ATTR_FLAGS: e.flags = mnl_attr_get_u32(a); break;
      case MPTCP_PM_ADDR_ATTR_IF_IDX: e.ifindex = static_cast<int>(mnl_attr_get_u32(a)); break;
    }
  }
  return e;
}

int on_message(const nlmsghdr* nlh, void* data) {
  auto* p = static_cast<Parsed*>(data);
  auto* end = reinterpret_cast<const char*>(mnl_nlmsg_get_payload_tail(nlh));
  for (auto* a = static_cast<const nlattr*>(mnl_nlmsg_get_payload_offset(nlh, sizeof(genlmsghdr)));
       mnl_attr_ok(a, static_cast<int>(end - reinterpret_cast<const char*>(a))); a = mnl_attr_next(a)) {
    int t = mnl_attr_get_type(a);
    if (nlh->nlmsg_type == GENL_ID_CTRL) {
      if (t == CTRL_ATTR_FAMILY_ID) p->family_id = mnl_attr_get_u16(a);
      continue;
    }
    if (t == MPTCP_PM_ATTR_ADDR && p->dump) p->dump->push_back(parse_endpoint(a));
    if (t == MPTCP_PM_ATTR_SUBFLOWS && p->limits) p->limits[0] = mnl_attr_get_u32(a);
    if (t == MPTCP_PM_ATTR_RCV_ADD_ADDRS && p->limits) p->limits[1] = mnl_attr_get_u32(a);
  }
  return MNL_CB_OK;
}

void put_endpoint(nlmsghdr* nlh, const Endpoint& e, bool with_flags) {
  nlattr* nest = mnl_attr_nest_start(nlh, MPTCP_PM_ATTR_ADDR | NLA_F_NESTED);
  mnl_attr_put_u16(nlh, MPTCP_PM_ADDR_ATTR_FAMILY, e.family);
  if (e.id) mnl_attr_put_u8(nlh, MPTCP_PM_ADDR_ATTR_ID, e.id);
  if (e.family == AF_INET) mnl_attr_put(nlh, MPTCP_PM_ADDR_ATTR_ADDR4, 4, &e.addr);
  else mnl_attr_put(nlh, MPTCP_PM_ADDR_ATTR_ADDR6, 16, &e.addr);
  if (e.port) mnl_attr_put_u16(nlh, MPTCP_PM_ADDR_ATTR_PORT, e.port);
  if (with_flags) mnl_attr_put_u32(nlh, MPTCP_PM_ADDR_ATTR_FLAGS, e.flags);
  if (e.ifindex) mnl_attr_put_u32(nlh, MPTCP_PM_ADDR_ATTR_IF_IDX, static_cast<uint32_t>(e.ifindex));
  mnl_attr_nest_end(nlh, nest);
}
}  // namespace

std::string Endpoint::addr_str() const {
  char buf[INET6_ADDRSTRLEN] = "";
  inet_ntop(family, &addr, buf, sizeof buf);
  return buf;
}

std::string Endpoint::ip_command() const {
  std::string s = "ip mptcp endpoint add " + addr_str();
  if (flags & MPTCP_PM_ADDR_FLAG_SIGNAL) s += " signal";
  if (flags & MPTCP_PM_ADDR_FLAG_SUBFLOW) s += " subflow";
  if (flags & MPTCP_PM_ADDR_FLAG_BACKUP) s += " backup";
  if (port) s += " port " + std::to_string(port);
  return s;
}

bool parse_addr(const std::string& text, Endpoint* e) {
  *e = Endpoint{};
  if (inet_pton(AF_INET, text.c_str(), &e->addr) == 1) return true;
  e->family = AF_INET6;
  return inet_pton(AF_INET6, text.c_str(), &e->addr) == 1;
}

PathManager::~PathManager() {
  if (nl_) mnl_socket_close(nl_);
}

bool PathManager::request(int cmd, uint16_t flags, const std::vector<Endpoint>* addr, const uint32_t* limits,
                          std::vector<Endpoint>* dump, uint32_t* lim_out, std::string* err) {
  alignas(nlmsghdr) char buf[MNL_SOCKET_BUFFER_SIZE];
  nlmsghdr* nlh = mnl_nlmsg_put_header(buf);
  bool ctrl = family_ == 0;
  nlh->nlmsg_type = ctrl ? GENL_ID_CTRL : family_;
  nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | flags;
  uint32_t seq = nlh->nlmsg_seq = seq_++;
  auto* g = static_cast<genlmsghdr*>(mnl_nlmsg_put_extra_header(nlh, sizeof(genlmsghdr)));
  g->cmd = static_cast<uint8_t>(cmd);
  g->version = ctrl ? 1 : MPTCP_PM_VER;
  if (ctrl) mnl_attr_put_strz(nlh, CTRL_ATTR_FAMILY_NAME, MPTCP_PM_NAME);
  if (addr)
    for (auto& e : *addr) put_endpoint(nlh, e, cmd != MPTCP_PM_CMD_DEL_ADDR);
  if (limits) {
    mnl_attr_put_u32(nlh, MPTCP_PM_ATTR_SUBFLOWS, limits[0]);
    mnl_attr_put_u32(nlh, MPTCP_PM_ATTR_RCV_ADD_ADDRS, limits[1]);
  }
  if (mnl_socket_sendto(nl_, nlh, nlh->nlmsg_len) < 0) {
    errno_ = errno;
    *err = std::string("netlink send: ") + strerror(errno);
    return false;
  }
  Parsed p{dump, lim_out};
  for (;;) {
    ssize_t n = mnl_socket_recvfrom(nl_, buf, sizeof buf);
    if (n < 0) {
      errno_ = errno;
      *err = std::string("netlink receive: ") + strerror(errno);
      return false;
    }
    int r = mnl_cb_run(buf, n, seq, mnl_socket_get_portid(nl_), on_message, &p);
    if (r < 0) {
      errno_ = errno;
      *err = strerror(errno);
      return false;
    }
    if (r == MNL_CB_STOP) break;
  }
  if (ctrl) family_ = p.family_id;
  errno_ = 0;
  return true;
}

bool PathManager::open(std::string* err) {
  nl_ = mnl_socket_open(NETLINK_GENERIC);
  if (!nl_ || mnl_socket_bind(nl_, 0, MNL_SOCKET_AUTOPID) < 0) {
    *err = std::string("generic netlink: ") + strerror(errno);
    return false;
  }
  if (!request(CTRL_CMD_GETFAMILY, 0, nullptr, nullptr, nullptr, nullptr, err) || family_ == 0) {
    *err = "no mptcp_pm generic netlink family (" + *err + ")";
    return false;
  }
  return true;
}

bool PathManager::get_limits(uint32_t* subflows, uint32_t* accepted, std::string* err) {
  uint32_t l[2] = {0, 0};
  if (!request(MPTCP_PM_CMD_GET_LIMITS, 0, nullptr, nullptr, nullptr, l, err)) return false;
  *subflows = l[0];
  *accepted = l[1];
  return true;
}

bool PathManager::set_limits(uint32_t subflows, uint32_t accepted, std::string* err) {
  uint32_t l[2] = {subflows, accepted};
  return request(MPTCP_PM_CMD_SET_LIMITS, 0, nullptr, l, nullptr, nullptr, err);
}

bool PathManager::endpoints(std::vector<Endpoint>* out, std::string* err) {
  out->clear();
  return request(MPTCP_PM_CMD_GET_ADDR, NLM_F_DUMP, nullptr, nullptr, out, nullptr, err);
}

bool PathManager::add(const Endpoint& e, std::string* err) {
  std::vector<Endpoint> v{e};
  return request(MPTCP_PM_CMD_ADD_ADDR, 0, &v, nullptr, nullptr, nullptr, err);
}

bool PathManager::remove(const Endpoint& e, std::string* err) {
  std::vector<Endpoint> v{e};
  return request(MPTCP_PM_CMD_DEL_ADDR, 0, &v, nullptr, nullptr, nullptr, err);
}

bool PathManager::set_backup(const Endpoint& e, bool backup, std::string* err) {
  Endpoint c = e;
  c.flags = backup ? MPTCP_PM_ADDR_FLAG_BACKUP : 0;
  c.port = 0;  // the kernel matches subflows on the address alone
  c.ifindex = 0;
  std::vector<Endpoint> v{c};
  return request(MPTCP_PM_CMD_SET_FLAGS, 0, &v, nullptr, nullptr, nullptr, err);
}

}  // namespace shunt::sock
