// Where this process asks its host agent: the agent's control socket, as
// this process's agent thread found it (agent/agent.cc sets it when that
// thread starts). The parts below the agent (the bundle's setup, steering
// and placement) read it here and ask with peer::request() (control.h),
// without including the agent.
#pragma once
#include <string>

namespace shunt::agent {

std::string socket_path();  // the control socket in force ("" when none)
void set_socket_path(const std::string& path);  // by the agent, when it starts

}  // namespace shunt::agent
