#include "agent/control_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/log.h"
#include "core/mono.h"
#include "peer/control.h"

namespace shunt::peer {

void ControlServer::drop(Client& c) {
  ::close(c.fd);
  c.fd = -1;
  buffered_ -= c.in.size() + c.out.size();
  c.in.clear();
  c.out.clear();
}

// Sends what it can of the client's answer without waiting; false when the
// client is gone.
bool ControlServer::flush(Client& c, int64_t now) {
  while (!c.out.empty()) {
    ssize_t r = ::send(c.fd, c.out.data(), c.out.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r > 0) {
      c.out.erase(0, static_cast<size_t>(r));
      buffered_ -= static_cast<size_t>(r);
      c.active_ms = now;
      if (c.out.empty()) c.deadline_ms = now + kClientMs;  // the next request's time starts
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    return r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
  }
  return true;
}

// Answers the client's complete lines, one at a time: the next once the
// last answer is out (a client that does not read waits, and goes at its
// deadline).
void ControlServer::answer_lines(Client& c, int64_t now, const Answer& answer) {
  size_t nl;
  while (c.fd >= 0 && c.out.empty() && (nl = c.in.find('\n')) != std::string::npos && nl <= kMaxRequestLine) {
    std::string line = c.in.substr(0, nl);
    c.in.erase(0, nl + 1);
    buffered_ -= nl + 1;
    c.out = answer(line, c.uid);
    buffered_ += c.out.size();
    c.deadline_ms = now + kClientMs + static_cast<int64_t>(c.out.size() >> 10);  // and 1 ms a KiB
    if (!flush(c, now)) drop(c);
  }
  // What is left is a line in part, or lines behind an answer not sent.
  if (c.fd >= 0 && c.in.size() > kMaxRequestLine && c.in.find('\n') > kMaxRequestLine) {
    log::once(LogLevel::warn, "agent-long-line",
              fmt::format("host agent: dropped a client sending a line over {} bytes", kMaxRequestLine));
    drop(c);
  }
}

void ControlServer::read(Client& c, int64_t now, const Answer& answer) {
  char buf[65536];
  ssize_t r = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (r <= 0) return drop(c);
  if (buffered_ + static_cast<size_t>(r) > kMaxBuffered) {
    log::once(LogLevel::warn, "agent-buffered",
              fmt::format("host agent: dropped a client: the control socket's clients hold {} bytes", kMaxBuffered));
    return drop(c);
  }
  c.in.append(buf, static_cast<size_t>(r));
  buffered_ += static_cast<size_t>(r);
  c.active_ms = now;
  answer_lines(c, now, answer);
}

// A new connection: refused unless it is the agent's own uid's or root's;
// when the table is full, the client idle longest makes room.
void ControlServer::take(int fd, int64_t now) {
  ucred cred{};
  socklen_t cl = sizeof cred;
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0 || (cred.uid != 0 && cred.uid != geteuid())) {
    static const char kRefused[] = "{\"error\":\"the host agent serves its own user and root only\"}\n";
    (void)!::send(fd, kRefused, sizeof kRefused - 1, MSG_DONTWAIT | MSG_NOSIGNAL);
    ::close(fd);
    log::once(LogLevel::warn, "agent-other-uid",
              fmt::format("host agent: refused a connection from uid {} (only {} and root are served)", cred.uid,
                          geteuid()));
    return;
  }
  if (clients_.size() >= kMaxClients) {
    auto idle = std::min_element(clients_.begin(), clients_.end(),
                                 [](const Client& a, const Client& b) { return a.active_ms < b.active_ms; });
    drop(*idle);
    clients_.erase(idle);
  }
  clients_.push_back({fd, cred.uid, "", "", now + kClientMs, now});
}

void ControlServer::serve(int timeout_ms, const Answer& answer) {
  int64_t now = mono_ms();
  std::vector<pollfd> fds{{listen_fd_, POLLIN, 0}};
  for (auto& c : clients_) {
    fds.push_back({c.fd, static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
    timeout_ms = static_cast<int>(std::clamp<int64_t>(c.deadline_ms - now, 0, timeout_ms));
  }
  int n = poll(fds.data(), fds.size(), timeout_ms);
  now = mono_ms();
  for (size_t i = 1; n > 0 && i < fds.size(); i++) {
    if (!fds[i].revents) continue;
    Client& c = clients_[i - 1];
    try {
      if (c.out.empty()) {
        read(c, now, answer);
      } else if (flush(c, now)) {
        answer_lines(c, now, answer);  // those that waited for this answer to go out
      } else {
        drop(c);
      }
    } catch (const std::exception& e) {  // bad_alloc, at worst: this client goes, the others stay
      log::once(LogLevel::warn, "agent-client", std::string("host agent: dropped a client: ") + e.what());
      if (c.fd >= 0) drop(c);
    }
  }
  for (auto& c : clients_)
    if (c.fd >= 0 && now >= c.deadline_ms) drop(c);
  std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
  if (n > 0 && (fds[0].revents & POLLIN)) {
    for (int k = 0, fd; k < kAcceptsPerRound; k++) {
      if ((fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK)) < 0) break;
      take(fd, now);
    }
  }
}

void ControlServer::forget() {
  for (auto& c : clients_) ::close(c.fd);
  clients_.clear();
  buffered_ = 0;
  listen_fd_ = -1;
}

}  // namespace shunt::peer
