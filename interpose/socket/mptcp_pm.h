// The kernel's MPTCP path manager over generic netlink ("mptcp_pm", libmnl):
// endpoints and limits of this network namespace. Changing them needs
// CAP_NET_ADMIN; reading them does not.
#pragma once
#include <netinet/in.h>

#include <cstdint>
#include <string>
#include <vector>

struct mnl_socket;

namespace shunt::sock {

struct Endpoint {
  uint8_t id = 0;
  int family = AF_INET;
  in6_addr addr{};  // IPv4 in the first 4 bytes
  uint16_t port = 0;
  uint32_t flags = 0;  // MPTCP_PM_ADDR_FLAG_*
  int ifindex = 0;
  std::string addr_str() const;
  // `ip mptcp endpoint add ...`, for people fixing it by hand.
  std::string ip_command() const;
};

bool parse_addr(const std::string& text, Endpoint* e);

class PathManager {
 public:
  PathManager() = default;
  ~PathManager();
  PathManager(const PathManager&) = delete;
  PathManager& operator=(const PathManager&) = delete;

  bool open(std::string* err);
  bool get_limits(uint32_t* subflows, uint32_t* add_addr_accepted, std::string* err);
  bool set_limits(uint32_t subflows, uint32_t add_addr_accepted, std::string* err);
  bool endpoints(std::vector<Endpoint>* out, std::string* err);
  bool add(const Endpoint& e, std::string* err);
  bool remove(const Endpoint& e, std::string* err);
  // Sets or clears the backup flag of the endpoint (by id and address); the
  // kernel applies it to every subflow on that address and tells the peer.
  bool set_backup(const Endpoint& e, bool backup, std::string* err);
  // errno of the last failed request (EPERM without CAP_NET_ADMIN).
  int last_errno() const { return errno_; }

 private:
  struct Reply;
  bool request(int cmd, uint16_t flags, const std::vector<Endpoint>* addr, const uint32_t* limits,
               std::vector<Endpoint>* dump, uint32_t* lim_out, std::string* err);
  ::mnl_socket* nl_ = nullptr;
  uint16_t family_ = 0;
  uint32_t seq_ = 1;
  int errno_ = 0;
};

}  // namespace shunt::sock
