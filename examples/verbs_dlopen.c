/* Loads verbs the way NCCL does: dlopen() of the library named by an
 * environment variable (VERBS_LIB, default libibverbs.so.1), then every
 * entry point by dlvsym(handle, name, "IBVERBS_1.1"). Pointing VERBS_LIB at
 * libshunt.so (what shunt-run does through NCCL_IBVERBS_LIB) routes a
 * program that never links libibverbs through shunt, without LD_PRELOAD. */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>

typedef struct ibv_device** (*get_list_fn)(int*);
typedef void (*free_list_fn)(struct ibv_device**);
typedef struct ibv_context* (*open_fn)(struct ibv_device*);
typedef int (*close_fn)(struct ibv_context*);

int main(void) {
  const char* lib = getenv("VERBS_LIB");
  if (!lib) lib = "libibverbs.so.1";
  void* h = dlopen(lib, RTLD_NOW);
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
    return 1;
  }
  get_list_fn get_list = (get_list_fn)dlvsym(h, "ibv_get_device_list", "IBVERBS_1.1");
  free_list_fn free_list = (free_list_fn)dlvsym(h, "ibv_free_device_list", "IBVERBS_1.1");
  open_fn open_dev = (open_fn)dlvsym(h, "ibv_open_device", "IBVERBS_1.1");
  close_fn close_dev = (close_fn)dlvsym(h, "ibv_close_device", "IBVERBS_1.1");
  if (!get_list || !free_list || !open_dev || !close_dev) {
    fprintf(stderr, "%s lacks an IBVERBS_1.1 entry point\n", lib);
    return 1;
  }
  int n = 0;
  struct ibv_device** list = get_list(&n);
  if (!list) {
    perror("ibv_get_device_list");
    dlclose(h);
    return 1;
  }
  printf("%d device(s) through %s\n", n, lib);
  for (int i = 0; i < n; i++) {
    struct ibv_context* ctx = open_dev(list[i]);
    if (ctx) close_dev(ctx);
  }
  free_list(list);
  dlclose(h);
  return 0;
}
