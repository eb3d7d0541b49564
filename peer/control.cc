#include "peer/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/json_text.h"
#include "core/mono.h"

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

// A run directory candidate: used when private_dir(); else refused with a
// line in `refused`, or passed over in silence where `quiet` (missing, or
// not ours where that is to be expected).
bool take_dir(const std::string& d, bool create, bool quiet_foreign, std::string* refused) {
  if (create && mkdir(d.c_str(), 0700) != 0 && errno != EEXIST) {
    if (!quiet_foreign) *refused += "cannot create " + d + ": " + strerror(errno) + "; ";
    return false;
  }
  struct stat st;
  if (lstat(d.c_str(), &st) != 0) return false;  // missing (not created by a reader): no agent there
  if (quiet_foreign && st.st_uid != geteuid()) return false;
  std::string why;
  if (private_dir(d, &why)) return true;
  *refused += "run directory " + d + " refused: " + why + "; ";
  return false;
}

// run_dir() and agent_dir(): the first candidate that is this user's alone;
// where one was refused, the user's runtime directory (systemd makes it
// 0700 at login), so that the processes of the user still meet.
std::string pick_dir(const std::string& configured, bool create, std::string* refused) {
  std::string none;
  if (!refused) refused = &none;
  refused->clear();
  if (!configured.empty()) {
    if (take_dir(configured, create, false, refused)) return configured;
  } else {
    // /run/shunt is root's as a rule: another user passes it over unless
    // it was made that user's.
    const bool root = geteuid() == 0;
    if (take_dir("/run/shunt", create, !root, refused)) return "/run/shunt";
    const std::string tmp = "/tmp/shunt-" + std::to_string(getuid());
    if (take_dir(tmp, create, false, refused)) return tmp;
  }
  if (refused->empty()) return "";
  const char* xdg = getenv("XDG_RUNTIME_DIR");
  std::string why;
  if (!xdg || !*xdg) {
    why = "is not set";
  } else if (xdg[0] != '/') {
    why = "is not an absolute path";
  } else if (private_dir(xdg, &why)) {
    const std::string d = std::string(xdg) + "/shunt";
    std::string also;
    if (take_dir(d, create, false, &also)) {
      *refused += "using " + d + " instead";
      return d;
    }
    *refused += also.empty() ? "no agent in " + d + " either" : also + "no host agent";
    return "";
  } else {
    why = std::string(xdg) + ": " + why;
  }
  *refused += "XDG_RUNTIME_DIR " + why + ", no private directory to use instead: no host agent";
  return "";
}
}  // namespace

bool read_line(int fd, std::string* line, int timeout_ms) {
  int64_t deadline = mono_ms() + timeout_ms;
  line->clear();
  char buf[65536];
  for (;;) {
    // Peeked first, so that nothing past the newline is taken (a byte at a
    // time took a second for a large answer).
    ssize_t r = ::recv(fd, buf, sizeof buf, MSG_DONTWAIT | MSG_PEEK);
    if (r > 0) {
      const char* nl = static_cast<const char*>(memchr(buf, '\n', static_cast<size_t>(r)));
      const size_t take = nl ? static_cast<size_t>(nl - buf) + 1 : static_cast<size_t>(r);
      if (::recv(fd, buf, take, MSG_DONTWAIT) != static_cast<ssize_t>(take)) return false;
      line->append(buf, nl ? take - 1 : take);
      if (line->size() > kMaxLine) return false;
      if (nl) return true;
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
  } else if (!write_all(fd, to_text(req) + "\n", timeout_ms)) {
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

bool private_dir(const std::string& d, std::string* why) {
  struct stat st;
  if (lstat(d.c_str(), &st) != 0) {
    *why = strerror(errno);
    return false;
  }
  if (S_ISLNK(st.st_mode)) *why = "a symbolic link";
  else if (!S_ISDIR(st.st_mode)) *why = "not a directory";
  else if (st.st_uid != geteuid())
    *why = "owned by uid " + std::to_string(st.st_uid) + ", not " + std::to_string(geteuid()) +
           " (another user made it)";
  else if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    char mode[8];
    snprintf(mode, sizeof mode, "%04o", st.st_mode & 07777);
    *why = std::string("writable by other users (mode ") + mode + ")";
  } else
    return true;
  return false;
}

std::string run_dir(const std::string& configured, std::string* refused) {
  return pick_dir(configured, true, refused);
}

std::string agent_dir(const std::string& configured, std::string* refused) {
  std::string d = pick_dir(configured, false, refused);
  if (!d.empty()) return d;
  if (!configured.empty()) return configured;
  return access("/run", W_OK | X_OK) == 0 ? "/run/shunt" : "/tmp/shunt-" + std::to_string(getuid());
}

}  // namespace shunt::peer
