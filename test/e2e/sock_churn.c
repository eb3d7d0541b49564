// Socket churn for e2e tests 22-sock-churn-fork and 23-sock-record-cap.
//   sock_churn churn CYCLES THREADS FORKS CONNS
//     CONNS loopback connections carry 100 bytes each (client to accepted),
//     then THREADS threads open and close CYCLES TCP sockets in all while
//     the main thread forks FORKS times, spread over the churn (each child
//     opens and closes one socket and _exits). Then one more socket stays
//     open; prints its SO_PROTOCOL and whether TCP_QUICKACK, TCP_USER_TIMEOUT
//     and IP_TTL are taken, and the time the forks took.
//   sock_churn cap N
//     Opens N TCP sockets at once and prints each one's SO_PROTOCOL; closes
//     the first two, opens two more and prints theirs; all stay open.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static atomic_long progress;
static long per_thread;

static void die(const char* what) {
  fprintf(stderr, "sock_churn: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static void* churn(void* arg) {
  (void)arg;
  for (long i = 0; i < per_thread; i++) {
    int s = socket(AF_INET, SOCK_STREAM, 0);
    if (s < 0) die("socket");
    close(s);
    atomic_fetch_add(&progress, 1);
  }
  return NULL;
}

// "TAG protocol P", then with options "quickack R user_timeout R ttl R" (R
// is 0 or the errno; shunt puts an upgraded socket given one back to TCP).
static void describe(const char* tag, int s, int options) {
  int v = 0;
  socklen_t l = sizeof v;
  if (getsockopt(s, SOL_SOCKET, SO_PROTOCOL, &v, &l) != 0) die("getsockopt SO_PROTOCOL");
  if (!options) {
    printf("%s protocol %d\n", tag, v);
    return;
  }
  int one = 1, ms = 5000, ttl = 9;
  int q = setsockopt(s, IPPROTO_TCP, TCP_QUICKACK, &one, sizeof one) ? errno : 0;
  int u = setsockopt(s, IPPROTO_TCP, TCP_USER_TIMEOUT, &ms, sizeof ms) ? errno : 0;
  int t = setsockopt(s, IPPROTO_IP, IP_TTL, &ttl, sizeof ttl) ? errno : 0;
  printf("%s protocol %d quickack %d user_timeout %d ttl %d\n", tag, v, q, u, t);
}

static void connections(int n) {
  int l = socket(AF_INET, SOCK_STREAM, 0);
  if (l < 0) die("socket");
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof a;
  if (bind(l, (struct sockaddr*)&a, sizeof a) || listen(l, 8) || getsockname(l, (struct sockaddr*)&a, &al))
    die("listen");
  char buf[100];
  memset(buf, 'x', sizeof buf);
  for (int i = 0; i < n; i++) {
    int c = socket(AF_INET, SOCK_STREAM, 0);
    if (c < 0 || connect(c, (struct sockaddr*)&a, sizeof a)) die("connect");
    int s = accept(l, NULL, NULL);
    if (s < 0) die("accept");
    if (send(c, buf, sizeof buf, 0) != (ssize_t)sizeof buf) die("send");
    for (size_t got = 0; got < sizeof buf;) {
      ssize_t r = recv(s, buf, sizeof buf - got, 0);
      if (r <= 0) die("recv");
      got += (size_t)r;
    }
    close(c);
    close(s);
  }
  close(l);
}

static int run_churn(long cycles, int threads, int forks, int conns) {
  connections(conns);
  per_thread = cycles / threads;
  pthread_t th[64];
  for (int i = 0; i < threads; i++)
    if (pthread_create(&th[i], NULL, churn, NULL)) die("pthread_create");
  double fork_s = 0;
  long total = per_thread * threads;
  for (int k = 1; k <= forks; k++) {
    while (atomic_load(&progress) < total * k / (forks + 1)) usleep(200);
    double t0 = now_s();
    pid_t p = fork();
    if (p < 0) die("fork");
    if (p == 0) {
      int s = socket(AF_INET, SOCK_STREAM, 0);
      if (s >= 0) close(s);
      _exit(s >= 0 ? 0 : 1);
    }
    fork_s += now_s() - t0;
    int st;
    if (waitpid(p, &st, 0) != p || !WIFEXITED(st) || WEXITSTATUS(st)) {
      fprintf(stderr, "sock_churn: child %d failed\n", k);
      return 1;
    }
  }
  for (int i = 0; i < threads; i++) pthread_join(th[i], NULL);
  printf("cycles %ld forks %d fork_ms_total %.1f\n", total, forks, fork_s * 1e3);
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) die("socket");
  describe("after", s, 1);
  fflush(stdout);
  return 0;  // s stays open: the stats show it open
}

static int run_cap(int n) {
  int s[64];
  if (n > 64) n = 64;
  char tag[16];
  for (int i = 0; i < n; i++)
    if ((s[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0) die("socket");
  for (int i = 0; i < n; i++) {
    snprintf(tag, sizeof tag, "sock%d", i);
    describe(tag, s[i], 0);
  }
  close(s[0]);
  close(s[1]);
  for (int i = 0; i < 2; i++) {
    if ((s[i] = socket(AF_INET, SOCK_STREAM, 0)) < 0) die("socket");
    snprintf(tag, sizeof tag, "again%d", i);
    describe(tag, s[i], 0);
  }
  fflush(stdout);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 6 && !strcmp(argv[1], "churn"))
    return run_churn(atol(argv[2]), atoi(argv[3]) < 1 ? 1 : atoi(argv[3]) > 64 ? 64 : atoi(argv[3]),
                     atoi(argv[4]), atoi(argv[5]));
  if (argc == 3 && !strcmp(argv[1], "cap")) return run_cap(atoi(argv[2]));
  fprintf(stderr, "usage: sock_churn churn CYCLES THREADS FORKS CONNS | cap N\n");
  return 2;
}
