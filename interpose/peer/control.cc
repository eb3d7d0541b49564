#include "interpose/peer/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "interpose/core/mono.h"

namespace shunt::peer {

namespace {
bool wait_fd(int fd, short ev, int64_t deadline) {
  for (;;) {
    int left = static_cast<int>(deadline - mono_ms());
    if (left < 0) return false;
    pollfd p{fd, ev, 0};
    int r = poll(&p, 1, left);
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) return false;
  }
}

bool usable_dir(const std::string& d) {
  if (mkdir(d.c_str(), 0755) != 0 && errno != EEXIST) return false;
  struct stat st;
  return stat(d.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && access(d.c_str(), W_OK | X_OK) == 0;
}
}  // namespace

bool read_line(int fd, std::string* line, int timeout_ms) {
  int64_t deadline = mono_ms() + timeout_ms;
  line->clear();
  char c;
  for (;;) {
    ssize_t r = ::recv(fd, &c, 1, MSG_DONTWAIT);
    if (r == 1) {
      if (c == '\n') return true;
      line->push_back(c);
      if (line->size() > kMaxLine) return false;
      continue;
    }
    if (r == 0) return false;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!wait_fd(fd, POLLIN, deadline)) return false;
  }
}

bool write_all(int fd, const std::string& data, int timeout_ms) {
  int64_t deadline = mono_ms() + timeout_ms;
  size_t off = 0;
  while (off < data.size()) {
    ssize_t r = ::send(fd, data.data() + off, data.size() - off, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) {
      off += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return false;
    if (!wait_fd(fd, POLLOUT, deadline)) return false;
  }
  return true;
}

std::optional<nlohmann::json> request(const std::string& path, const nlohmann::json& req,
                                      int timeout_ms, std::string* err) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  if (path.size() >= sizeof a.sun_path) {
    *err = "socket path too long: " + path;
    return std::nullopt;
  }
  memcpy(a.sun_path, path.c_str(), path.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = std::string("socket: ") + strerror(errno);
    return std::nullopt;
  }
  std::optional<nlohmann::json> out;
  std::string line;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    *err = "no agent at " + path + ": " + strerror(errno);
  } else if (!write_all(fd, req.dump() + "\n", timeout_ms)) {
    *err = "cannot send to " + path;
  } else if (!read_line(fd, &line, timeout_ms)) {
    *err = "no answer from " + path;
  } else {
    out = nlohmann::json::parse(line, nullptr, false);
    if (out->is_discarded() || !out->is_object()) {
      *err = "malformed answer from " + path;
      out.reset();
    }
  }
  ::close(fd);
  return out;
}

std::string run_dir(const std::string& configured) {
  if (!configured.empty()) return usable_dir(configured) ? configured : "";
  if (usable_dir("/run/shunt")) return "/run/shunt";
  std::string t = "/tmp/shunt-" + std::to_string(getuid());
  return usable_dir(t) ? t : "";
}

std::string agent_dir(const std::string& configured) {
  if (!configured.empty()) return configured;
  struct stat st;
  if (stat("/run/shunt/agent.sock", &st) == 0 && S_ISSOCK(st.st_mode)) return "/run/shunt";
  if (access("/run/shunt", W_OK | X_OK) == 0) return "/run/shunt";
  return "/tmp/shunt-" + std::to_string(getuid());
}

}  // namespace shunt::peer
