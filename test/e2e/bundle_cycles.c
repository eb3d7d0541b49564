// Creates and destroys, CYCLES times, a pair of RC QPs connected to each
// other through the device (loopback), with their PD, MR and CQ; in each
// cycle, once the QPs are connected, it RDMA-WRITEs a pattern from one half
// of the buffer to the other in WRITES signaled WRs and checks every
// completion (its own QP number and wr_id, in order) and every byte.
// Prints every device's resource counts (rdma tool) before and after.
// Usage: bundle_cycles DEVICE GID_INDEX CYCLES WRITES SETTLE_MS
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define CHUNK 4096

static void die(const char* what) {
  perror(what);
  exit(1);
}

static void to_rts(struct ibv_qp* q, uint32_t dest, union ibv_gid* gid, int gidx) {
  struct ibv_qp_attr a;
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_INIT;
  a.port_num = 1;
  a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTR;
  a.path_mtu = IBV_MTU_1024;
  a.dest_qp_num = dest;
  a.rq_psn = 7;
  a.max_dest_rd_atomic = 1;
  a.min_rnr_timer = 12;
  a.ah_attr.is_global = 1;
  a.ah_attr.grh.dgid = *gid;
  a.ah_attr.grh.sgid_index = gidx;
  a.ah_attr.grh.hop_limit = 64;
  a.ah_attr.port_num = 1;
  if (ibv_modify_qp(q, &a,
                    IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                        IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
    die("RTR");
  memset(&a, 0, sizeof a);
  a.qp_state = IBV_QPS_RTS;
  a.timeout = 14;
  a.retry_cnt = 6;
  a.rnr_retry = 6;
  a.sq_psn = 7;
  a.max_rd_atomic = 1;
  if (ibv_modify_qp(q, &a,
                    IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                        IBV_QP_MAX_QP_RD_ATOMIC))
    die("RTS");
}

// Every device's counts (shunt's mirrors live on the host's other NICs).
static void resources(const char* when) {
  char cmd[256];
  snprintf(cmd, sizeof cmd, "rdma resource show | sed 's/^/%s: /'", when);
  if (system(cmd) != 0) fprintf(stderr, "rdma resource failed\n");
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s DEVICE GID_INDEX CYCLES WRITES SETTLE_MS\n", argv[0]);
    return 2;
  }
  int gidx = atoi(argv[2]), cycles = atoi(argv[3]), writes = atoi(argv[4]), settle = atoi(argv[5]);
  int n;
  struct ibv_device** list = ibv_get_device_list(&n);
  struct ibv_context* ctx = NULL;
  for (int i = 0; list && i < n; i++)
    if (!strcmp(ibv_get_device_name(list[i]), argv[1])) ctx = ibv_open_device(list[i]);
  if (!ctx) die("open device");
  union ibv_gid gid;
  if (ibv_query_gid(ctx, 1, gidx, &gid)) die("query gid");
  resources("before");
  char* buf = malloc(2 * CHUNK * (size_t)writes);
  for (int c = 0; c < cycles; c++) {
    struct ibv_pd* pd = ibv_alloc_pd(ctx);
    struct ibv_mr* mr = ibv_reg_mr(pd, buf, 2 * CHUNK * (size_t)writes,
                                   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    struct ibv_cq* cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
    if (!pd || !mr || !cq) die("pd/mr/cq");
    struct ibv_qp_init_attr ia;
    memset(&ia, 0, sizeof ia);
    ia.send_cq = ia.recv_cq = cq;
    ia.qp_type = IBV_QPT_RC;
    ia.cap.max_send_wr = 32;
    ia.cap.max_recv_wr = 4;
    ia.cap.max_send_sge = ia.cap.max_recv_sge = 1;
    struct ibv_qp* a = ibv_create_qp(pd, &ia);
    struct ibv_qp* b = ibv_create_qp(pd, &ia);
    if (!a || !b) die("create qp");
    to_rts(a, b->qp_num, &gid, gidx);
    to_rts(b, a->qp_num, &gid, gidx);
    struct timespec ts = {settle / 1000, (settle % 1000) * 1000000L};
    nanosleep(&ts, NULL);  // lets a bundle form behind them
    memset(buf, 0, 2 * CHUNK * (size_t)writes);
    for (int w = 0; w < writes; w++)
      for (int k = 0; k < CHUNK; k++) buf[(size_t)w * CHUNK + k] = (char)(c * 31 + w * 7 + k);
    int done = 0;
    for (int w = 0; w < writes; w++) {
      struct ibv_sge sge = {(uintptr_t)(buf + (size_t)w * CHUNK), CHUNK, mr->lkey};
      struct ibv_send_wr wr, *bad;
      memset(&wr, 0, sizeof wr);
      wr.wr_id = 1000 + w;
      wr.opcode = IBV_WR_RDMA_WRITE;
      wr.send_flags = IBV_SEND_SIGNALED;
      wr.sg_list = &sge;
      wr.num_sge = 1;
      wr.wr.rdma.remote_addr = (uintptr_t)(buf + (size_t)(writes + w) * CHUNK);
      wr.wr.rdma.rkey = mr->rkey;
      if (ibv_post_send(a, &wr, &bad)) die("post_send");
      // at most 16 outstanding
      while (w + 1 - done >= 16 || (w + 1 == writes && done < writes)) {
        struct ibv_wc wc[8];
        int got = ibv_poll_cq(cq, 8, wc);
        if (got < 0) die("poll");
        for (int i = 0; i < got; i++) {
          if (wc[i].status != IBV_WC_SUCCESS) {
            fprintf(stderr, "cycle %d: completion %s\n", c, ibv_wc_status_str(wc[i].status));
            return 1;
          }
          if (wc[i].qp_num != a->qp_num || wc[i].wr_id != (uint64_t)(1000 + done)) {
            fprintf(stderr, "cycle %d: completion qp %u wr_id %lu, want qp %u wr_id %d\n", c, wc[i].qp_num,
                    (unsigned long)wc[i].wr_id, a->qp_num, 1000 + done);
            return 1;
          }
          done++;
        }
      }
    }
    if (memcmp(buf, buf + (size_t)writes * CHUNK, (size_t)writes * CHUNK) != 0) {
      fprintf(stderr, "cycle %d: data differs\n", c);
      return 1;
    }
    if (ibv_destroy_qp(a) || ibv_destroy_qp(b) || ibv_destroy_cq(cq) || ibv_dereg_mr(mr) || ibv_dealloc_pd(pd))
      die("destroy");
  }
  resources("after");
  printf("%d cycles of %d writes: ok\n", cycles, writes);
  ibv_close_device(ctx);
  ibv_free_device_list(list);
  free(buf);
  return 0;
}
