/* Links ctor_socket_lib.so, whose constructor calls socket() first. */
#include <stdio.h>

extern int ctor_fd;

int main(void) {
  if (ctor_fd < 0) {
    fprintf(stderr, "socket() in a constructor failed\n");
    return 1;
  }
  printf("constructor socket fd %d\n", ctor_fd);
  return 0;
}
