/* A library whose constructor opens and closes a TCP socket: it runs before
 * libshunt's own constructor when the program links it, which is what
 * other libraries' constructors (MPI, CUDA runtimes) do to shunt. */
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

int ctor_fd = -2;

__attribute__((constructor)) static void early(void) {
  ctor_fd = socket(AF_INET, SOCK_STREAM, 0);
  if (ctor_fd >= 0) close(ctor_fd);
}
