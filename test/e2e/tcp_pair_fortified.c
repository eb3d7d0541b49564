/* A client built with _FORTIFY_SOURCE=2 whose receive calls go to glibc's
 * __recv_chk, __recvfrom_chk and __read_chk (a local buffer of known size,
 * a length known only at run time). Sends 3000 bytes to an echo server on
 * 127.0.0.1:PORT and reads them back, 1000 through each call.
 * Usage: tcp_pair_fortified PORT */
#undef _FORTIFY_SOURCE
#define _FORTIFY_SOURCE 2
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)atoi(argv[1]));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  for (int tries = 0; connect(s, (struct sockaddr*)&a, sizeof a) != 0; tries++) {
    if (tries > 100) return 2;
    usleep(20000);
    close(s);
    s = socket(AF_INET, SOCK_STREAM, 0);
  }
  char out[3000];
  memset(out, 'f', sizeof out);
  if (send(s, out, sizeof out, 0) != (ssize_t)sizeof out) return 1;
  const char* chunk = getenv("CHUNK"); /* 1000 unless set: known only at run time */
  size_t want = chunk ? strtoul(chunk, NULL, 10) : 1000;
  if (want > 1000) return 2;
  for (int way = 0; way < 3; way++) {
    char in[1024];
    size_t got = 0;
    while (got < want) {
      ssize_t r = way == 0   ? recv(s, in, want - got, 0)
                  : way == 1 ? recvfrom(s, in, want - got, 0, NULL, NULL)
                             : read(s, in, want - got);
      if (r <= 0) return 1;
      got += (size_t)r;
    }
  }
  close(s);
  printf("fortified client: 3000 bytes each way\n");
  return 0;
}
