/* Loads verbs exactly as NCCL 2.21-2.29 do (src/misc/ibvsymbols.cc):
 * dlopen("libibverbs.so", RTLD_NOW), else "libibverbs.so.1", then each entry
 * point by dlvsym at IBVERBS_1.1, except ibv_reg_mr_iova2 (IBVERBS_1.8),
 * ibv_reg_dmabuf_mr (IBVERBS_1.12), ibv_query_ece and ibv_set_ece
 * (IBVERBS_1.10), which may be missing. It then uses them on every device
 * (open, query, PD, MR, CQ, an RC QP to INIT), closes the library and loads
 * it again. With --where it prints, for each symbol, the object that
 * defines what dlvsym returned. Under LD_PRELOAD=libshunt.so the calls reach
 * shunt although the program never names it. */
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sym {
  const char* name;
  const char* version;
  int optional;
  void* fn;
};

static struct sym syms[] = {
    {"ibv_get_device_list", "IBVERBS_1.1", 0, 0}, {"ibv_free_device_list", "IBVERBS_1.1", 0, 0},
    {"ibv_get_device_name", "IBVERBS_1.1", 0, 0}, {"ibv_open_device", "IBVERBS_1.1", 0, 0},
    {"ibv_close_device", "IBVERBS_1.1", 0, 0},    {"ibv_get_async_event", "IBVERBS_1.1", 0, 0},
    {"ibv_ack_async_event", "IBVERBS_1.1", 0, 0}, {"ibv_query_device", "IBVERBS_1.1", 0, 0},
    {"ibv_query_port", "IBVERBS_1.1", 0, 0},      {"ibv_query_gid", "IBVERBS_1.1", 0, 0},
    {"ibv_query_qp", "IBVERBS_1.1", 0, 0},        {"ibv_alloc_pd", "IBVERBS_1.1", 0, 0},
    {"ibv_dealloc_pd", "IBVERBS_1.1", 0, 0},      {"ibv_reg_mr", "IBVERBS_1.1", 0, 0},
    {"ibv_reg_mr_iova2", "IBVERBS_1.8", 1, 0},    {"ibv_reg_dmabuf_mr", "IBVERBS_1.12", 1, 0},
    {"ibv_dereg_mr", "IBVERBS_1.1", 0, 0},        {"ibv_create_cq", "IBVERBS_1.1", 0, 0},
    {"ibv_destroy_cq", "IBVERBS_1.1", 0, 0},      {"ibv_create_qp", "IBVERBS_1.1", 0, 0},
    {"ibv_modify_qp", "IBVERBS_1.1", 0, 0},       {"ibv_destroy_qp", "IBVERBS_1.1", 0, 0},
    {"ibv_fork_init", "IBVERBS_1.1", 0, 0},       {"ibv_event_type_str", "IBVERBS_1.1", 0, 0},
    {"ibv_query_ece", "IBVERBS_1.10", 1, 0},      {"ibv_set_ece", "IBVERBS_1.10", 1, 0},
};
enum { NSYMS = sizeof syms / sizeof syms[0] };

static void* fn(const char* name) {
  for (int i = 0; i < NSYMS; i++)
    if (strcmp(syms[i].name, name) == 0) return syms[i].fn;
  abort();
}
#define CALL(type, name) ((type)fn(name))

static void* load(const char** opened) {
  *opened = "libibverbs.so";
  void* h = dlopen(*opened, RTLD_NOW);
  if (!h) {
    *opened = "libibverbs.so.1";
    h = dlopen(*opened, RTLD_NOW);
  }
  if (!h) {
    fprintf(stderr, "Failed to open libibverbs.so[.1]\n");
    return NULL;
  }
  for (int i = 0; i < NSYMS; i++) {
    syms[i].fn = dlvsym(h, syms[i].name, syms[i].version);
    if (!syms[i].fn && !syms[i].optional) {
      fprintf(stderr, "dlvsym failed on %s version %s\n", syms[i].name, syms[i].version);
      dlclose(h);
      return NULL;
    }
  }
  return h;
}

static void print_where(void) {
  for (int i = 0; i < NSYMS; i++) {
    Dl_info info;
    const char* obj = "-";
    if (syms[i].fn && dladdr(syms[i].fn, &info) && info.dli_fname) obj = info.dli_fname;
    printf("%s %s %s\n", syms[i].name, syms[i].version, obj);
  }
}

/* Open, query, and build a PD, an MR, a CQ and an RC QP in INIT on one device. */
static void use_device(struct ibv_device* dev) {
  const char* name = CALL(const char* (*)(struct ibv_device*), "ibv_get_device_name")(dev);
  struct ibv_context* ctx =
      CALL(struct ibv_context * (*)(struct ibv_device*), "ibv_open_device")(dev);
  if (!ctx) {
    printf("%s: cannot open\n", name);
    return;
  }
  struct ibv_device_attr da;
  struct ibv_port_attr pa;
  union ibv_gid gid;
  int ok = CALL(int (*)(struct ibv_context*, struct ibv_device_attr*), "ibv_query_device")(
               ctx, &da) == 0 &&
           CALL(int (*)(struct ibv_context*, uint8_t, struct ibv_port_attr*), "ibv_query_port")(
               ctx, 1, &pa) == 0 &&
           CALL(int (*)(struct ibv_context*, uint8_t, int, union ibv_gid*), "ibv_query_gid")(
               ctx, 1, 0, &gid) == 0;
  struct ibv_pd* pd = CALL(struct ibv_pd * (*)(struct ibv_context*), "ibv_alloc_pd")(ctx);
  static char buf[4096];
  struct ibv_mr* mr =
      pd ? CALL(struct ibv_mr * (*)(struct ibv_pd*, void*, size_t, int), "ibv_reg_mr")(
               pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
         : NULL;
  struct ibv_cq* cq =
      CALL(struct ibv_cq * (*)(struct ibv_context*, int, void*, struct ibv_comp_channel*, int),
           "ibv_create_cq")(ctx, 16, NULL, NULL, 0);
  struct ibv_qp* qp = NULL;
  if (pd && cq) {
    struct ibv_qp_init_attr ia = {
        .send_cq = cq,
        .recv_cq = cq,
        .qp_type = IBV_QPT_RC,
        .cap = {.max_send_wr = 8, .max_recv_wr = 8, .max_send_sge = 1, .max_recv_sge = 1}};
    qp = CALL(struct ibv_qp * (*)(struct ibv_pd*, struct ibv_qp_init_attr*), "ibv_create_qp")(pd,
                                                                                              &ia);
  }
  if (qp) {
    struct ibv_qp_attr a = {
        .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
    int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    struct ibv_qp_init_attr ia;
    ok = ok &&
         CALL(int (*)(struct ibv_qp*, struct ibv_qp_attr*, int), "ibv_modify_qp")(qp, &a, mask) ==
             0 &&
         CALL(int (*)(struct ibv_qp*, struct ibv_qp_attr*, int, struct ibv_qp_init_attr*),
              "ibv_query_qp")(qp, &a, IBV_QP_STATE, &ia) == 0 &&
         a.qp_state == IBV_QPS_INIT;
    CALL(int (*)(struct ibv_qp*), "ibv_destroy_qp")(qp);
  }
  printf("%s: port 1 %s, qp %s\n", name,
         CALL(const char* (*)(enum ibv_event_type), "ibv_event_type_str")(IBV_EVENT_PORT_ACTIVE),
         qp && ok ? "reached INIT" : "not built");
  if (cq) CALL(int (*)(struct ibv_cq*), "ibv_destroy_cq")(cq);
  if (mr) CALL(int (*)(struct ibv_mr*), "ibv_dereg_mr")(mr);
  if (pd) CALL(int (*)(struct ibv_pd*), "ibv_dealloc_pd")(pd);
  CALL(int (*)(struct ibv_context*), "ibv_close_device")(ctx);
}

/* No device list (no RDMA device at all gives ENOSYS) is no error: NCCL then
 * runs without verbs. */
static void list_and_use(const char* opened) {
  int n = 0;
  struct ibv_device** list = CALL(struct ibv_device * *(*)(int*), "ibv_get_device_list")(&n);
  if (!list) {
    perror("ibv_get_device_list");
    return;
  }
  printf("%d device(s) through %s\n", n, opened);
  for (int i = 0; i < n; i++) use_device(list[i]);
  CALL(void (*)(struct ibv_device**), "ibv_free_device_list")(list);
}

int main(int argc, char** argv) {
  const char* opened;
  void* h = load(&opened);
  if (!h) return 1;
  if (argc > 1 && strcmp(argv[1], "--where") == 0) print_where();
  list_and_use(opened);
  /* NCCL keeps its handle; a program that closes and loads again must work too. */
  dlclose(h);
  h = load(&opened);
  if (!h) return 1;
  list_and_use(opened);
  return dlclose(h) == 0 ? 0 : 1;
}
