/*
 * mlx5-bench provider harness: the same operations through libibverbs' inline ibv_post_send
 * and ibv_poll_cq only, so that one binary measures whichever provider serves the device
 * (libmlx5, or libmlx5rs when it is preloaded and chosen with MLX5RS_PROVIDER=ours).
 *
 * Usage: provider-harness <calls>
 * Unlike harness.c it calls no mlx5dv function (libmlx5's mlx5dv_init_obj refuses a context
 * another provider made), so it cannot look at the rings: it waits for completions instead.
 * One RC QP connected to itself (sq_sig_all = 0), a send CQ and a receive CQ. Each measured
 * operation is one noinline wrapper (bench_p_*), a callgrind toggle, as in harness.c:
 *   send_inline64  ibv_post_send of one signalled 64-byte inline SEND
 *   send_sge64     ibv_post_send of one signalled SEND with one 64-byte SGE
 *   chain32        ibv_post_send of a chain of 32 such SENDs (cost per WR)
 *   poll_cqe       ibv_poll_cq(cq, 1, &wc) with the CQ holding 64 completions
 * Single posts are timed in batches of ROUND calls, chains one call at a time, polls FILL
 * calls at a time; between timed regions every send completion is polled (unmeasured) and
 * the receive queue is topped up.
 *
 * Before the polls are measured the CQ must hold all FILL completions, which plain verbs
 * cannot peek at: after the FILL SENDs the harness posts one unsignalled RDMA READ (to
 * itself) of a word holding the round number into a flag word, and waits for the flag. An
 * RC requester retires in order (the emulator's requester.rs `retire` writes the CQEs of
 * the SENDs before it scatters the READ's data), so when the flag shows the round every
 * SEND's CQE is in the CQ.
 *
 * Output: the `result` lines of harness.c (same format, ops as above, api "provider").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/verbs.h>

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t ticks(void) { return __rdtsc(); }
#else
static inline uint64_t ticks(void) { return 0; }
#endif

#define CHAIN 32
#define PAYLOAD 64
#define SQ_WRS 128
#define RQ_WRS 256
#define CQ_SIZE 512
#define ROUND 32
#define FILL (2 * CHAIN)
#define WARMUP 64
#define FLAG_SRC 1024 /* offset in buf of the word the READ fetches */
#define FLAG_DST 1088 /* offset in buf of the word it lands in */

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("provider-harness: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static void check(int rc, const char *what)
{
	if (rc)
		die("%s failed: %s", what, strerror(rc > 0 ? rc : errno));
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + ts.tv_nsec;
}

struct bench {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	uint8_t buf[4096] __attribute__((aligned(64)));
	struct ibv_sge sge;              /* 64 bytes at buf + 0 */
	struct ibv_send_wr one_inline;   /* 64-byte inline SEND */
	struct ibv_send_wr one_sge;      /* 64-byte SEND, one SGE */
	struct ibv_send_wr chain[CHAIN]; /* 32 SENDs with one SGE each */
	struct ibv_sge flag_sge;         /* the READ's destination */
	struct ibv_send_wr flag_read;    /* unsignalled READ of the round number */
	unsigned recv_posted;
	uint64_t next_wr_id;
	uint64_t round;
	unsigned pending_cqes; /* signalled send WRs not yet polled */
};

/* ---- the measured wrappers (noinline: callgrind toggles on them) ---- */

__attribute__((noinline)) int bench_p_send_inline64(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_p_send_sge64(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_p_chain32(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_p_poll_cqe(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 1, wc);
}

/* See harness.c: callgrind zeroes its counts on entering this function. */
__attribute__((noinline)) void bench_zero_stats(void)
{
	__asm__ volatile("" ::: "memory");
}

/* ---- synchronisation and bookkeeping (not measured) ---- */

static void refill_recv(struct bench *b)
{
	struct ibv_wc wc[32];
	struct ibv_sge sge = { .addr = (uintptr_t)b->buf + 2048, .length = 1024, .lkey = b->mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 0, .sg_list = &sge, .num_sge = 1 }, *bad;
	int n, i;

	do {
		n = ibv_poll_cq(b->rcq, 32, wc);
		if (n < 0)
			die("ibv_poll_cq (recv) failed");
		for (i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				die("receive completion: %s", ibv_wc_status_str(wc[i].status));
		b->recv_posted -= n;
	} while (n > 0);
	while (b->recv_posted < RQ_WRS) {
		check(ibv_post_recv(b->qp, &rw, &bad), "ibv_post_recv");
		b->recv_posted++;
	}
}

/* Poll every send completion still owed (unmeasured), then top up the receive queue. */
static void drain(struct bench *b)
{
	struct ibv_wc wc[32];
	double t0 = now_s();
	int n, i;

	while (b->pending_cqes > 0) {
		n = ibv_poll_cq(b->scq, 32, wc);
		if (n < 0)
			die("ibv_poll_cq failed");
		for (i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				die("send completion: %s (vendor_err %#x)",
				    ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
		b->pending_cqes -= n;
		if (!n) {
			if (now_s() - t0 > 60.0)
				die("%u send completions missing after 60 s", b->pending_cqes);
			sched_yield();
		}
	}
	refill_recv(b);
}

/* Wait until every signalled SEND posted so far has its CQE in the send CQ (the READ
 * barrier described at the top). */
static void barrier(struct bench *b)
{
	volatile uint64_t *src = (volatile uint64_t *)(b->buf + FLAG_SRC);
	volatile uint64_t *dst = (volatile uint64_t *)(b->buf + FLAG_DST);
	struct ibv_send_wr *bad;
	double t0 = now_s();

	b->round++;
	*src = b->round;
	check(ibv_post_send(b->qp, &b->flag_read, &bad), "ibv_post_send (READ barrier)");
	while (*dst != b->round) {
		if (now_s() - t0 > 60.0)
			die("the READ barrier did not complete in 60 s");
		sched_yield();
	}
}

/* ---- timing (as harness.c) ---- */

struct samples {
	uint64_t *ns, *tk;
	unsigned n;
};

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static uint64_t median(uint64_t *v, unsigned n)
{
	qsort(v, n, sizeof(*v), cmp_u64);
	return n ? v[n / 2] : 0;
}

static int quiet;

static void report(const char *op, const char *api, struct samples *s, unsigned batch,
		   unsigned per_call)
{
	if (quiet) {
		s->n = 0;
		return;
	}
	printf("result %s %s calls=%u batch=%u wrs_per_call=%u ns=%" PRIu64 " ticks=%" PRIu64 "\n",
	       op, api, s->n * batch, batch, per_call, median(s->ns, s->n), median(s->tk, s->n));
	fflush(stdout);
	s->n = 0;
}

struct stamp {
	uint64_t ns, tk;
};

static inline struct stamp stamp_start(void)
{
	struct stamp t;
	t.ns = now_ns();
	t.tk = ticks();
	return t;
}

static inline void stamp_end(struct samples *s, struct stamp t0)
{
	uint64_t k1 = ticks(), t1 = now_ns();
	s->ns[s->n] = t1 - t0.ns;
	s->tk[s->n] = k1 - t0.tk;
	s->n++;
}

static void single_posts(struct bench *b, int inline_data, unsigned calls, struct samples *s)
{
	unsigned i, j;

	for (i = 0; i < calls; i += ROUND) {
		struct stamp t0 = stamp_start();

		for (j = 0; j < ROUND; j++) {
			struct ibv_send_wr *wr = inline_data ? &b->one_inline : &b->one_sge;

			wr->wr_id = b->next_wr_id++;
			if (inline_data)
				check(bench_p_send_inline64(b->qp, wr), "ibv_post_send");
			else
				check(bench_p_send_sge64(b->qp, wr), "ibv_post_send");
		}
		stamp_end(s, t0);
		b->pending_cqes += ROUND;
		drain(b);
	}
	report(inline_data ? "send_inline64" : "send_sge64", "provider", s, ROUND, 1);
}

static void chains(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned i, k;

	for (i = 0; i < calls; i++) {
		struct stamp t0;

		for (k = 0; k < CHAIN; k++)
			b->chain[k].wr_id = b->next_wr_id++;
		t0 = stamp_start();
		check(bench_p_chain32(b->qp, b->chain), "ibv_post_send");
		stamp_end(s, t0);
		b->pending_cqes += CHAIN;
		drain(b);
	}
	report("chain32", "provider", s, 1, CHAIN);
}

static void polls(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned i, j, k;

	for (i = 0; i < calls; i += FILL) {
		struct ibv_send_wr *bad;
		struct stamp t0;

		for (j = 0; j < FILL; j += CHAIN) {
			for (k = 0; k < CHAIN; k++)
				b->chain[k].wr_id = b->next_wr_id++;
			check(ibv_post_send(b->qp, b->chain, &bad), "ibv_post_send (fill)");
		}
		barrier(b);
		t0 = stamp_start();
		for (j = 0; j < FILL; j++) {
			struct ibv_wc wc;
			int n = bench_p_poll_cqe(b->scq, &wc);

			if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.opcode != IBV_WC_SEND)
				die("ibv_poll_cq returned %d (status %d, opcode %d) with %u CQEs due", n,
				    wc.status, wc.opcode, FILL - j);
		}
		stamp_end(s, t0);
		refill_recv(b);
	}
	report("poll_cqe", "provider", s, FILL, 1);
}

/* ---- setup ---- */

static void setup(struct bench *b)
{
	struct ibv_device **list;
	struct ibv_port_attr port;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr a;
	unsigned k;

	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no RDMA device (is the preload loaded?)");
	b->ctx = ibv_open_device(list[0]);
	if (!b->ctx)
		die("ibv_open_device failed");
	ibv_free_device_list(list);
	if (ibv_query_port(b->ctx, 1, &port))
		die("ibv_query_port failed");
	b->pd = ibv_alloc_pd(b->ctx);
	if (!b->pd)
		die("ibv_alloc_pd failed");
	memset(b->buf, 0x5a, sizeof(b->buf));
	memset(b->buf + FLAG_SRC, 0, 128);
	b->mr = ibv_reg_mr(b->pd, b->buf, sizeof(b->buf),
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ);
	if (!b->mr)
		die("ibv_reg_mr failed: %s", strerror(errno));
	b->scq = ibv_create_cq(b->ctx, CQ_SIZE, NULL, NULL, 0);
	if (!b->scq)
		die("ibv_create_cq failed: %s", strerror(errno));
	b->rcq = ibv_create_cq(b->ctx, CQ_SIZE, NULL, NULL, 0);
	if (!b->rcq)
		die("ibv_create_cq (recv) failed: %s", strerror(errno));

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = b->scq;
	qa.recv_cq = b->rcq;
	qa.cap.max_send_wr = SQ_WRS;
	qa.cap.max_recv_wr = RQ_WRS;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = PAYLOAD;
	qa.sq_sig_all = 0;
	b->qp = ibv_create_qp(b->pd, &qa);
	if (!b->qp)
		die("ibv_create_qp failed: %s", strerror(errno));

	/* RC loopback: the QP is connected to itself. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(b->qp, &a,
			  IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("modify to INIT failed");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = b->qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = port.lid;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(b->qp, &a,
			  IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("modify to RTR failed");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(b->qp, &a,
			  IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				  IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC))
		die("modify to RTS failed");

	b->sge = (struct ibv_sge){ .addr = (uintptr_t)b->buf, .length = PAYLOAD, .lkey = b->mr->lkey };
	memset(&b->one_inline, 0, sizeof(b->one_inline));
	b->one_inline.sg_list = &b->sge;
	b->one_inline.num_sge = 1;
	b->one_inline.opcode = IBV_WR_SEND;
	b->one_inline.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	b->one_sge = b->one_inline;
	b->one_sge.send_flags = IBV_SEND_SIGNALED;
	for (k = 0; k < CHAIN; k++) {
		b->chain[k] = b->one_sge;
		b->chain[k].next = k + 1 < CHAIN ? &b->chain[k + 1] : NULL;
	}
	b->flag_sge = (struct ibv_sge){ .addr = (uintptr_t)b->buf + FLAG_DST, .length = 8,
					.lkey = b->mr->lkey };
	memset(&b->flag_read, 0, sizeof(b->flag_read));
	b->flag_read.sg_list = &b->flag_sge;
	b->flag_read.num_sge = 1;
	b->flag_read.opcode = IBV_WR_RDMA_READ;
	b->flag_read.send_flags = 0; /* unsignalled: it adds no CQE */
	b->flag_read.wr.rdma.remote_addr = (uintptr_t)b->buf + FLAG_SRC;
	b->flag_read.wr.rdma.rkey = b->mr->rkey;
	refill_recv(b);
}

int main(int argc, char **argv)
{
	static struct bench b;
	struct samples s;
	unsigned calls, done, pass, cap;

	if (argc != 2 || (calls = strtoul(argv[1], NULL, 0)) == 0)
		die("usage: %s <calls per operation>", argv[0]);
	cap = (calls > WARMUP ? calls : WARMUP) + FILL;
	s.ns = calloc(cap, sizeof(uint64_t));
	s.tk = calloc(cap, sizeof(uint64_t));
	s.n = 0;
	if (!s.ns || !s.tk)
		die("out of memory");
	setup(&b);
	for (done = 0; done < calls; done++)
		stamp_end(&s, stamp_start());
	report("timer_overhead", "none", &s, 1, 1);
	for (pass = 0; pass < 2; pass++) {
		unsigned n = pass ? calls : WARMUP;

		quiet = !pass;
		if (pass)
			bench_zero_stats();
		single_posts(&b, 1, n, &s);
		single_posts(&b, 0, n, &s);
		chains(&b, n, &s);
		polls(&b, n, &s);
	}
	printf("info device=%s\n", ibv_get_device_name(b.ctx->device));
	check(ibv_destroy_qp(b.qp), "ibv_destroy_qp");
	check(ibv_destroy_cq(b.scq), "ibv_destroy_cq");
	check(ibv_destroy_cq(b.rcq), "ibv_destroy_cq");
	check(ibv_dereg_mr(b.mr), "ibv_dereg_mr");
	check(ibv_dealloc_pd(b.pd), "ibv_dealloc_pd");
	check(ibv_close_device(b.ctx), "ibv_close_device");
	return 0;
}
