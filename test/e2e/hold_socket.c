/* Opens a TCP socket (which starts shunt's agent thread under the
 * preload), holds it for MS milliseconds, then exits. Usage: hold_socket MS */
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  int s = socket(AF_INET, SOCK_STREAM, 0);
  if (s < 0) return 1;
  usleep((useconds_t)atoi(argv[1]) * 1000);
  close(s);
  return 0;
}
