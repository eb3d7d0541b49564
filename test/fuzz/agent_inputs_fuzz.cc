// libFuzzer target for the inputs a process of the job takes from outside
// that the peer channel's and the probe parser's targets do not reach,
// each through its real code (the first byte picks, the rest is the input):
//  - 0: lines on the host agent's control socket (up to 8, split at '\n'),
//    answered by the agent's own handler with every builtin command
//    registered (report, status, members, route-hops, bundle-paths,
//    probing, telemetry, diagnose, ...), as root or as another user (bit 3
//    of the first byte). Every answer is one line of JSON.
//  - 1: bytes a client sends the metrics endpoint (HttpServer, over a unix
//    socket): every answer that comes is an HTTP/1.0 status line and head.
//  - 2: the settings: an environment's "NAME=VALUE" entries, NUL-separated
//    (values may hold newlines), then (after two NUL bytes) a config file's
//    text, through load_config. Every error and warning is one bounded
//    printable line, every error names its variable, any error turns the library
//    off, and the listen address and file patterns parse or are refused.
// Any crash, leak, undefined behaviour, trap or hang is a finding.
//
// route-hops sends datagrams to the addresses it is given: the target moves
// into a network namespace of its own at start (root; none of its
// interfaces is up), and refuses to run where it cannot.
#include <net/if.h>
#include <sched.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "agent/agent.h"
#include "agent/agent_services.h"
#include "core/config.h"
#include "telemetry/http_server.h"

namespace shunt::agent {
void register_builtin_services();  // services.cc
}

using namespace shunt;

namespace {

[[noreturn]] void finding(const char* what) {
  fprintf(stderr, "agent_inputs_fuzz: %s\n", what);
  __builtin_trap();
}

// True when no interface but loopback exists (a fresh network namespace).
bool isolated() {
  struct if_nameindex* ifs = if_nameindex();
  if (!ifs) return false;
  bool only_lo = true;
  for (auto* i = ifs; i->if_index; i++) only_lo = only_lo && strcmp(i->if_name, "lo") == 0;
  if_freenameindex(ifs);
  return only_lo;
}

void control(std::string_view lines, unsigned uid) {
  for (int n = 0; n < 8 && !lines.empty(); n++) {
    const size_t nl = lines.find('\n');
    const std::string line(lines.substr(0, nl));
    lines.remove_prefix(nl == std::string_view::npos ? lines.size() : nl + 1);
    const std::string a = agent::control_answer_for_test(line, uid);
    if (a.empty() || a.back() != '\n' || a.find('\n') != a.size() - 1) finding("a control answer is not one line");
    if (nlohmann::json::parse(a, nullptr, false).is_discarded()) finding("a control answer is not JSON");
  }
}

struct Http {
  int lfd = -1;
  sockaddr_un addr{};
  socklen_t len = 0;
  telemetry::HttpServer* server = nullptr;
  Http() {
    addr.sun_family = AF_UNIX;
    const std::string name = "shunt-fuzz-http-" + std::to_string(getpid());
    memcpy(addr.sun_path + 1, name.data(), name.size());  // abstract: nothing on disk
    len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
    lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, reinterpret_cast<sockaddr*>(&addr), len) != 0 || listen(lfd, 16) != 0)
      finding("no unix socket for the metrics endpoint");
    telemetry::HttpServer::Limits lim;
    lim.max_head = 1024;  // inputs longer than a head reach the limit
    lim.head_ms = 20;     // a head that never ends costs 20 ms, not 2 s
    lim.send_ms = 200;
    server = new telemetry::HttpServer(
        lfd, [](const std::string& method, const std::string& path) {
          return telemetry::HttpAnswer{"200 OK", "text/plain", method + " " + path + "\n"};
        },
        lim);
  }
};

void http(std::string_view bytes) {
  static Http* h = new Http;
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&h->addr), h->len) != 0) finding("no connection to the endpoint");
  // A unix socket takes the whole input at once (the target's -max_len is
  // far below its buffer); the end of the input ends the request.
  if (!bytes.empty() && send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(bytes.size()))
    finding("the input did not fit the socket");
  shutdown(fd, SHUT_WR);
  std::string got;
  for (int i = 0; i < 400; i++) {
    h->server->serve(1);
    char buf[4096];
    ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
    if (n > 0) {
      got.append(buf, static_cast<size_t>(n));
      continue;
    }
    if (n == 0) break;  // the server closed it
  }
  close(fd);
  for (int i = 0; i < 5 && h->server->clients(); i++) h->server->serve(1);
  if (!got.empty() && (got.rfind("HTTP/1.0 ", 0) != 0 || got.find("\r\n\r\n") == std::string::npos))
    finding("an answer that is not HTTP/1.0");
  const std::string_view head = bytes.substr(0, 1024);  // the limit set above
  const bool whole = head.find("\r\n\r\n") != std::string_view::npos || head.find("\n\n") != std::string_view::npos;
  if (got.empty() && (whole || bytes.size() >= 1024)) finding("a whole request head (or one at the limit) was not answered");
}

void settings(std::string_view text) {
  static const std::string conf = "/tmp/shunt-fuzz-conf-" + std::to_string(getpid());
  const size_t cut = text.find(std::string_view("\0\0", 2));
  std::string_view env = text.substr(0, cut), file = cut == std::string_view::npos ? "" : text.substr(cut + 2);
  if (FILE* f = fopen(conf.c_str(), "w")) {
    fwrite(file.data(), 1, file.size(), f);
    fclose(f);
  } else {
    finding("no config file to write");
  }
  std::map<std::string, std::string> vars;
  std::vector<std::string> entries;
  while (!env.empty()) {  // NAME=VALUE entries, NUL-separated as /proc/PID/environ
    const size_t end = env.find('\0');
    std::string_view entry = env.substr(0, end);
    env.remove_prefix(end == std::string_view::npos ? env.size() : end + 1);
    const size_t eq = entry.find('=');
    if (eq == std::string_view::npos || eq == 0) continue;
    std::string name(entry.substr(0, eq)), value(entry.substr(eq + 1));
    if (name == "SHUNT_CONF_FILE") continue;  // the file is the input's: never a path of the host's
    vars[name] = value;
  }
  vars["SHUNT_CONF_FILE"] = conf;
  for (const auto& [k, v] : vars) entries.push_back(k + "=" + v);
  std::vector<char*> environ_list;
  for (auto& e : entries) environ_list.push_back(e.data());
  environ_list.push_back(nullptr);
  std::vector<ConfigError> errors;
  std::vector<std::string> warnings;
  Config c = load_config(
      [&vars](const char* name) -> const char* {
        auto it = vars.find(name);
        return it == vars.end() ? nullptr : it->second.c_str();
      },
      &errors, &warnings, environ_list.data());
  auto one_line = [](const std::string& m) {
    for (unsigned char ch : m)
      if (ch < 0x20 || ch == 0x7f) return false;
    return !m.empty() && m.size() <= 1000;
  };
  for (const auto& e : errors) {
    if (!one_line(e.message)) finding("a settings error is not one bounded printable line");
    if (!e.name.empty() && e.message.find(e.name) == std::string::npos) finding("a settings error does not name its variable");
  }
  for (const auto& w : warnings)
    if (!one_line(w)) finding("a settings warning is not one bounded printable line");
  if (!errors.empty() && c.mode() != Mode::off) finding("a bad setting left the library on");
  std::string host;
  int port = -1;
  if (telemetry::parse_listen_addr(c.str(Param::metrics_addr), &host, &port) && (port < 0 || port > 65535))
    finding("a listen address with a port out of range");
  expand_pattern(c.str(Param::stats_file), 4242);
  expand_pattern(c.str(Param::metrics_textfile), 4242);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  if (unshare(CLONE_NEWNET) != 0 && !isolated()) {
    fprintf(stderr, "agent_inputs_fuzz: run as root (it moves into a network namespace of its own) or in an empty one "
                    "(unshare -n): route-hops sends datagrams to the addresses it is given\n");
    exit(2);
  }
  if (!isolated()) {
    fprintf(stderr, "agent_inputs_fuzz: not in an empty network namespace\n");
    exit(2);
  }
  agent::register_builtin_services();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: control(rest, data[0] & 8 ? 0u : 4242u); break;
    case 1: http(rest); break;
    default: settings(rest); break;
  }
  return 0;
}
