// shunt-peer: checks the peer channel from this host to another host's
// agent, with the job key of this environment (SHUNT_JOB_KEY): it connects,
// both ends prove they hold the key, and the remote agent answers a ping.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <iostream>

#include "peer/channel.h"
#include "tools/common/cli_exit.h"

int main(int argc, char** argv) {
  CLI::App app{"shunt-peer: reach another host's shunt agent over the peer channel"};
  std::string addr;
  int port = 7472, timeout_ms = 3000;
  bool json = false;
  auto* ping = app.add_subcommand("ping", "Authenticate to ADDR's agent and ask it who it is");
  ping->add_option("addr", addr, "IPv4 address of the peer host")->required();
  ping->add_option("--port", port, "Its SHUNT_PEER_PORT")->check(CLI::Range(1, 65535));
  ping->add_option("--timeout", timeout_ms, "Milliseconds to wait")->check(CLI::Range(1, 600000));
  ping->add_flag("--json", json, "JSON output");
  app.set_version_flag("--version", std::string("shunt-peer ") + SHUNT_VERSION);
  app.require_subcommand(1);
  if (int rc = shunt::cli::parse(app, argc, argv); rc >= 0) return rc;
  const char* key = getenv("SHUNT_JOB_KEY");
  if (!key || !*key) {
    std::cerr << "shunt-peer: SHUNT_JOB_KEY is not set; the peer channel needs the job's key\n";
    return 2;
  }
  std::string err;
  auto ans = shunt::peer::call(addr, port, shunt::peer::job_key_from(key), {{"cmd", "ping"}}, timeout_ms, &err);
  if (!ans) {
    std::cerr << "shunt-peer: " << err << "\n";
    return 1;
  }
  if (json) std::cout << ans->dump() << "\n";
  else std::cout << "agent " << ans->value("agent_pid", 0) << " on " << ans->value("host", "?") << ", shunt "
                 << ans->value("version", "?") << "\n";
  return ans->contains("error") ? 1 : 0;
}
