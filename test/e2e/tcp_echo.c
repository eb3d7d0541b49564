/* Echo server on 127.0.0.1:PORT for CONNS connections, one at a time,
 * then exits. Usage: tcp_echo PORT CONNS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

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
  for (int n = atoi(argv[2]); n > 0; n--) {
    int c = accept(s, NULL, NULL);
    if (c < 0) return 2;
    char b[4096];
    ssize_t r;
    while ((r = read(c, b, sizeof b)) > 0)
      if (write(c, b, (size_t)r) != r) break;
    close(c);
  }
  close(s);
  return 0;
}
