/* Echo server on 127.0.0.1:PORT serving connections concurrently (poll);
 * exits once CONNS connections have been accepted and closed.
 * Usage: tcp_echo PORT CONNS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#define MAXC 16

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(s, (struct sockaddr*)&a, sizeof a) || listen(s, 8)) {
    perror("bind");
    return 2;
  }
  int left = atoi(argv[2]), accepted = 0, n = 1;
  struct pollfd p[MAXC + 1];
  p[0].fd = s;
  p[0].events = POLLIN;
  while (left > 0) {
    if (poll(p, (nfds_t)n, -1) < 0) return 2;
    for (int i = n - 1; i >= 1; i--) {
      if (!p[i].revents) continue;
      char b[4096];
      ssize_t r = read(p[i].fd, b, sizeof b);
      if (r <= 0 || write(p[i].fd, b, (size_t)r) != r) {
        close(p[i].fd);
        p[i] = p[--n];
        left--;
      }
    }
    if ((p[0].revents & POLLIN) && accepted < atoi(argv[2]) && n <= MAXC) {
      int c = accept(s, NULL, NULL);
      if (c < 0) return 2;
      accepted++;
      p[n].fd = c;
      p[n].events = POLLIN;
      p[n].revents = 0;
      n++;
    }
  }
  close(s);
  return 0;
}
