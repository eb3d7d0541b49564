/* Connects, then forks: parent and child both use the inherited socket and
 * each also opens a socket of its own after the fork. Exits 0 when every
 * byte came back. Usage: fork_conn PORT (a server echoing is started by the
 * caller: tcp_echo). */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

static int dial(int port) {
  struct sockaddr_in a = {0};
  a.sin_family = AF_INET;
  a.sin_port = htons((unsigned short)port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (int tries = 0; tries < 100; tries++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s >= 0 && connect(s, (struct sockaddr*)&a, sizeof a) == 0) return s;
    close(s);
    usleep(20000);
  }
  perror("connect");
  exit(2);
}

static int ping(int s, char tag) {
  char out[64], in[64];
  memset(out, tag, sizeof out);
  if (send(s, out, sizeof out, 0) != sizeof out) return 1;
  size_t got = 0;
  while (got < sizeof in) {
    ssize_t r = recv(s, in + got, sizeof in - got, 0);
    if (r <= 0) return 1;
    got += (size_t)r;
  }
  return memcmp(out, in, sizeof in) != 0;
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  int port = atoi(argv[1]);
  int s = dial(port);
  if (ping(s, 'p')) return 1;
  pid_t pid = fork();
  if (pid < 0) return 2;
  if (pid == 0) {
    int own = dial(port);
    int bad = ping(own, 'c');
    close(own);
    exit(bad); /* exit, not _exit: the child's stats are written at exit */
  }
  int st = 0;
  waitpid(pid, &st, 0);
  int own = dial(port);
  int bad = ping(own, 'q') || ping(s, 'r');
  close(own);
  close(s);
  if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
    fprintf(stderr, "child failed\n");
    return 1;
  }
  printf("fork_conn ok\n");
  return bad;
}
