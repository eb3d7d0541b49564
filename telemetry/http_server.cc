#include "telemetry/http_server.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "core/mono.h"

namespace shunt::telemetry {

HttpServer::HttpServer(int listen_fd, Handler handler, Limits limits)
    : lfd_(listen_fd), handler_(std::move(handler)), limits_(limits) {}

HttpServer::~HttpServer() {
  for (auto& c : clients_)
    if (c.fd >= 0) ::close(c.fd);
}

void HttpServer::serve(int wait_ms) {
  int64_t now = mono_ms(), wait = wait_ms;
  std::vector<pollfd> fds{{lfd_, POLLIN, 0}};
  for (auto& c : clients_) {
    fds.push_back({c.fd, static_cast<short>(c.answering ? POLLOUT : POLLIN), 0});
    wait = std::min(wait, c.deadline - now + 1);
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(std::max<int64_t>(wait, 0))) < 0) return;  // (EINTR)
  now = mono_ms();
  // The clients first, then new ones: a head that came is answered before
  // newer connections can push its client out.
  for (size_t i = 1; i < fds.size(); i++) {
    Client& c = clients_[i - 1];
    const short ev = fds[i].revents;
    if (!c.answering && (ev & (POLLIN | POLLHUP | POLLERR))) read_head(c, now);
    if (c.fd >= 0 && c.answering && (ev & (POLLOUT | POLLHUP | POLLERR))) send_some(c);
    if (c.fd >= 0 && now > c.deadline) ::close(c.fd), c.fd = -1;
  }
  if (fds[0].revents & POLLIN) accept_new(now);
  std::erase_if(clients_, [](const Client& c) { return c.fd < 0; });
}

void HttpServer::accept_new(int64_t now) {
  for (size_t k = 0; k < limits_.max_clients; k++) {
    int fd = ::accept4(lfd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) return;
    size_t open = 0;
    Client* idlest = nullptr;  // the one waiting longest for its head
    for (auto& c : clients_) {
      if (c.fd < 0) continue;
      open++;
      if (!c.answering && (!idlest || c.since < idlest->since)) idlest = &c;
    }
    if (open >= limits_.max_clients) {
      if (!idlest) {  // every one is taking an answer: the new one waits for none
        ::close(fd);
        continue;
      }
      ::close(idlest->fd);
      idlest->fd = -1;
    }
    clients_.push_back({fd, now, now + limits_.head_ms, {}, {}, 0, false});
  }
}

void HttpServer::read_head(Client& c, int64_t now) {
  char buf[4096];
  ssize_t n = ::recv(c.fd, buf, std::min(sizeof buf, limits_.max_head - c.in.size()), MSG_DONTWAIT);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    ::close(c.fd);
    c.fd = -1;
    return;
  }
  if (n > 0) c.in.append(buf, static_cast<size_t>(n));
  const bool whole = c.in.find("\r\n\r\n") != std::string::npos || c.in.find("\n\n") != std::string::npos;
  if (!whole && c.in.size() < limits_.max_head) return;
  c.out = answer(whole ? c.in : "");
  c.in = std::string();
  c.answering = true;
  c.deadline = now + limits_.send_ms;
  send_some(c);
}

void HttpServer::send_some(Client& c) {
  while (c.sent < c.out.size()) {
    ssize_t n = ::send(c.fd, c.out.data() + c.sent, c.out.size() - c.sent, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (n > 0) {
      c.sent += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    break;
  }
  ::close(c.fd);  // all sent, or the client is gone
  c.fd = -1;
}

std::string HttpServer::answer(const std::string& head) {
  const std::string line = head.substr(0, head.find_first_of("\r\n"));
  const std::string method = line.substr(0, line.find(' '));
  std::string target = line.size() > method.size() ? line.substr(method.size() + 1) : "";
  target = target.substr(0, target.find(' '));
  HttpAnswer a;
  if (head.empty()) {
    a = {"431 Request Header Fields Too Large", "text/plain", "request head over " + std::to_string(limits_.max_head) + " bytes\n"};
  } else if (method != "GET" && method != "HEAD") {
    a = {"405 Method Not Allowed", "text/plain", "only GET and HEAD\n"};
  } else {
    try {
      a = handler_(method, target.substr(0, target.find('?')));
    } catch (const std::exception& e) {  // (out of memory): the client hears it, the thread goes on
      a = {"500 Internal Server Error", "text/plain", std::string(e.what()) + "\n"};
    }
  }
  std::string out = "HTTP/1.0 " + a.status + "\r\nContent-Type: " + a.type +
                    "\r\nContent-Length: " + std::to_string(a.body.size()) + "\r\nConnection: close\r\n\r\n";
  if (method != "HEAD") out += a.body;
  return out;
}

}  // namespace shunt::telemetry
