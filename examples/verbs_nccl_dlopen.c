/* Loads verbs exactly as NCCL 2.21-2.29 do (src/misc/ibvsymbols.cc):
 * dlopen("libibverbs.so", RTLD_NOW), else "libibverbs.so.1", then each entry
 * point by dlvsym at IBVERBS_1.1, except ibv_reg_mr_iova2 (IBVERBS_1.8),
 * ibv_reg_dmabuf_mr (IBVERBS_1.12), ibv_query_ece and ibv_set_ece
 * (IBVERBS_1.10), which may be missing. It then uses them on every device
 * (open, query, PD, MR, CQ, an RC QP to INIT), closes the library and loads
 * it again. With --where it prints, for each symbol, the object that
 * defines what dlvsym returned. Under LD_PRELOAD=libshunt.so the calls reach
 * shunt although the program never names it.
 * --pair DEV GID-INDEX server|HOST PORT SECONDS: two ranks over one RC QP
 * (set up through TCP PORT), the client writing 64 KiB per iteration as an
 * RDMA WRITE and a WRITE_WITH_IMM for SECONDS, the server checking every
 * byte and answering with a SEND; each prints its "#wrong" count. */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <infiniband/verbs.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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

/* ---- --pair: two ranks, WRITE + WRITE_WITH_IMM, every byte checked ---- */

struct peer_info {
  uint32_t qpn, psn, rkey;
  uint64_t addr;
  uint8_t gid[16];
};

enum { HALF = 32 * 1024, STOP = 0xffffffffu };
static char pair_buf[2 * HALF]; /* what the peer writes into (server) or what is written (client) */

static int tcp_pair(const char* host, const char* port) {
  struct addrinfo hints = {
      .ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = host ? 0 : AI_PASSIVE};
  struct addrinfo* ai;
  if (getaddrinfo(host, port, &hints, &ai) != 0) return -1;
  int c = -1, one = 1;
  if (!host) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0) {
      setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd, 1) == 0)
        c = accept(fd, NULL, NULL);
      close(fd);
    }
  } else {
    for (int i = 0; i < 100 && c < 0; i++) { /* the server may not listen yet: up to 10 s */
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
        c = fd;
        break;
      }
      if (fd >= 0) close(fd);
      usleep(100000);
    }
  }
  freeaddrinfo(ai);
  return c;
}

static int full(ssize_t (*io)(int, void*, size_t, int), int fd, void* p, size_t n) {
  for (size_t d = 0; d < n;) {
    ssize_t r = io(fd, (char*)p + d, n - d, 0);
    if (r <= 0) return -1;
    d += (size_t)r;
  }
  return 0;
}
static ssize_t send_io(int fd, void* p, size_t n, int f) {
  return send(fd, p, n, f);
}

/* The next completion on cq, waiting at most 30 s (longer than a fault the
 * job is meant to ride out); an error completion is fatal. */
static int wait_wc(struct ibv_cq* cq, struct ibv_wc* wc) {
  time_t start = time(NULL);
  for (long spins = 1;; spins++) {
    int n = ibv_poll_cq(cq, 1, wc);
    if (n < 0) return -1;
    if (n == 1) {
      if (wc->status == IBV_WC_SUCCESS) return 0;
      fprintf(stderr, "completion error: status %d, wr %llu\n", (int)wc->status,
              (unsigned long long)wc->wr_id);
      return -1;
    }
    if (spins % 1000 == 0) {
      usleep(100);
      if (time(NULL) - start > 30) {
        fprintf(stderr, "no completion in 30 s\n");
        return -1;
      }
    }
  }
}

static char pattern(uint32_t i, size_t k) {
  return (char)(i * 131 + k * 7 + (k >> 9));
}

static int post_recv(struct ibv_qp* qp) {
  struct ibv_recv_wr wr = {.wr_id = 1}, *bad;
  return ibv_post_recv(qp, &wr, &bad);
}

/* Server (no host): waits for each WRITE + WRITE_WITH_IMM, checks the
 * buffer against the iteration's pattern, answers with a SEND. Client:
 * writes for `seconds`, each iteration after the previous answer. */
static int run_pair(const char* dev_name, int gid_index, const char* host, const char* port,
                    int seconds) {
  int n = 0, rc = 1;
  struct ibv_device** list = CALL(struct ibv_device * *(*)(int*), "ibv_get_device_list")(&n);
  struct ibv_device* dev = NULL;
  for (int i = 0; list && i < n; i++)
    if (strcmp(CALL(const char* (*)(struct ibv_device*), "ibv_get_device_name")(list[i]),
               dev_name) == 0)
      dev = list[i];
  if (!dev) {
    fprintf(stderr, "no device %s\n", dev_name);
    return 1;
  }
  struct ibv_context* ctx =
      CALL(struct ibv_context * (*)(struct ibv_device*), "ibv_open_device")(dev);
  struct ibv_port_attr pa;
  union ibv_gid gid;
  if (!ctx ||
      CALL(int (*)(struct ibv_context*, uint8_t, struct ibv_port_attr*), "ibv_query_port")(
          ctx, 1, &pa) != 0 ||
      CALL(int (*)(struct ibv_context*, uint8_t, int, union ibv_gid*), "ibv_query_gid")(
          ctx, 1, gid_index, &gid) != 0) {
    fprintf(stderr, "%s: cannot open or query\n", dev_name);
    return 1;
  }
  struct ibv_pd* pd = CALL(struct ibv_pd * (*)(struct ibv_context*), "ibv_alloc_pd")(ctx);
  /* as NCCL registers: ibv_reg_mr_iova2 where libibverbs has it */
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
  struct ibv_mr* (*iova2)(struct ibv_pd*, void*, size_t, uint64_t, unsigned) = CALL(
      struct ibv_mr * (*)(struct ibv_pd*, void*, size_t, uint64_t, unsigned), "ibv_reg_mr_iova2");
  struct ibv_mr* mr = NULL;
  if (pd && iova2)
    mr = iova2(pd, pair_buf, sizeof pair_buf, (uintptr_t)pair_buf, access);
  else if (pd)
    mr = CALL(struct ibv_mr * (*)(struct ibv_pd*, void*, size_t, int), "ibv_reg_mr")(
        pd, pair_buf, sizeof pair_buf, access);
  struct ibv_cq* cq =
      CALL(struct ibv_cq * (*)(struct ibv_context*, int, void*, struct ibv_comp_channel*, int),
           "ibv_create_cq")(ctx, 64, NULL, NULL, 0);
  struct ibv_qp_init_attr ia = {
      .send_cq = cq,
      .recv_cq = cq,
      .qp_type = IBV_QPT_RC,
      .cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1}};
  struct ibv_qp* qp = pd && mr && cq
                          ? CALL(struct ibv_qp * (*)(struct ibv_pd*, struct ibv_qp_init_attr*),
                                 "ibv_create_qp")(pd, &ia)
                          : NULL;
  if (!qp) {
    fprintf(stderr, "%s: cannot build PD, MR, CQ and QP\n", dev_name);
    return 1;
  }
  int (*modify)(struct ibv_qp*, struct ibv_qp_attr*, int) =
      CALL(int (*)(struct ibv_qp*, struct ibv_qp_attr*, int), "ibv_modify_qp");
  struct ibv_qp_attr a = {
      .qp_state = IBV_QPS_INIT, .port_num = 1, .qp_access_flags = IBV_ACCESS_REMOTE_WRITE};
  if (modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0 ||
      post_recv(qp)) {
    fprintf(stderr, "INIT failed\n");
    return 1;
  }
  int fd = tcp_pair(host, port);
  if (fd < 0) {
    fprintf(stderr, "no TCP connection to the peer\n");
    return 1;
  }
  struct peer_info me = {.qpn = qp->qp_num,
                         .psn = 1,
                         .rkey = mr->rkey,
                         .addr = (uintptr_t)pair_buf},
                   them;
  memcpy(me.gid, gid.raw, 16);
  if (full(send_io, fd, &me, sizeof me) || full(recv, fd, &them, sizeof them)) {
    fprintf(stderr, "exchange with the peer failed\n");
    return 1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = pa.active_mtu < IBV_MTU_1024 ? pa.active_mtu : IBV_MTU_1024;
  a.dest_qp_num = them.qpn;
  a.rq_psn = them.psn;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.port_num = 1;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.grh.sgid_index = (uint8_t)gid_index;
  memcpy(a.ah_attr.grh.dgid.raw, them.gid, 16);
  if (modify(qp, &a,
             IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                 IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    fprintf(stderr, "RTR failed\n");
    return 1;
  }
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 7;
  a.rnr_retry = 7;
  a.sq_psn = me.psn;
  a.max_rd_atomic = 1;
  if (modify(qp, &a,
             IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                 IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    fprintf(stderr, "RTS failed\n");
    return 1;
  }
  char sync = 0;
  if (full(send_io, fd, &sync, 1) || full(recv, fd, &sync, 1)) return 1; /* both ends in RTS */

  struct ibv_wc wc;
  struct ibv_sge sge = {.lkey = mr->lkey};
  struct ibv_send_wr wr, *bad;
  uint32_t iters = 0, wrong = 0;
  if (!host) {
    for (;;) {
      if (wait_wc(cq, &wc)) goto out;
      if (wc.opcode == IBV_WC_SEND) continue; /* an answer's; the next message may come first */
      if (wc.opcode != IBV_WC_RECV_RDMA_WITH_IMM) goto out;
      uint32_t i = ntohl(wc.imm_data);
      if (i == STOP) { /* torn down once the client has its last completions */
        rc = full(recv, fd, &sync, 1);
        break;
      }
      size_t bad_bytes = 0;
      for (size_t k = 0; k < sizeof pair_buf; k++) bad_bytes += pair_buf[k] != pattern(i, k);
      if (bad_bytes) wrong++;
      iters++;
      memset(&wr, 0, sizeof wr);
      wr.opcode = IBV_WR_SEND;
      wr.send_flags = IBV_SEND_SIGNALED;
      if (post_recv(qp) || ibv_post_send(qp, &wr, &bad)) goto out;
    }
  } else {
    time_t end = time(NULL) + seconds;
    for (uint32_t i = 0;; i++) {
      int last = time(NULL) >= end;
      uint32_t tag = last ? STOP : i;
      for (size_t k = 0; k < sizeof pair_buf; k++) pair_buf[k] = pattern(tag, k);
      for (int half = 0; half < 2; half++) {
        memset(&wr, 0, sizeof wr);
        sge.addr = (uintptr_t)pair_buf + (size_t)half * HALF;
        sge.length = HALF;
        wr.wr_id = (uint64_t)half;
        wr.sg_list = &sge;
        wr.num_sge = 1;
        wr.opcode = half ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
        wr.imm_data = htonl(tag);
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = them.addr + (uint64_t)half * HALF;
        wr.wr.rdma.rkey = them.rkey;
        if (ibv_post_send(qp, &wr, &bad)) goto out;
      }
      /* two send completions, and the answer unless this was the last */
      for (int want = last ? 2 : 3; want > 0; want--)
        if (wait_wc(cq, &wc)) goto out;
      if (last) {
        rc = full(send_io, fd, &sync, 1); /* the server may tear down now */
        break;
      }
      if (post_recv(qp)) goto out;
      iters++;
    }
  }
  rc = rc || wrong ? 1 : 0;
out:
  printf("%s: %u iterations, #wrong %u\n", host ? "client" : "server", iters, wrong);
  close(fd);
  CALL(int (*)(struct ibv_qp*), "ibv_destroy_qp")(qp);
  CALL(int (*)(struct ibv_cq*), "ibv_destroy_cq")(cq);
  CALL(int (*)(struct ibv_mr*), "ibv_dereg_mr")(mr);
  CALL(int (*)(struct ibv_pd*), "ibv_dealloc_pd")(pd);
  CALL(int (*)(struct ibv_context*), "ibv_close_device")(ctx);
  CALL(void (*)(struct ibv_device**), "ibv_free_device_list")(list);
  return rc;
}

int main(int argc, char** argv) {
  const char* opened;
  void* h = load(&opened);
  if (!h) return 1;
  if (argc == 7 && strcmp(argv[1], "--pair") == 0) /* DEV GID-INDEX server|HOST PORT SECONDS */
    return run_pair(argv[2], atoi(argv[3]), strcmp(argv[4], "server") == 0 ? NULL : argv[4],
                    argv[5], atoi(argv[6]));
  if (argc > 1 && strcmp(argv[1], "--where") == 0) print_where();
  list_and_use(opened);
  /* NCCL keeps its handle; a program that closes and loads again must work too. */
  dlclose(h);
  h = load(&opened);
  if (!h) return 1;
  list_and_use(opened);
  return dlclose(h) == 0 ? 0 : 1;
}
