/* A TCP server and client with known byte counts, using every call of the
 * send/recv family shunt counts. Usage:
 *   tcp_pair server PORT   (prints nothing; echoes ROUNDS*CHUNK bytes back)
 *   tcp_pair client PORT   (sends, reads the echo, verifies it)
 * The client sends exactly ROUNDS*CHUNK bytes and receives the same. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#define CHUNK 1000
#define ROUNDS 12 /* 3 rounds for each of 4 send and 4 receive styles */

static void die(const char* m) { perror(m); exit(2); }

static void send_all(int fd, const char* b, size_t n, int style) {
  while (n > 0) {
    ssize_t r;
    struct iovec iov = {(void*)b, n};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    switch (style) {
      case 0: r = send(fd, b, n, 0); break;
      case 1: r = write(fd, b, n); break;
      case 2: r = writev(fd, &iov, 1); break;
      default: r = sendmsg(fd, &m, 0); break;
    }
    if (r <= 0) die("send");
    b += r;
    n -= (size_t)r;
  }
}

static void recv_all(int fd, char* b, size_t n, int style) {
  while (n > 0) {
    ssize_t r;
    struct iovec iov = {b, n};
    struct msghdr m = {0};
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    switch (style) {
      case 0: r = recv(fd, b, n, 0); break;
      case 1: r = read(fd, b, n); break;
      case 2: r = readv(fd, &iov, 1); break;
      default: r = recvmsg(fd, &m, 0); break;
    }
    if (r <= 0) die("recv");
    b += r;
    n -= (size_t)r;
  }
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: %s server|client PORT\n", argv[0]);
    return 2;
  }
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[2]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  char buf[CHUNK], back[CHUNK];
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) die("socket");
  if (!strcmp(argv[1], "server")) {
    int one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(s, (struct sockaddr*)&a, sizeof a) || listen(s, 1)) die("bind/listen");
    int c = accept4(s, NULL, NULL, SOCK_CLOEXEC);
    if (c < 0) die("accept");
    for (int i = 0; i < ROUNDS; i++) {
      recv_all(c, buf, CHUNK, i % 4);
      send_all(c, buf, CHUNK, (i + 1) % 4);
    }
    close(c);
  } else {
    for (int tries = 0; connect(s, (struct sockaddr*)&a, sizeof a) != 0; tries++) {
      if (tries > 100) die("connect");
      usleep(20000);
      close(s);
      s = socket(AF_INET, SOCK_STREAM, 0);
    }
    for (int i = 0; i < ROUNDS; i++) {
      memset(buf, 'a' + i, CHUNK);
      send_all(s, buf, CHUNK, i % 4);
      recv_all(s, back, CHUNK, (i + 2) % 4);
      if (memcmp(buf, back, CHUNK)) {
        fprintf(stderr, "echo mismatch in round %d\n", i);
        return 1;
      }
    }
    printf("client: %d bytes each way\n", ROUNDS * CHUNK);
  }
  close(s);
  return 0;
}
