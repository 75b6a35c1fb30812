/* Four threads post SENDs on one RC QP through whatever provider serves the device (locks
 * on); the main thread polls. Every WR must complete exactly once, on the send CQ and as a
 * receive on the peer QP (same device, in-process fabric). Prints "ok <n>" on success. */
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define THREADS 4
#define PER 250
#define DEPTH 128

static struct ibv_qp *qa;
static struct ibv_mr *mr;
static char *buf;
static volatile int outstanding;
static pthread_mutex_t credit = PTHREAD_MUTEX_INITIALIZER;

static int die(const char *what) { perror(what); exit(2); }

static void *poster(void *arg)
{
	long t = (long)arg;
	for (int i = 0; i < PER; i++) {
		for (;;) { /* stay within the SQ depth: credits are returned by the poller */
			pthread_mutex_lock(&credit);
			if (outstanding < DEPTH - THREADS) { outstanding++; pthread_mutex_unlock(&credit); break; }
			pthread_mutex_unlock(&credit);
		}
		struct ibv_sge sge = { (uintptr_t)(buf + t * 64), 8, mr->lkey };
		struct ibv_send_wr wr = { 0 }, *bad;
		wr.wr_id = ((uint64_t)t << 32) | i;
		wr.sg_list = &sge; wr.num_sge = 1; wr.opcode = IBV_WR_SEND;
		wr.send_flags = IBV_SEND_SIGNALED;
		if (ibv_post_send(qa, &wr, &bad)) die("ibv_post_send");
	}
	return NULL;
}

static void to_rts(struct ibv_qp *q, uint32_t dqpn, uint16_t dlid)
{
	struct ibv_qp_attr a = { 0 };
	a.qp_state = IBV_QPS_INIT; a.port_num = 1; a.qp_access_flags = 0;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS)) die("INIT");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR; a.path_mtu = IBV_MTU_1024; a.dest_qp_num = dqpn; a.rq_psn = 0;
	a.max_dest_rd_atomic = 1; a.min_rnr_timer = 12; a.ah_attr.dlid = dlid; a.ah_attr.port_num = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER)) die("RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS; a.timeout = 14; a.retry_cnt = 7; a.rnr_retry = 7; a.sq_psn = 0; a.max_rd_atomic = 1;
	if (ibv_modify_qp(q, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
			  IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) die("RTS");
}

int main(void)
{
	int n;
	struct ibv_device **l = ibv_get_device_list(&n);
	if (!l || !n) die("no device");
	struct ibv_context *c = ibv_open_device(l[0]);
	if (!c) die("open");
	struct ibv_pd *pd = ibv_alloc_pd(c);
	buf = calloc(1, 1 << 16);
	mr = ibv_reg_mr(pd, buf, 1 << 16, IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *scq = ibv_create_cq(c, 1024, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(c, 4096, NULL, NULL, 0);
	if (!pd || !mr || !scq || !rcq) die("objects");
	struct ibv_qp_init_attr ia = { 0 };
	ia.send_cq = scq; ia.recv_cq = rcq; ia.qp_type = IBV_QPT_RC;
	ia.cap.max_send_wr = DEPTH; ia.cap.max_recv_wr = 16; ia.cap.max_send_sge = 1; ia.cap.max_recv_sge = 1;
	qa = ibv_create_qp(pd, &ia);
	ia.cap.max_recv_wr = THREADS * PER;
	struct ibv_qp *qb = ibv_create_qp(pd, &ia);
	if (!qa || !qb) die("create_qp");
	struct ibv_port_attr pa;
	if (ibv_query_port(c, 1, &pa)) die("query_port");
	to_rts(qa, qb->qp_num, pa.lid);
	to_rts(qb, qa->qp_num, pa.lid);
	for (int i = 0; i < THREADS * PER; i++) {
		struct ibv_sge sge = { (uintptr_t)(buf + 4096 + (i % 64) * 64), 64, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qb, &wr, &bad)) die("post_recv");
	}
	static unsigned char seen[THREADS][PER];
	pthread_t th[THREADS];
	for (long t = 0; t < THREADS; t++) pthread_create(&th[t], NULL, poster, (void *)t);
	int sends = 0, recvs = 0;
	struct ibv_wc wc[16];
	while (sends < THREADS * PER || recvs < THREADS * PER) {
		int k = ibv_poll_cq(scq, 16, wc);
		if (k < 0) die("poll send");
		for (int i = 0; i < k; i++) {
			if (wc[i].status != IBV_WC_SUCCESS) { fprintf(stderr, "send wc %s\n", ibv_wc_status_str(wc[i].status)); return 1; }
			uint32_t t = wc[i].wr_id >> 32, j = (uint32_t)wc[i].wr_id;
			if (t >= THREADS || j >= PER || seen[t][j]++) { fprintf(stderr, "bad or duplicate wr_id %#lx\n", (unsigned long)wc[i].wr_id); return 1; }
		}
		pthread_mutex_lock(&credit); outstanding -= k; pthread_mutex_unlock(&credit);
		sends += k;
		k = ibv_poll_cq(rcq, 16, wc);
		if (k < 0) die("poll recv");
		for (int i = 0; i < k; i++)
			if (wc[i].status != IBV_WC_SUCCESS || wc[i].byte_len != 8) { fprintf(stderr, "recv wc %s len %u\n", ibv_wc_status_str(wc[i].status), wc[i].byte_len); return 1; }
		recvs += k;
	}
	for (int t = 0; t < THREADS; t++) pthread_join(th[t], NULL);
	for (int t = 0; t < THREADS; t++)
		for (int j = 0; j < PER; j++)
			if (seen[t][j] != 1) { fprintf(stderr, "wr %d/%d completed %d times\n", t, j, seen[t][j]); return 1; }
	ibv_destroy_qp(qa); ibv_destroy_qp(qb); ibv_destroy_cq(scq); ibv_destroy_cq(rcq);
	ibv_dereg_mr(mr); ibv_dealloc_pd(pd); ibv_close_device(c); ibv_free_device_list(l);
	printf("ok %d\n", sends);
	return 0;
}
