/* A normally linked verbs program: lists the RDMA devices and the state of
 * each port. Under LD_PRELOAD=libshunt.so its verbs calls reach shunt. */
#include <infiniband/verbs.h>
#include <stdio.h>

int main(void) {
  int n = 0;
  struct ibv_device** list = ibv_get_device_list(&n);
  if (!list) {
    perror("ibv_get_device_list");
    return 1;
  }
  printf("%d device(s)\n", n);
  for (int i = 0; i < n; i++) {
    struct ibv_context* ctx = ibv_open_device(list[i]);
    if (!ctx) {
      printf("%s: cannot open\n", ibv_get_device_name(list[i]));
      continue;
    }
    struct ibv_port_attr pa;
    if (ibv_query_port(ctx, 1, &pa) == 0)
      printf("%s port 1 %s\n", ibv_get_device_name(list[i]), ibv_port_state_str(pa.state));
    ibv_close_device(ctx);
  }
  ibv_free_device_list(list);
  return 0;
}
