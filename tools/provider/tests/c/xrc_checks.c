/* XRC through libibverbs in one process, the initiator connected to the target of the same
 * port: the domain on a file (O_CREAT, then O_CREAT|O_EXCL refused), an XRC SRQ and its
 * number, a target QP and a second handle on it by ibv_open_qp, close refused while the
 * domain is in use, a chain of SENDs by ibv_post_send naming the SRQ, SENDs and an RDMA
 * WRITE by the ibv_wr_* functions with ibv_wr_set_xrc_srqn, a SEND naming an SRQ that does
 * not exist (an error completion), and an RC QP given the XRC SRQ (refused). One line per
 * check, the same under every provider; "FAIL ..." and exit 1 on the first surprise. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define N 8
#define SZ 256

static void fail(const char *what)
{
	printf("FAIL %s (errno %d)\n", what, errno);
	exit(1);
}

static struct ibv_wc wait_one(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	for (long spins = 0; spins < 200000000L; spins++) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n < 0)
			fail("poll");
		if (n == 1)
			return wc;
	}
	fail("no completion");
	return wc;
}

static void to_rts(struct ibv_qp *snd, struct ibv_qp *tgt, uint16_t lid)
{
	struct ibv_qp_attr a = { 0 };
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	if (ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("tgt init");
	a.qp_access_flags = 0;
	if (ibv_modify_qp(snd, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		fail("send init");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = snd->qp_num;
	a.rq_psn = 7;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		fail("tgt rtr");
	a.dest_qp_num = tgt->qp_num;
	a.rq_psn = 9;
	if (ibv_modify_qp(snd, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				     IBV_QP_RQ_PSN))
		fail("send rtr");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.sq_psn = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(snd, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		fail("send rts");
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.sq_psn = 9;
	if (ibv_modify_qp(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN))
		fail("tgt rts");
}

int main(int argc, char **argv)
{
	/* --skip-rc-on-xsrq: leave out the last check (the emulated kernel accepts an RC QP on
	 * an XRC SRQ, which ib_uverbs refuses; libmlx5 passes the command through). */
	int skip_rc = argc > 1 && !strcmp(argv[1], "--skip-rc-on-xsrq");
	setvbuf(stdout, NULL, _IONBF, 0);
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		fail("open device");
	struct ibv_port_attr port;
	if (ibv_query_port(ctx, 1, &port))
		fail("query port");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, 4 * N * SZ);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 4 * N * SZ, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	struct ibv_cq *scq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	struct ibv_cq *rcq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	if (!pd || !mr || !scq || !rcq)
		fail("pd/mr/cq");

	char path[] = "mlx5rs-xrc-XXXXXX"; /* in the working directory */
	int fd = mkstemp(path);
	if (fd < 0)
		fail("mkstemp");
	unlink(path);
	struct ibv_xrcd_init_attr xa = { 0 };
	errno = 0;
	struct ibv_xrcd *bad = ibv_open_xrcd(ctx, &xa);
	printf("open_xrcd without FD/OFLAGS: %s\n", bad ? "opened" : "refused");
	xa.comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS;
	xa.fd = fd;
	xa.oflags = O_CREAT;
	struct ibv_xrcd *xrcd = ibv_open_xrcd(ctx, &xa);
	if (!xrcd)
		fail("open_xrcd O_CREAT");
	printf("open_xrcd O_CREAT: ok\n");
	xa.oflags = O_CREAT | O_EXCL;
	bad = ibv_open_xrcd(ctx, &xa);
	printf("open_xrcd O_CREAT|O_EXCL on a file with a domain: %s errno %d\n",
	       bad ? "opened" : "refused", bad ? 0 : errno);

	struct ibv_srq_init_attr_ex sa = { 0 };
	sa.attr.max_wr = 2 * N;
	sa.attr.max_sge = 1;
	sa.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD | IBV_SRQ_INIT_ATTR_CQ |
		       IBV_SRQ_INIT_ATTR_PD;
	sa.srq_type = IBV_SRQT_XRC;
	sa.xrcd = xrcd;
	sa.cq = rcq;
	sa.pd = pd;
	struct ibv_srq *srq = ibv_create_srq_ex(ctx, &sa);
	if (!srq)
		fail("create xrc srq");
	uint32_t srqn = 0;
	if (ibv_get_srq_num(srq, &srqn) || srqn == 0 || srqn > 0xffffff)
		fail("get_srq_num");
	printf("xrc srq: number in 24 bits, max_wr >= %d: %s\n", 2 * N,
	       sa.attr.max_wr >= 2 * N ? "yes" : "no");

	struct ibv_qp_init_attr_ex ta = { 0 };
	ta.qp_type = IBV_QPT_XRC_RECV;
	ta.comp_mask = IBV_QP_INIT_ATTR_XRCD;
	ta.xrcd = xrcd;
	struct ibv_qp *tgt = ibv_create_qp_ex(ctx, &ta);
	if (!tgt)
		fail("create xrc_recv");
	struct ibv_qp_open_attr oa = { 0 };
	oa.comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD | IBV_QP_OPEN_ATTR_TYPE;
	oa.qp_num = tgt->qp_num;
	oa.xrcd = xrcd;
	oa.qp_type = IBV_QPT_XRC_RECV;
	struct ibv_qp *opened = ibv_open_qp(ctx, &oa);
	printf("open_qp of the target: %s, same number: %s\n", opened ? "ok" : "refused",
	       opened && opened->qp_num == tgt->qp_num ? "yes" : "no");
	oa.qp_num = tgt->qp_num + 1000;
	struct ibv_qp *nobody = ibv_open_qp(ctx, &oa);
	printf("open_qp of no target: %s\n", nobody ? "opened" : "refused");
	int rc = ibv_close_xrcd(xrcd);
	printf("close_xrcd while in use: %s\n", rc ? "refused" : "closed");

	struct ibv_qp_init_attr_ex ia = { 0 };
	ia.qp_type = IBV_QPT_XRC_SEND;
	ia.send_cq = scq;
	ia.cap.max_send_wr = 4 * N;
	ia.cap.max_send_sge = 1;
	ia.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
	ia.pd = pd;
	ia.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE;
	struct ibv_qp *snd = ibv_create_qp_ex(ctx, &ia);
	if (!snd)
		fail("create xrc_send");
	to_rts(snd, tgt, port.lid);
	printf("connected\n");

	for (int i = 0; i < 2 * N; i++) {
		struct ibv_sge s = { (uintptr_t)(buf + 2 * N * SZ + i * SZ / 2), SZ / 2, mr->lkey };
		struct ibv_recv_wr r = { .wr_id = 100 + i, .sg_list = &s, .num_sge = 1 }, *br;
		if (ibv_post_srq_recv(srq, &r, &br))
			fail("post_srq_recv");
	}
	/* A chain of N SENDs of i+1 bytes, one ibv_post_send, the last signaled. */
	struct ibv_send_wr w[N], *bw;
	struct ibv_sge g[N];
	for (int i = 0; i < N; i++) {
		memset(buf + i * SZ, 'a' + i, SZ);
		g[i] = (struct ibv_sge){ (uintptr_t)(buf + i * SZ), i + 1, mr->lkey };
		memset(&w[i], 0, sizeof w[i]);
		w[i].wr_id = i;
		w[i].next = i + 1 < N ? &w[i + 1] : NULL;
		w[i].sg_list = &g[i];
		w[i].num_sge = 1;
		w[i].opcode = IBV_WR_SEND;
		w[i].send_flags = i + 1 == N ? IBV_SEND_SIGNALED : 0;
		w[i].qp_type.xrc.remote_srqn = srqn;
	}
	if (ibv_post_send(snd, w, &bw))
		fail("post_send chain");
	struct ibv_wc wc = wait_one(scq);
	if (wc.status || wc.wr_id != N - 1)
		fail("send completion");
	int good = 0;
	for (int i = 0; i < N; i++) {
		wc = wait_one(rcq);
		char *d = buf + 2 * N * SZ + (wc.wr_id - 100) * SZ / 2;
		if (wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RECV && wc.byte_len == (unsigned)i + 1 &&
		    wc.qp_num == tgt->qp_num && d[0] == 'a' + i && d[i] == 'a' + i)
			good++;
	}
	printf("post_send chain: %d of %d received through the SRQ on the target, bytes right\n", good, N);

	/* The ibv_wr_* path: two SENDs and an RDMA WRITE, each with ibv_wr_set_xrc_srqn. */
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(snd);
	ibv_wr_start(x);
	for (int i = 0; i < 2; i++) {
		x->wr_id = 50 + i;
		x->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(x);
		ibv_wr_set_xrc_srqn(x, srqn);
		ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + i * SZ), 16);
	}
	x->wr_id = 52;
	memset(buf + 3 * N * SZ, 0, SZ);
	ibv_wr_rdma_write(x, mr->rkey, (uintptr_t)(buf + 3 * N * SZ));
	ibv_wr_set_xrc_srqn(x, srqn);
	ibv_wr_set_sge(x, mr->lkey, (uintptr_t)(buf + 5 * SZ), SZ);
	if ((rc = ibv_wr_complete(x)))
		fail("wr_complete");
	good = 0;
	for (int i = 0; i < 3; i++) {
		wc = wait_one(scq);
		good += wc.status == IBV_WC_SUCCESS && wc.wr_id == 50 + (unsigned)i;
	}
	for (int i = 0; i < 2; i++) {
		wc = wait_one(rcq);
		good += wc.status == IBV_WC_SUCCESS && wc.byte_len == 16 && wc.qp_num == tgt->qp_num;
	}
	good += buf[3 * N * SZ] == 'f' && buf[3 * N * SZ + SZ - 1] == 'f';
	printf("ibv_wr_* with set_xrc_srqn: %d of 6 right\n", good);

	/* A SEND naming an SRQ that does not exist. */
	struct ibv_send_wr one = w[0];
	one.next = NULL;
	one.wr_id = 77;
	one.send_flags = IBV_SEND_SIGNALED;
	one.qp_type.xrc.remote_srqn = srqn ^ 0x800;
	if (ibv_post_send(snd, &one, &bw))
		fail("post_send bad srqn");
	wc = wait_one(scq);
	printf("SEND to SRQ number not in the domain: wr_id %llu status %s\n",
	       (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));

	/* Acknowledge the async events the error raised (libibverbs' destroy waits for them). */
	int fl = fcntl(ctx->async_fd, F_GETFL);
	fcntl(ctx->async_fd, F_SETFL, fl | O_NONBLOCK);
	printf("async events after it:");
	int nev = 0;
	for (int tries = 0; tries < 50; tries++) {
		struct ibv_async_event ev;
		if (ibv_get_async_event(ctx, &ev)) {
			usleep(20000);
			continue;
		}
		printf(" %s on %s", ibv_event_type_str(ev.event_type),
		       ev.element.qp == snd ? "the initiator" : ev.element.qp == tgt ? "the target" : "another object");
		ibv_ack_async_event(&ev);
		nev++;
	}
	printf("%s\n", nev ? "" : " none");

	struct ibv_qp_init_attr rca = { 0 };
	if (skip_rc)
		goto teardown;
	rca.send_cq = scq;
	rca.recv_cq = rcq;
	rca.srq = srq;
	rca.qp_type = IBV_QPT_RC;
	rca.cap.max_send_wr = 1;
	rca.cap.max_send_sge = 1;
	struct ibv_qp *rcqp = ibv_create_qp(pd, &rca);
	printf("RC QP on the XRC SRQ: %s\n", rcqp ? "created" : "refused");
	if (rcqp)
		ibv_destroy_qp(rcqp);
teardown:

	if (ibv_destroy_qp(snd) || (opened && ibv_destroy_qp(opened)) || ibv_destroy_qp(tgt))
		fail("destroy qps");
	if (ibv_destroy_srq(srq))
		fail("destroy srq");
	rc = ibv_close_xrcd(xrcd);
	printf("close_xrcd after its SRQ and QPs: %s\n", rc ? "refused" : "closed");
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	close(fd);
	printf("done\n");
	return 0;
}
