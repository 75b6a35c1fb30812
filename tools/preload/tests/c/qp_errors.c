/* Error paths of a libibverbs/libmlx5 program on the emulated HCA, one scenario per run
 * (argv[1]); every line printed is "KEY VALUE". Exit status 0 when every step behaved as the
 * scenario expects; a teardown that waits for events it was never given never returns, so
 * the caller runs this under a time limit.
 *
 *   faa-lkey      RC: a fetch-and-add whose local key is its MR's lkey + 1 completes with
 *                 IBV_WC_LOC_PROT_ERR, then every object is destroyed.
 *   event-read    RC: an RDMA WRITE with a bad rkey; the responder's QP gets
 *                 IBV_EVENT_QP_ACCESS_ERR, which is read and acknowledged; teardown.
 *   event-unread  the same, the event never read: teardown returns and the event of the
 *                 destroyed QP is gone from the async fd.
 *   comp-shared   two CQs on one completion channel, one event each; one is read and
 *                 acknowledged, then both CQs are destroyed.
 *   sqe-ud        UD (sqe-uc: UC): a send with a bad lkey completes with LOC_PROT_ERR and
 *                 the QP is in SQE; two sends posted then complete with WR_FLUSH_ERR; the
 *                 modify SQE->RTS succeeds and the next send arrives. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <infiniband/verbs.h>

#define CHECK(c, what)                                                                     \
	do {                                                                               \
		if (!(c)) {                                                                \
			fprintf(stderr, "FAIL %s (errno %d %s)\n", what, errno,           \
				strerror(errno));                                          \
			return 1;                                                          \
		}                                                                          \
	} while (0)

static char buf_a[4096] __attribute__((aligned(64)));
static char buf_b[4096] __attribute__((aligned(64)));

struct side {
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
};

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_comp_channel *chan;
static uint16_t lid;
static union ibv_gid gid;
static int roce;

/* Poll `cq` for one completion (2 s at most). */
static int poll1(struct ibv_cq *cq, struct ibv_wc *wc) {
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, wc);
		if (n != 0)
			return n;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 2)
			return 0;
	}
}

static int make_side(struct side *s, enum ibv_qp_type t, char *buf, int with_chan) {
	s->cq = ibv_create_cq(ctx, 64, NULL, with_chan ? chan : NULL, 0);
	CHECK(s->cq, "ibv_create_cq");
	int acc = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
		  IBV_ACCESS_REMOTE_ATOMIC;
	s->mr = ibv_reg_mr(pd, buf, 4096, acc);
	CHECK(s->mr, "ibv_reg_mr");
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = t,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};
	s->qp = ibv_create_qp(pd, &ia);
	CHECK(s->qp, "ibv_create_qp");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .pkey_index = 0 };
	int mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
	if (t == IBV_QPT_UD) {
		a.qkey = 0x11111111;
		mask |= IBV_QP_QKEY;
	} else {
		a.qp_access_flags = acc & ~IBV_ACCESS_LOCAL_WRITE;
		mask |= IBV_QP_ACCESS_FLAGS;
	}
	CHECK(!ibv_modify_qp(s->qp, &a, mask), "modify to INIT");
	return 0;
}

static void fill_ah(struct ibv_ah_attr *ah) {
	memset(ah, 0, sizeof *ah);
	ah->dlid = lid;
	ah->port_num = 1;
	if (roce) {
		ah->is_global = 1;
		ah->grh.dgid = gid;
		ah->grh.hop_limit = 64;
	}
}

static int connect_to(struct side *s, enum ibv_qp_type t, uint32_t remote_qpn) {
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	int mask = IBV_QP_STATE;
	if (t != IBV_QPT_UD) {
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = remote_qpn;
		a.rq_psn = 0;
		fill_ah(&a.ah_attr);
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
		if (t == IBV_QPT_RC) {
			a.max_dest_rd_atomic = 1;
			a.min_rnr_timer = 1;
			mask |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
		}
	}
	CHECK(!ibv_modify_qp(s->qp, &a, mask), "modify to RTR");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	mask = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (t == IBV_QPT_RC) {
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = 1;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	}
	CHECK(!ibv_modify_qp(s->qp, &a, mask), "modify to RTS");
	return 0;
}

static int pair(struct side *a, struct side *b, enum ibv_qp_type t, int with_chan) {
	if (make_side(a, t, buf_a, with_chan) || make_side(b, t, buf_b, with_chan))
		return 1;
	return connect_to(a, t, b->qp->qp_num) || connect_to(b, t, a->qp->qp_num);
}

static int teardown(struct side *a, struct side *b) {
	CHECK(!ibv_destroy_qp(a->qp), "ibv_destroy_qp a");
	CHECK(!ibv_destroy_qp(b->qp), "ibv_destroy_qp b");
	printf("destroy_qp returned\n");
	CHECK(!ibv_destroy_cq(a->cq), "ibv_destroy_cq a");
	CHECK(!ibv_destroy_cq(b->cq), "ibv_destroy_cq b");
	printf("destroy_cq returned\n");
	CHECK(!ibv_dereg_mr(a->mr) && !ibv_dereg_mr(b->mr), "ibv_dereg_mr");
	return 0;
}

static int post_one(struct ibv_qp *qp, struct ibv_send_wr *wr) {
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(qp, wr, &bad);
	if (rc)
		fprintf(stderr, "ibv_post_send: %s\n", strerror(rc));
	return rc;
}

static int faa_lkey(void) {
	struct side a, b;
	if (pair(&a, &b, IBV_QPT_RC, 0))
		return 1;
	struct ibv_sge s = { (uintptr_t)buf_a, 8, a.mr->lkey + 1 };
	struct ibv_send_wr wr = {
		.wr_id = 7, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_ATOMIC_FETCH_AND_ADD,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.atomic = { .remote_addr = (uintptr_t)buf_b, .compare_add = 1,
			       .rkey = b.mr->rkey },
	};
	CHECK(!post_one(a.qp, &wr), "post FAA");
	struct ibv_wc wc;
	CHECK(poll1(a.cq, &wc) == 1, "the FAA's completion");
	printf("status %s\n", ibv_wc_status_str(wc.status));
	return teardown(&a, &b);
}

static int bad_rkey_write(struct side *a, struct side *b) {
	struct ibv_sge s = { (uintptr_t)buf_a, 8, a->mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
		.send_flags = IBV_SEND_SIGNALED,
		.wr.rdma = { .remote_addr = (uintptr_t)buf_b, .rkey = b->mr->rkey + 1 },
	};
	CHECK(!post_one(a->qp, &wr), "post RDMA WRITE");
	struct ibv_wc wc;
	CHECK(poll1(a->cq, &wc) == 1, "the WRITE's completion");
	printf("status %s\n", ibv_wc_status_str(wc.status));
	return 0;
}

static int event_test(int read_it) {
	struct side a, b;
	if (pair(&a, &b, IBV_QPT_RC, 0) || bad_rkey_write(&a, &b))
		return 1;
	int fl = fcntl(ctx->async_fd, F_GETFL);
	CHECK(fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK) == 0, "O_NONBLOCK");
	if (read_it) {
		struct ibv_async_event ev;
		struct timespec t0, t;
		clock_gettime(CLOCK_MONOTONIC, &t0);
		while (ibv_get_async_event(ctx, &ev)) {
			clock_gettime(CLOCK_MONOTONIC, &t);
			CHECK(errno == EAGAIN && t.tv_sec - t0.tv_sec < 3, "an async event");
		}
		printf("event %s\n", ibv_event_type_str(ev.event_type));
		printf("event_qp %s\n", ev.element.qp == b.qp ? "responder" : "other");
		ibv_ack_async_event(&ev);
	} else {
		/* Let the event arrive before the teardown. */
		struct timespec d = { 0, 100 * 1000 * 1000 };
		nanosleep(&d, NULL);
	}
	if (teardown(&a, &b))
		return 1;
	struct ibv_async_event ev;
	if (ibv_get_async_event(ctx, &ev) == 0) {
		printf("stale_event %s\n", ibv_event_type_str(ev.event_type));
		return 1;
	}
	printf("stale_event none\n");
	return 0;
}

static int comp_shared(void) {
	chan = ibv_create_comp_channel(ctx);
	CHECK(chan, "ibv_create_comp_channel");
	struct side a, b;
	if (pair(&a, &b, IBV_QPT_RC, 1))
		return 1;
	/* Arm one, let the device see it, arm the other (the emulated device finds doorbells by
	 * scanning the UAR page: two arms written between two of its scans count once). */
	struct timespec gap = { 0, 50 * 1000 * 1000 };
	CHECK(!ibv_req_notify_cq(a.cq, 0), "arm a");
	nanosleep(&gap, NULL);
	CHECK(!ibv_req_notify_cq(b.cq, 0), "arm b");
	nanosleep(&gap, NULL);
	struct ibv_sge rs = { (uintptr_t)buf_b, 64, b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 2, .sg_list = &rs, .num_sge = 1 }, *rbad;
	CHECK(!ibv_post_recv(b.qp, &rwr, &rbad), "post_recv");
	struct ibv_sge s = { (uintptr_t)buf_a, 8, a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	CHECK(!post_one(a.qp, &wr), "post SEND");
	struct ibv_wc wc;
	CHECK(poll1(a.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "send completion");
	CHECK(poll1(b.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS, "recv completion");
	/* Both CQs have raised their event by now; read and acknowledge one. */
	struct timespec d = { 0, 100 * 1000 * 1000 };
	nanosleep(&d, NULL);
	struct ibv_cq *got;
	void *cq_ctx;
	CHECK(!ibv_get_cq_event(chan, &got, &cq_ctx), "ibv_get_cq_event");
	ibv_ack_cq_events(got, 1);
	printf("cq_event %s\n", got == a.cq ? "a" : got == b.cq ? "b" : "other");
	struct pollfd pfd = { .fd = chan->fd, .events = POLLIN };
	printf("other_event %s\n", poll(&pfd, 1, 1000) == 1 ? "pending" : "none");
	/* The CQ whose event was read goes first, while the other's event is still unread. */
	struct ibv_cq *other = got == a.cq ? b.cq : a.cq;
	CHECK(!ibv_destroy_qp(a.qp) && !ibv_destroy_qp(b.qp), "ibv_destroy_qp");
	CHECK(!ibv_destroy_cq(got), "ibv_destroy_cq (event read)");
	CHECK(!ibv_destroy_cq(other), "ibv_destroy_cq (event unread)");
	printf("destroy_cq returned\n");
	CHECK(!ibv_dereg_mr(a.mr) && !ibv_dereg_mr(b.mr), "ibv_dereg_mr");
	CHECK(!ibv_destroy_comp_channel(chan), "ibv_destroy_comp_channel");
	return 0;
}

static int sqe_test(enum ibv_qp_type t) {
	struct side a, b;
	if (pair(&a, &b, t, 0))
		return 1;
	struct ibv_ah *ah = NULL;
	if (t == IBV_QPT_UD) {
		struct ibv_ah_attr aa;
		fill_ah(&aa);
		ah = ibv_create_ah(pd, &aa);
		CHECK(ah, "ibv_create_ah");
	}
	for (int i = 0; i < 4; i++) {
		struct ibv_sge rs = { (uintptr_t)buf_b + 256 * i, 256, b.mr->lkey };
		struct ibv_recv_wr rwr = { .wr_id = 100 + i, .sg_list = &rs, .num_sge = 1 }, *rbad;
		CHECK(!ibv_post_recv(b.qp, &rwr, &rbad), "post_recv");
	}
	memcpy(buf_a, "after-sqe", 9);
	struct ibv_sge s = { (uintptr_t)buf_a, 9, a.mr->lkey + 1 };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
				  .send_flags = IBV_SEND_SIGNALED };
	if (ah) {
		wr.wr.ud.ah = ah;
		wr.wr.ud.remote_qpn = b.qp->qp_num;
		wr.wr.ud.remote_qkey = 0x11111111;
	}
	CHECK(!post_one(a.qp, &wr), "post the bad send");
	struct ibv_wc wc;
	CHECK(poll1(a.cq, &wc) == 1, "the bad send's completion");
	printf("status %s\n", ibv_wc_status_str(wc.status));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi), "ibv_query_qp");
	printf("state %s\n", qa.qp_state == IBV_QPS_SQE ? "SQE" : "other");
	/* Posted in SQE: accepted, and completed with a flush error each. */
	s.lkey = a.mr->lkey;
	for (int i = 0; i < 2; i++) {
		wr.wr_id = 10 + i;
		CHECK(!post_one(a.qp, &wr), "post in SQE");
	}
	for (int i = 0; i < 2; i++) {
		CHECK(poll1(a.cq, &wc) == 1, "a completion for a send posted in SQE");
		printf("sqe_send %llu %s\n", (unsigned long long)wc.wr_id,
		       ibv_wc_status_str(wc.status));
	}
	CHECK(poll1(b.cq, &wc) == 0, "nothing arrives while in SQE");
	memset(&qa, 0, sizeof qa);
	qa.qp_state = IBV_QPS_RTS;
	qa.cur_qp_state = IBV_QPS_SQE;
	CHECK(!ibv_modify_qp(a.qp, &qa, IBV_QP_STATE | IBV_QP_CUR_STATE), "modify SQE -> RTS");
	CHECK(!ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qi), "ibv_query_qp");
	printf("state_after %s\n", qa.qp_state == IBV_QPS_RTS ? "RTS" : "other");
	wr.wr_id = 20;
	CHECK(!post_one(a.qp, &wr), "post after RTS");
	CHECK(poll1(a.cq, &wc) == 1, "the send after RTS");
	printf("after_send %s\n", ibv_wc_status_str(wc.status));
	CHECK(poll1(b.cq, &wc) == 1, "the receive after RTS");
	size_t off = t == IBV_QPT_UD ? 40 : 0;
	printf("received %s %.*s\n", ibv_wc_status_str(wc.status), 9,
	       buf_b + 256 * (wc.wr_id - 100) + off);
	if (ah)
		CHECK(!ibv_destroy_ah(ah), "ibv_destroy_ah");
	return teardown(&a, &b);
}

int main(int argc, char **argv) {
	if (argc != 2) {
		fprintf(stderr, "usage: qp_errors SCENARIO\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IONBF, 0);
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	CHECK(list && num > 0, "a device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "ibv_alloc_pd");
	struct ibv_port_attr pa;
	CHECK(!ibv_query_port(ctx, 1, &pa), "ibv_query_port");
	lid = pa.lid;
	roce = pa.link_layer == IBV_LINK_LAYER_ETHERNET;
	if (roce)
		CHECK(!ibv_query_gid(ctx, 1, 1, &gid), "ibv_query_gid");
	const char *m = argv[1];
	int rc = !strcmp(m, "faa-lkey")       ? faa_lkey()
		 : !strcmp(m, "event-read")   ? event_test(1)
		 : !strcmp(m, "event-unread") ? event_test(0)
		 : !strcmp(m, "comp-shared")  ? comp_shared()
		 : !strcmp(m, "sqe-ud")       ? sqe_test(IBV_QPT_UD)
		 : !strcmp(m, "sqe-uc")       ? sqe_test(IBV_QPT_UC)
					      : 2;
	if (rc)
		return rc;
	CHECK(!ibv_dealloc_pd(pd), "ibv_dealloc_pd");
	CHECK(!ibv_close_device(ctx), "ibv_close_device");
	ibv_free_device_list(list);
	printf("done\n");
	return 0;
}
