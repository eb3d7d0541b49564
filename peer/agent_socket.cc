#include "peer/agent_socket.h"

namespace shunt::agent {

namespace {
std::string& path() {
  static auto* p = new std::string;  // built on first use, never freed: see core/log.cc
  return *p;
}
}  // namespace

std::string socket_path() { return path(); }
void set_socket_path(const std::string& p) { path() = p; }

}  // namespace shunt::agent
