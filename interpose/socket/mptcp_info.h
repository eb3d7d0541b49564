// What the kernel says about one MPTCP connection: MPTCP_INFO for the
// connection, MPTCP_TCPINFO and MPTCP_SUBFLOW_ADDRS for each subflow
// (getsockopt SOL_MPTCP), as the per-socket "mptcp" object of the stats.
#pragma once
#include <nlohmann/json.hpp>

namespace shunt::sock {

// null when `fd` is no MPTCP socket (or is gone).
nlohmann::json mptcp_json(int fd);

}  // namespace shunt::sock
