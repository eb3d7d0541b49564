// An all-to-all over MPI that checks every element it receives.
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int r, n;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int k = 1 << 16, iters = argc > 1 ? atoi(argv[1]) : 50;
  int *s = malloc(sizeof(int) * k * n), *d = malloc(sizeof(int) * k * n);
  for (int it = 0; it < iters; it++) {
    for (int p = 0; p < n; p++)
      for (int i = 0; i < k; i++) s[p * k + i] = r * 1000003 + p * 7 + i + it;
    MPI_Alltoall(s, k, MPI_INT, d, k, MPI_INT, MPI_COMM_WORLD);
    for (int p = 0; p < n; p++)
      for (int i = 0; i < k; i++)
        if (d[p * k + i] != p * 1000003 + r * 7 + i + it) { printf("rank %d WRONG\n", r); MPI_Abort(MPI_COMM_WORLD, 1); }
  }
  printf("rank %d of %d: %d alltoalls verified\n", r, n, iters);
  MPI_Finalize();
  return 0;
}
