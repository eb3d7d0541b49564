// Socket behaviour an application relies on, checked step by step; run with
// and without libshunt, the output must be the same. Non-blocking connect
// with epoll, accept4 flags, options MPTCP refuses, SO_PROTOCOL, fork after
// connect, sendfile, half-close.
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHECK(c, what)                                                  \
  do {                                                                  \
    if (!(c)) {                                                         \
      printf("FAIL %s: %s\n", what, strerror(errno));                   \
      exit(1);                                                          \
    }                                                                   \
    printf("ok %s\n", what);                                            \
  } while (0)

static int readn(int fd, char* b, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t r = read(fd, b + got, n - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && errno == EAGAIN) { usleep(1000); continue; }
    if (r <= 0) break;
    got += r;
  }
  return (int)got;
}

int main(void) {
  int one = 1, v = 0;
  socklen_t l = sizeof v;
  int ls = socket(AF_INET, SOCK_STREAM, 0);
  CHECK(ls >= 0, "socket");
  CHECK(setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) == 0, "SO_REUSEADDR");
  CHECK(getsockopt(ls, SOL_SOCKET, SO_PROTOCOL, &v, &l) == 0 && v == IPPROTO_TCP, "SO_PROTOCOL is TCP");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  CHECK(bind(ls, (struct sockaddr*)&a, sizeof a) == 0, "bind");
  CHECK(listen(ls, 8) == 0, "listen");
  l = sizeof a;
  getsockname(ls, (struct sockaddr*)&a, &l);

  // An option MPTCP refuses, on a fresh socket, then a non-blocking connect.
  int c = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, IPPROTO_TCP);
  unsigned ut = 5000;
  CHECK(setsockopt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut) == 0, "TCP_USER_TIMEOUT before connect");
  CHECK(setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) == 0, "TCP_NODELAY");
  CHECK((fcntl(c, F_GETFD) & FD_CLOEXEC) && (fcntl(c, F_GETFL) & O_NONBLOCK), "flags kept");
  int r = connect(c, (struct sockaddr*)&a, sizeof a);
  CHECK(r == 0 || errno == EINPROGRESS, "non-blocking connect");
  int ep = epoll_create1(0);
  struct epoll_event ev = {.events = EPOLLOUT, .data.fd = c}, out;
  epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev);
  CHECK(epoll_wait(ep, &out, 1, 5000) == 1 && (out.events & EPOLLOUT), "epoll says writable");
  l = sizeof v;
  CHECK(getsockopt(c, SOL_SOCKET, SO_ERROR, &v, &l) == 0 && v == 0, "SO_ERROR 0");
  int s = accept4(ls, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
  CHECK(s >= 0 && (fcntl(s, F_GETFL) & O_NONBLOCK) && (fcntl(s, F_GETFD) & FD_CLOEXEC), "accept4 flags");
  // Options MPTCP refuses, on connected sockets: accepted, read back.
  unsigned ut2 = 7000;
  CHECK(setsockopt(s, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut2, sizeof ut2) == 0, "TCP_USER_TIMEOUT connected");
  l = sizeof v;
  CHECK(getsockopt(s, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, &l) == 0 && v == 7000, "TCP_USER_TIMEOUT read back");
  CHECK(setsockopt(s, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one) == 0, "TCP_QUICKACK");
  int ttl = 33;
  CHECK(setsockopt(s, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) == 0, "IP_TTL");
  l = sizeof v;
  CHECK(getsockopt(c, IPPROTO_TCP, TCP_USER_TIMEOUT, &v, &l) == 0 && v == 5000, "TCP_USER_TIMEOUT of the client");

  // fork after connect: the child writes on the inherited socket.
  pid_t p = fork();
  if (p == 0) {
    const char m[] = "from-child";
    _exit(write(c, m, sizeof m) == sizeof m ? 0 : 1);
  }
  int st = 0;
  waitpid(p, &st, 0);
  char buf[65536];
  CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child wrote");
  CHECK(readn(s, buf, 11) == 11 && strcmp(buf, "from-child") == 0, "parent read the child's bytes");

  // sendfile of 1 MiB.
  char path[] = "/tmp/shunt-sock-XXXXXX";
  int f = mkstemp(path);
  unlink(path);
  for (int i = 0; i < 16; i++) {
    memset(buf, 'a' + i, sizeof buf);
    if (write(f, buf, sizeof buf) != sizeof buf) return 1;
  }
  off_t off = 0;
  size_t sent = 0;
  while (sent < 16 * 65536) {
    ssize_t n = sendfile(c, f, &off, 16 * 65536 - sent);
    if (n < 0 && errno == EAGAIN) {
      char tmp[65536];
      ssize_t k = read(s, tmp, sizeof tmp);  // drain so the sender can go on
      if (k > 0) { static long drained; drained += k; }
      usleep(100);
      continue;
    }
    if (n <= 0) break;
    sent += n;
  }
  CHECK(sent == 16 * 65536, "sendfile sent 1 MiB");

  // half-close: the client shuts its write side; the server sees EOF after
  // the data and can still answer.
  CHECK(shutdown(c, SHUT_WR) == 0, "shutdown SHUT_WR");
  long total = 0;
  for (;;) {
    ssize_t n = read(s, buf, sizeof buf);
    if (n > 0) { total += n; continue; }
    if (n == 0) break;
    if (errno == EAGAIN) { usleep(1000); continue; }
    break;
  }
  printf("ok server read to EOF\n");
  CHECK(write(s, "bye", 3) == 3, "server answers after EOF");
  CHECK(readn(c, buf, 3) == 3 && memcmp(buf, "bye", 3) == 0, "client reads the answer");
  close(c);
  close(s);
  close(ls);
  return 0;
}
