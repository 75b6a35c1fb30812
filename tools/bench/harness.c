/*
 * mlx5-bench C harness: the libmlx5 side of the per-operation CPU-cost benchmark.
 *
 * Usage: bench-harness <calls>
 * Runs on the first RDMA device, which under LD_PRELOAD=libmlx5_emu_preload.so (with
 * MLX5_EMU_FABRIC=inprocess) is the emulated ConnectX. One RC QP connected to itself, a send
 * CQ and a receive CQ, both created with ibv_create_cq_ex (so both ibv_poll_cq and
 * ibv_start_poll work on them). Receive posts and receive completions are measured too: SENDs
 * to self (unmeasured) consume receives and produce receive CQEs. Each operation is one noinline wrapper function (bench_c_*), so that
 * `valgrind --tool=callgrind --collect-atstart=no --toggle-collect=bench_c_<op>` counts the
 * instructions of the wrapper and of libibverbs/libmlx5 below it, and nothing of the
 * emulator's device thread. The calls are also timed (clock_gettime, and the TSC on
 * x86_64): single posts and polls in batches (the clock is too coarse for one call), chains
 * one call at a time. After the posts of a batch the harness waits until the device has
 * taken the doorbell (BlueFlame halves read back as zero) and drains the completions.
 *
 * Output, one line per operation:
 *   result <op> <api> calls=<n> batch=<b> wrs_per_call=<k> ns=<median> ticks=<median>
 * where the medians are over timed regions of <b> back-to-back wrapper calls (ticks=0
 * where there is no TSC); a first `timer_overhead` line times empty regions. Failures: message on stderr, exit status 1.
 * libmlx5 knobs come from the environment the Rust side sets (MLX5_POST_SEND_PREFER_BF=0:
 * BlueFlame for single inline WQEs only, 8-byte doorbells otherwise).
 */
#define _GNU_SOURCE
#include <endian.h>
#include <errno.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#if defined(__x86_64__)
#include <x86intrin.h>
static inline uint64_t ticks(void) { return __rdtsc(); }
#else
static inline uint64_t ticks(void) { return 0; }
#endif

#define CHAIN 32
#define PAYLOAD 64
#define PAYLOAD_SMALL 32
#define SQ_WRS 128
#define RQ_WRS 256
#define CQ_SIZE 512
#define ROUND 32
#define WARMUP 64

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("bench-harness: ", stderr);
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
	struct ibv_cq_ex *scq_ex, *rcq_ex;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qpx;
	struct mlx5dv_qp dv;
	struct mlx5dv_cq dvcq, dvrcq;
	uint8_t buf[4096] __attribute__((aligned(64)));
	struct ibv_sge sge;              /* 64 bytes at buf + 0 */
	struct ibv_send_wr one_inline;   /* 64-byte inline SEND */
	struct ibv_sge sge32;            /* the first 32 bytes of buf */
	struct ibv_send_wr one_inline32; /* 32-byte inline SEND (one WQEBB) */
	struct ibv_send_wr one_sge;      /* 64-byte SEND, one SGE */
	struct ibv_send_wr chain[CHAIN]; /* 32 SENDs with one SGE each */
	struct ibv_sge rsge;             /* 1024 bytes at buf + 2048: every receive */
	struct ibv_recv_wr rchain[CHAIN]; /* 32 receives with one SGE each */
	unsigned recv_posted;
	uint64_t next_wr_id;
	unsigned pending_cqes; /* send CQEs the device owes or the CQ holds */
};

/* ---- the measured wrappers (noinline: callgrind toggles on them) ---- */

__attribute__((noinline)) int bench_c_send_inline_verbs(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_send_inline_wr(struct ibv_qp_ex *x, uint64_t wr_id,
						      const void *data)
{
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, (void *)data, PAYLOAD);
	return ibv_wr_complete(x);
}

__attribute__((noinline)) int bench_c_send_inline32_verbs(struct ibv_qp *qp,
							   struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_send_inline32_wr(struct ibv_qp_ex *x, uint64_t wr_id,
							const void *data)
{
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_inline_data(x, (void *)data, PAYLOAD_SMALL);
	return ibv_wr_complete(x);
}

__attribute__((noinline)) int bench_c_send_sge_verbs(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_send_sge_wr(struct ibv_qp_ex *x, uint64_t wr_id,
						   const struct ibv_sge *sge)
{
	ibv_wr_start(x);
	x->wr_id = wr_id;
	x->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send(x);
	ibv_wr_set_sge(x, sge->lkey, sge->addr, sge->length);
	return ibv_wr_complete(x);
}

__attribute__((noinline)) int bench_c_chain_verbs(struct ibv_qp *qp, struct ibv_send_wr *wr)
{
	struct ibv_send_wr *bad;
	return ibv_post_send(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_chain_wr(struct ibv_qp_ex *x, uint64_t wr_id,
						const struct ibv_sge *sge)
{
	int i;

	ibv_wr_start(x);
	for (i = 0; i < CHAIN; i++) {
		x->wr_id = wr_id + i;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(x);
		ibv_wr_set_sge(x, sge->lkey, sge->addr, sge->length);
	}
	return ibv_wr_complete(x);
}

__attribute__((noinline)) int bench_c_poll_verbs(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 1, wc);
}

/* One CQE through the extended CQ API; returns 1 with *wr_id and *status, or 0. */
__attribute__((noinline)) int bench_c_poll_wr(struct ibv_cq_ex *cq, uint64_t *wr_id,
					       int *status)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };

	if (ibv_start_poll(cq, &attr))
		return 0;
	*wr_id = cq->wr_id;
	*status = cq->status;
	ibv_end_poll(cq);
	return 1;
}

__attribute__((noinline)) int bench_c_recv_verbs(struct ibv_qp *qp, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

/* libmlx5 has no lower-level receive API than ibv_post_recv: the "lowlevel" receive rows
 * measure it too (a separate wrapper, so that both rows have their own call counts). */
__attribute__((noinline)) int bench_c_recv_wr(struct ibv_qp *qp, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_recv_chain_verbs(struct ibv_qp *qp, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_recv_chain_wr(struct ibv_qp *qp, struct ibv_recv_wr *wr)
{
	struct ibv_recv_wr *bad;
	return ibv_post_recv(qp, wr, &bad);
}

__attribute__((noinline)) int bench_c_poll_recv_verbs(struct ibv_cq *cq, struct ibv_wc *wc)
{
	return ibv_poll_cq(cq, 1, wc);
}

/* One receive CQE through the extended CQ API; returns 1 with *wr_id, *status and *len. */
__attribute__((noinline)) int bench_c_poll_recv_wr(struct ibv_cq_ex *cq, uint64_t *wr_id,
						    int *status, uint32_t *len)
{
	struct ibv_poll_cq_attr attr = { .comp_mask = 0 };

	if (ibv_start_poll(cq, &attr))
		return 0;
	*wr_id = cq->wr_id;
	*status = cq->status;
	*len = ibv_wc_read_byte_len(cq);
	ibv_end_poll(cq);
	return 1;
}

/* Called once between the warm-up pass and the measured pass: the benchmark runs callgrind
 * with --zero-before=bench_zero_stats, so one-time costs (lazy symbol binding, first use)
 * incurred by the wrappers during warm-up are not counted. */
__attribute__((noinline)) void bench_zero_stats(void)
{
	__asm__ volatile("" ::: "memory");
}

/* ---- device synchronisation and bookkeeping (not measured) ---- */

static void wait_doorbell_taken(const struct bench *b)
{
	volatile uint64_t *h0 = (volatile uint64_t *)b->dv.bf.reg;
	volatile uint64_t *h1 = (volatile uint64_t *)((char *)b->dv.bf.reg + b->dv.bf.size);
	double t0 = now_s();

	while (*h0 != 0 || (b->dv.bf.size && *h1 != 0)) {
		if (now_s() - t0 > 30.0)
			die("the device did not take a doorbell in 30 s");
		sched_yield();
	}
}

/* Wait until the CQ `dvcq` holds `n` software-owned CQEs past the published consumer index. */
static void wait_cqes_on(const struct mlx5dv_cq *dvcq, unsigned n)
{
	double t0 = now_s();
	uint32_t ci, idx;
	const volatile uint8_t *cqe;
	uint8_t op_own;

	if (!n)
		return;
	for (;;) {
		ci = be32toh(((volatile uint32_t *)dvcq->dbrec)[0]) & 0xffffff;
		idx = ci + n - 1;
		cqe = (const volatile uint8_t *)dvcq->buf +
		      (size_t)(idx & (dvcq->cqe_cnt - 1)) * dvcq->cqe_size +
		      (dvcq->cqe_size - 64);
		op_own = cqe[63];
		if ((op_own >> 4) != 0xf && (op_own & 1) == !!(idx & dvcq->cqe_cnt))
			return;
		if (now_s() - t0 > 30.0)
			die("the device did not write %u CQEs in 30 s", n);
		sched_yield();
	}
}

static void wait_cqes(const struct bench *b, unsigned n)
{
	wait_cqes_on(&b->dvcq, n);
}

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
		if (ibv_post_recv(b->qp, &rw, &bad))
			die("ibv_post_recv failed");
		b->recv_posted++;
	}
}

/* Poll every send completion the device owes (unmeasured). */
static void drain_send_only(struct bench *b)
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
			if (now_s() - t0 > 30.0)
				die("%u send completions missing after 30 s", b->pending_cqes);
			sched_yield();
		}
	}
}

/* Poll every send completion the device owes (unmeasured) and top up the receive queue. */
static void drain_send(struct bench *b)
{
	drain_send_only(b);
	refill_recv(b);
}

/* Send `n` (a multiple of CHAIN) SENDs (unmeasured), so that the device consumes `n`
 * receives and writes `n` receive CQEs; wait for them, and drain the send completions. */
static void send_to_self(struct bench *b, unsigned n)
{
	struct ibv_send_wr *bad;
	unsigned j, k;

	for (j = 0; j < n; j += CHAIN) {
		for (k = 0; k < CHAIN; k++)
			b->chain[k].wr_id = b->next_wr_id++;
		check(ibv_post_send(b->qp, b->chain, &bad), "ibv_post_send (to self)");
		b->pending_cqes += CHAIN;
		wait_doorbell_taken(b);
	}
	drain_send_only(b);
	wait_cqes_on(&b->dvrcq, n);
}

/* Make room for `n` receives (unmeasured): SENDs consume them, their receive completions
 * are polled. */
static void make_recv_room(struct bench *b, unsigned n)
{
	struct ibv_wc wc[32];
	unsigned got = 0;
	int m, i;

	send_to_self(b, n);
	while (got < n) {
		m = ibv_poll_cq(b->rcq, n - got < 32 ? n - got : 32, wc);
		if (m <= 0)
			die("receive completions missing (%d)", m);
		for (i = 0; i < m; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				die("receive completion: %s", ibv_wc_status_str(wc[i].status));
		got += m;
	}
	b->recv_posted -= n;
}

/* ---- timing ---- */

/* One sample per timed region (a batch of `batch` wrapper calls). */
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

/* Set during the warm-up pass: results are not printed. */
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

/* Single-WR posts: timed in batches of ROUND back-to-back calls (the clock is too coarse
 * for one call); the device takes the doorbells and the completions are drained between
 * batches. */
static void single_posts(struct bench *b, const char *op, int inline_data, unsigned calls,
			 struct samples *s)
{
	unsigned api, i, j;
	int small = inline_data == PAYLOAD_SMALL;

	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i += ROUND) {
			struct stamp t0 = stamp_start();

			for (j = 0; j < ROUND; j++) {
				uint64_t id = b->next_wr_id++;

				if (api == 0) {
					struct ibv_send_wr *wr = small	     ? &b->one_inline32 :
								 inline_data ? &b->one_inline :
									       &b->one_sge;

					wr->wr_id = id;
					if (small)
						check(bench_c_send_inline32_verbs(b->qp, wr), "ibv_post_send");
					else if (inline_data)
						check(bench_c_send_inline_verbs(b->qp, wr), "ibv_post_send");
					else
						check(bench_c_send_sge_verbs(b->qp, wr), "ibv_post_send");
				} else if (small) {
					check(bench_c_send_inline32_wr(b->qpx, id, b->buf), "ibv_wr_complete");
				} else if (inline_data) {
					check(bench_c_send_inline_wr(b->qpx, id, b->buf), "ibv_wr_complete");
				} else {
					check(bench_c_send_sge_wr(b->qpx, id, &b->sge), "ibv_wr_complete");
				}
			}
			stamp_end(s, t0);
			b->pending_cqes += ROUND;
			wait_doorbell_taken(b);
			drain_send(b);
		}
		report(op, api ? "lowlevel" : "verbs", s, ROUND, 1);
	}
}

/* Chains: every call timed on its own, the device runs between calls. */
static void chains(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned api, i, k;

	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i++) {
			uint64_t id = b->next_wr_id;
			struct stamp t0;

			b->next_wr_id += CHAIN;
			if (api == 0) {
				for (k = 0; k < CHAIN; k++)
					b->chain[k].wr_id = id + k;
				t0 = stamp_start();
				check(bench_c_chain_verbs(b->qp, b->chain), "ibv_post_send");
			} else {
				t0 = stamp_start();
				check(bench_c_chain_wr(b->qpx, id, &b->sge), "ibv_wr_complete");
			}
			stamp_end(s, t0);
			b->pending_cqes += CHAIN;
			wait_doorbell_taken(b);
			drain_send(b);
		}
		report("chain32", api ? "lowlevel" : "verbs", s, 1, CHAIN);
	}
}

/* Polling: the CQ is filled with FILL completions (posted unmeasured), then they are polled
 * one per call, the FILL calls timed as one batch. */
#define FILL (2 * CHAIN)
static void polls(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned api, i, j, k;

	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i += FILL) {
			struct ibv_send_wr *bad;
			struct stamp t0;

			for (j = 0; j < FILL; j += CHAIN) {
				for (k = 0; k < CHAIN; k++)
					b->chain[k].wr_id = b->next_wr_id++;
				check(ibv_post_send(b->qp, b->chain, &bad), "ibv_post_send (fill)");
				wait_doorbell_taken(b);
			}
			wait_cqes(b, FILL);
			t0 = stamp_start();
			for (j = 0; j < FILL; j++) {
				if (api == 0) {
					struct ibv_wc wc;
					int n = bench_c_poll_verbs(b->scq, &wc);

					if (n != 1 || wc.status != IBV_WC_SUCCESS)
						die("ibv_poll_cq returned %d (status %d)", n, wc.status);
				} else {
					uint64_t wr_id = 0;
					int status = -1;
					int n = bench_c_poll_wr(b->scq_ex, &wr_id, &status);

					if (n != 1 || status != IBV_WC_SUCCESS)
						die("ibv_start_poll returned %d (status %d)", n, status);
				}
			}
			stamp_end(s, t0);
			refill_recv(b);
		}
		report("poll_cqe", api ? "lowlevel" : "verbs", s, FILL, 1);
	}
}

/* Receive posts: 1-WR posts timed in batches of ROUND calls, chains one call each. Before
 * every timed region, SENDs to self (unmeasured) consume as many receives as it posts. */
static void recv_posts(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned api, i, j, k;

	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i += ROUND) {
			struct stamp t0;

			make_recv_room(b, ROUND);
			t0 = stamp_start();
			for (j = 0; j < ROUND; j++) {
				b->rchain[CHAIN - 1].wr_id = b->next_wr_id++;
				if (api == 0)
					check(bench_c_recv_verbs(b->qp, &b->rchain[CHAIN - 1]), "ibv_post_recv");
				else
					check(bench_c_recv_wr(b->qp, &b->rchain[CHAIN - 1]), "ibv_post_recv");
			}
			stamp_end(s, t0);
			b->recv_posted += ROUND;
		}
		report("recv1", api ? "lowlevel" : "verbs", s, ROUND, 1);
	}
	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i++) {
			struct stamp t0;

			make_recv_room(b, CHAIN);
			for (k = 0; k < CHAIN; k++)
				b->rchain[k].wr_id = b->next_wr_id++;
			t0 = stamp_start();
			if (api == 0)
				check(bench_c_recv_chain_verbs(b->qp, b->rchain), "ibv_post_recv");
			else
				check(bench_c_recv_chain_wr(b->qp, b->rchain), "ibv_post_recv");
			stamp_end(s, t0);
			b->recv_posted += CHAIN;
		}
		report("recv_chain32", api ? "lowlevel" : "verbs", s, 1, CHAIN);
	}
}

/* Receive polling: FILL SENDs to self (unmeasured) put FILL receive CQEs in the receive CQ,
 * which are then polled one per call, the FILL calls timed as one region. */
static void recv_polls(struct bench *b, unsigned calls, struct samples *s)
{
	unsigned api, i, j;

	for (api = 0; api < 2; api++) {
		for (i = 0; i < calls; i += FILL) {
			struct stamp t0;

			send_to_self(b, FILL);
			t0 = stamp_start();
			for (j = 0; j < FILL; j++) {
				if (api == 0) {
					struct ibv_wc wc;
					int n = bench_c_poll_recv_verbs(b->rcq, &wc);

					if (n != 1 || wc.status != IBV_WC_SUCCESS || wc.byte_len != PAYLOAD)
						die("ibv_poll_cq (recv) returned %d (status %d, %u bytes)", n,
						    wc.status, wc.byte_len);
				} else {
					uint64_t wr_id = 0;
					uint32_t len = 0;
					int status = -1;
					int n = bench_c_poll_recv_wr(b->rcq_ex, &wr_id, &status, &len);

					if (n != 1 || status != IBV_WC_SUCCESS || len != PAYLOAD)
						die("ibv_start_poll (recv) returned %d (status %d, %u bytes)", n,
						    status, len);
				}
			}
			stamp_end(s, t0);
			b->recv_posted -= FILL;
			refill_recv(b);
		}
		report("poll_recv", api ? "lowlevel" : "verbs", s, FILL, 1);
	}
}

/* ---- setup ---- */

static void setup(struct bench *b)
{
	struct ibv_device **list;
	struct ibv_port_attr port;
	struct ibv_cq_init_attr_ex cqa;
	struct ibv_qp_init_attr_ex qa;
	struct ibv_qp_attr a;
	struct mlx5dv_obj obj;
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
	b->mr = ibv_reg_mr(b->pd, b->buf, sizeof(b->buf), IBV_ACCESS_LOCAL_WRITE);
	if (!b->mr)
		die("ibv_reg_mr failed: %s", strerror(errno));

	memset(&cqa, 0, sizeof(cqa));
	cqa.cqe = CQ_SIZE;
	cqa.wc_flags = IBV_WC_STANDARD_FLAGS;
	b->scq_ex = ibv_create_cq_ex(b->ctx, &cqa);
	if (!b->scq_ex)
		die("ibv_create_cq_ex failed: %s", strerror(errno));
	b->scq = ibv_cq_ex_to_cq(b->scq_ex);
	b->rcq_ex = ibv_create_cq_ex(b->ctx, &cqa);
	if (!b->rcq_ex)
		die("ibv_create_cq_ex (recv) failed: %s", strerror(errno));
	b->rcq = ibv_cq_ex_to_cq(b->rcq_ex);

	memset(&qa, 0, sizeof(qa));
	qa.qp_type = IBV_QPT_RC;
	qa.send_cq = b->scq;
	qa.recv_cq = b->rcq;
	qa.cap.max_send_wr = SQ_WRS;
	qa.cap.max_recv_wr = RQ_WRS;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = PAYLOAD;
	qa.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	qa.pd = b->pd;
	qa.send_ops_flags = IBV_QP_EX_WITH_SEND;
	b->qp = ibv_create_qp_ex(b->ctx, &qa);
	if (!b->qp)
		die("ibv_create_qp_ex failed: %s", strerror(errno));
	b->qpx = ibv_qp_to_qp_ex(b->qp);
	if (!b->qpx)
		die("ibv_qp_to_qp_ex failed");
	obj.qp.in = b->qp;
	obj.qp.out = &b->dv;
	obj.cq.in = b->scq;
	obj.cq.out = &b->dvcq;
	if (mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ))
		die("mlx5dv_init_obj failed");
	obj.cq.in = b->rcq;
	obj.cq.out = &b->dvrcq;
	if (mlx5dv_init_obj(&obj, MLX5DV_OBJ_CQ))
		die("mlx5dv_init_obj (recv CQ) failed");

	/* RC loopback: the QP is connected to itself. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE;
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
	b->sge32 = b->sge;
	b->sge32.length = PAYLOAD_SMALL;
	b->one_inline32 = b->one_inline;
	b->one_inline32.sg_list = &b->sge32;
	b->one_sge.send_flags = IBV_SEND_SIGNALED;
	for (k = 0; k < CHAIN; k++) {
		b->chain[k] = b->one_sge;
		b->chain[k].next = k + 1 < CHAIN ? &b->chain[k + 1] : NULL;
	}
	b->rsge = (struct ibv_sge){ .addr = (uintptr_t)b->buf + 2048, .length = 1024, .lkey = b->mr->lkey };
	for (k = 0; k < CHAIN; k++) {
		memset(&b->rchain[k], 0, sizeof(b->rchain[k]));
		b->rchain[k].sg_list = &b->rsge;
		b->rchain[k].num_sge = 1;
		b->rchain[k].next = k + 1 < CHAIN ? &b->rchain[k + 1] : NULL;
	}
	refill_recv(b);
}

int main(int argc, char **argv)
{
	static struct bench b;
	struct samples s;
	unsigned calls, calls_done, pass, cap;

	if (argc != 2 || (calls = strtoul(argv[1], NULL, 0)) == 0)
		die("usage: %s <calls per operation>", argv[0]);
	cap = (calls > WARMUP ? calls : WARMUP) + FILL;
	s.ns = calloc(cap, sizeof(uint64_t));
	s.tk = calloc(cap, sizeof(uint64_t));
	s.n = 0;
	if (!s.ns || !s.tk)
		die("out of memory");
	setup(&b);
	/* The cost of an empty timed region (subtracted by the Rust side). */
	for (calls_done = 0; calls_done < calls; calls_done++)
		stamp_end(&s, stamp_start());
	report("timer_overhead", "none", &s, 1, 1);
	/* Warm-up: every operation once through the same wrappers (not reported, and not
	 * counted by callgrind: see bench_zero_stats), then the measured pass. */
	for (pass = 0; pass < 2; pass++) {
		unsigned n = pass ? calls : WARMUP;

		quiet = !pass;
		if (pass)
			bench_zero_stats();
		single_posts(&b, "send_inline32", PAYLOAD_SMALL, n, &s);
		single_posts(&b, "send_inline64", 1, n, &s);
		single_posts(&b, "send_sge64", 0, n, &s);
		chains(&b, n, &s);
		polls(&b, n, &s);
		recv_posts(&b, n, &s);
		recv_polls(&b, n, &s);
	}
	printf("info bf_size=%u sq_wqe_cnt=%u cqe_cnt=%u\n", b.dv.bf.size, b.dv.sq.wqe_cnt,
	       b.dvcq.cqe_cnt);
	ibv_destroy_qp(b.qp);
	ibv_destroy_cq(b.scq);
	ibv_destroy_cq(b.rcq);
	ibv_dereg_mr(b.mr);
	ibv_dealloc_pd(b.pd);
	ibv_close_device(b.ctx);
	return 0;
}
