/*
 * wqe-compare XRC/DC harness: posts a corpus of send work requests on an XRC initiator
 * (ibv_post_send with wr.qp_type.xrc.remote_srqn, or the ibv_wr_* API with
 * ibv_wr_set_xrc_srqn) and on a DC initiator with 4 streams (ibv_wr_* with
 * mlx5dv_wr_set_dc_addr_stream, the DC WRs of the whole run on streams 0, 1, 2, 3, 0, ...), with
 * Debian's unmodified libmlx5, on the first RDMA device (under the preload: the emulated
 * ConnectX, which records every WQE it fetches in MLX5_EMU_WQE_LOG). The Rust side
 * (src/xrc_dc.rs) posts the same corpus through the mlx5 crate's XrcSendQp and Dci.
 *
 * Usage: wqe-harness-xrc-dc <corpus-file> [post|wr]   (format: src/xrc_dc.rs, `Corpus::text`)
 *
 * Objects, in this order on both sides: PD, MR (the whole buffer at the corpus's address,
 * every access right), send CQ (256), receive CQ (1024), XRC domain (no file), XRC SRQ (on
 * the receive CQ), XRC initiator, XRC target, SRQ, DCT (on the SRQ, key from the corpus),
 * DCI, AH (to the own port). The initiator is connected to the target in loopback; receives
 * are posted to both SRQs. After each post the harness waits for the post's signaled
 * completions (the corpus signals the last WR of every post). On success it prints
 * "info key=value ...".
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sched.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_SGE 4
#define MAX_WRS 4096

enum { OP_SEND, OP_SEND_IMM, OP_WRITE, OP_WRITE_IMM, OP_READ, OP_CAS, OP_FAA };

struct wrspec {
	char qp; /* 'x' (XRC initiator) or 'd' (DCI) */
	unsigned op, flags, inl, nsge;
	uint32_t imm;
	uint64_t roff, compare, swap_add;
	uint64_t off[MAX_SGE];
	uint32_t len[MAX_SGE];
};

static uint64_t buf_va, buf_len, recv_off, dc_key;
/* The stream of the next DC WR (the DCI has 2^DC_LOG_STREAMS streams). */
#define DC_LOG_STREAMS 2
static uint16_t dc_stream;
static unsigned cap_wr, cap_sge, cap_inline, recvs;
static struct wrspec wrs[MAX_WRS];
static unsigned post_start[MAX_WRS + 1], nposts, nwrs;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("wqe-harness-xrc-dc: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

static double now_s(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Same formula as corpus::src_byte in the Rust crate. */
static uint8_t src_byte(uint64_t i)
{
	return (uint8_t)((i * 131) ^ (i >> 8));
}

static void read_corpus(const char *path)
{
	FILE *f = fopen(path, "r");
	char line[1024];

	if (!f)
		die("cannot open %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "buf ", 4)) {
			if (sscanf(line, "buf %" SCNi64 " %" SCNi64 " %" SCNi64, &buf_va, &buf_len,
				   &recv_off) != 3)
				die("bad line: %s", line);
		} else if (!strncmp(line, "caps ", 5)) {
			if (sscanf(line, "caps %u %u %u %u", &cap_wr, &cap_sge, &cap_inline, &recvs) !=
			    4)
				die("bad line: %s", line);
		} else if (!strncmp(line, "key ", 4)) {
			if (sscanf(line, "key %" SCNi64, &dc_key) != 1)
				die("bad line: %s", line);
		} else if (!strncmp(line, "post", 4)) {
			if (nposts >= MAX_WRS)
				die("too many posts");
			post_start[nposts++] = nwrs;
		} else if (!strncmp(line, "wr ", 3)) {
			struct wrspec *w;
			char *p = line + 5, *end;
			unsigned i;

			if (nwrs >= MAX_WRS || !nposts)
				die("bad line: %s", line);
			w = &wrs[nwrs++];
			memset(w, 0, sizeof(*w));
			w->qp = line[3];
			w->op = strtoul(p, &p, 0);
			w->flags = strtoul(p, &p, 0);
			w->imm = strtoul(p, &p, 0);
			w->roff = strtoull(p, &p, 0);
			w->compare = strtoull(p, &p, 0);
			w->swap_add = strtoull(p, &p, 0);
			w->inl = strtoul(p, &p, 0);
			w->nsge = strtoul(p, &p, 0);
			if (w->nsge > MAX_SGE)
				die("too many SGEs: %s", line);
			for (i = 0; i < w->nsge; i++) {
				w->off[i] = strtoull(p, &end, 0);
				if (*end != ':')
					die("bad SGE in: %s", line);
				w->len[i] = strtoul(end + 1, &p, 0);
			}
		}
	}
	fclose(f);
	post_start[nposts] = nwrs;
	if (!buf_len || !cap_wr)
		die("corpus without buf/caps lines");
}

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask, const char *what)
{
	int rc = ibv_modify_qp(qp, a, mask);

	if (rc)
		die("modify QP %#x to %s: %s", qp->qp_num, what, strerror(rc));
}

static void drain(struct ibv_cq *cq)
{
	struct ibv_wc wc[16];
	int n, i;

	while ((n = ibv_poll_cq(cq, 16, wc)) > 0)
		for (i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				die("receive completion %s", ibv_wc_status_str(wc[i].status));
}

static unsigned send_flags(const struct wrspec *w)
{
	return ((w->flags & 1) ? IBV_SEND_SIGNALED : 0) | ((w->flags & 2) ? IBV_SEND_FENCE : 0) |
	       ((w->flags & 4) ? IBV_SEND_SOLICITED : 0) | (w->inl ? IBV_SEND_INLINE : 0);
}

static void fill_sges(const struct wrspec *w, struct ibv_sge *sg, uint32_t lkey)
{
	unsigned i;

	for (i = 0; i < w->nsge; i++)
		sg[i] = (struct ibv_sge){ buf_va + w->off[i], w->len[i], lkey };
}

/* One WR through ibv_wr_*: the operation, its address (XRC SRQ or DC target), payload. */
static void wr_one(struct ibv_qp_ex *qx, struct mlx5dv_qp_ex *mx, const struct wrspec *w,
		   struct ibv_ah *ah, uint32_t dctn, uint32_t srqn, uint32_t lkey, uint32_t rkey)
{
	struct ibv_sge sg[MAX_SGE];
	struct ibv_data_buf db[MAX_SGE];
	uint64_t raddr = buf_va + w->roff;
	unsigned i;

	qx->wr_id = nwrs;
	qx->wr_flags = send_flags(w) & ~IBV_SEND_INLINE;
	switch (w->op) {
	case OP_SEND:
		ibv_wr_send(qx);
		break;
	case OP_SEND_IMM:
		ibv_wr_send_imm(qx, htobe32(w->imm));
		break;
	case OP_WRITE:
		ibv_wr_rdma_write(qx, rkey, raddr);
		break;
	case OP_WRITE_IMM:
		ibv_wr_rdma_write_imm(qx, rkey, raddr, htobe32(w->imm));
		break;
	case OP_READ:
		ibv_wr_rdma_read(qx, rkey, raddr);
		break;
	case OP_CAS:
		ibv_wr_atomic_cmp_swp(qx, rkey, raddr, w->compare, w->swap_add);
		break;
	case OP_FAA:
		ibv_wr_atomic_fetch_add(qx, rkey, raddr, w->swap_add);
		break;
	default:
		die("unknown op %u", w->op);
	}
	if (w->qp == 'd') {
		mlx5dv_wr_set_dc_addr_stream(mx, ah, dctn, dc_key, dc_stream);
		dc_stream = (dc_stream + 1) & ((1u << DC_LOG_STREAMS) - 1);
	} else
		ibv_wr_set_xrc_srqn(qx, srqn);
	fill_sges(w, sg, lkey);
	if (w->inl) {
		for (i = 0; i < w->nsge; i++)
			db[i] = (struct ibv_data_buf){ (void *)(uintptr_t)sg[i].addr, sg[i].length };
		ibv_wr_set_inline_data_list(qx, w->nsge, db);
	} else {
		ibv_wr_set_sge_list(qx, w->nsge, sg);
	}
}

static const uint64_t send_ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
				 IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
				 IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
				 IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *scq, *rcq;
	struct ibv_xrcd *xrcd;
	struct ibv_srq *xsrq, *srq;
	struct ibv_qp *ini, *tgt, *dct, *dci;
	struct ibv_qp_ex *inix, *dcix;
	struct mlx5dv_qp_ex *dcimx;
	struct ibv_ah *ah;
	struct ibv_port_attr port;
	struct ibv_qp_attr a;
	uint32_t srqn;
	unsigned p, i;
	int wr_api;
	char *buf;

	if (argc < 2)
		die("usage: %s <corpus-file> [post|wr]", argv[0]);
	wr_api = argc > 2 && !strcmp(argv[2], "wr");
	read_corpus(argv[1]);
	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no RDMA device");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device failed");
	if (ibv_query_port(ctx, 1, &port))
		die("ibv_query_port failed");
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd failed");
	buf = mmap((void *)(uintptr_t)buf_va, buf_len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (buf == MAP_FAILED || (uint64_t)(uintptr_t)buf != buf_va)
		die("cannot map the buffer at %#" PRIx64, buf_va);
	for (i = 0; i < recv_off; i++)
		buf[i] = src_byte(i);
	mr = ibv_reg_mr(pd, buf, buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		die("ibv_reg_mr failed");
	scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
	if (!scq || !rcq)
		die("ibv_create_cq failed");

	struct ibv_xrcd_init_attr xa = { .comp_mask = IBV_XRCD_INIT_ATTR_FD |
						      IBV_XRCD_INIT_ATTR_OFLAGS,
					 .fd = -1,
					 .oflags = 0 };
	xrcd = ibv_open_xrcd(ctx, &xa);
	if (!xrcd)
		die("ibv_open_xrcd: %s", strerror(errno));
	struct ibv_srq_init_attr_ex sa = {
		.attr = { .max_wr = recvs, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ | IBV_SRQ_INIT_ATTR_PD,
		.srq_type = IBV_SRQT_XRC,
		.pd = pd,
		.xrcd = xrcd,
		.cq = rcq,
	};
	xsrq = ibv_create_srq_ex(ctx, &sa);
	if (!xsrq)
		die("ibv_create_srq_ex (XRC): %s", strerror(errno));
	if (ibv_get_srq_num(xsrq, &srqn))
		die("ibv_get_srq_num failed");

	struct ibv_qp_init_attr_ex ia = {
		.send_cq = scq,
		.recv_cq = scq,
		.cap = { .max_send_wr = cap_wr, .max_send_sge = cap_sge,
			 .max_inline_data = cap_inline },
		.qp_type = IBV_QPT_XRC_SEND,
		.comp_mask = IBV_QP_INIT_ATTR_PD | (wr_api ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.pd = pd,
		.send_ops_flags = wr_api ? send_ops : 0,
	};
	ini = ibv_create_qp_ex(ctx, &ia);
	if (!ini)
		die("ibv_create_qp_ex (XRC_SEND): %s", strerror(errno));
	struct ibv_qp_init_attr_ex ta = {
		.qp_type = IBV_QPT_XRC_RECV,
		.comp_mask = IBV_QP_INIT_ATTR_XRCD,
		.xrcd = xrcd,
	};
	tgt = ibv_create_qp_ex(ctx, &ta);
	if (!tgt)
		die("ibv_create_qp_ex (XRC_RECV): %s", strerror(errno));
	srq = ibv_create_srq(pd, &(struct ibv_srq_init_attr){ .attr = { .max_wr = recvs,
									    .max_sge = 1 } });
	if (!srq)
		die("ibv_create_srq failed");

	struct ibv_qp_init_attr_ex da = {
		.send_cq = rcq,
		.recv_cq = rcq,
		.srq = srq,
		.qp_type = IBV_QPT_DRIVER,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.pd = pd,
	};
	struct mlx5dv_qp_init_attr dva = {
		.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC,
		.dc_init_attr = { .dc_type = MLX5DV_DCTYPE_DCT, .dct_access_key = dc_key },
	};
	dct = mlx5dv_create_qp(ctx, &da, &dva);
	if (!dct)
		die("mlx5dv_create_qp (DCT): %s", strerror(errno));
	struct ibv_qp_init_attr_ex ca = {
		.send_cq = scq,
		.recv_cq = scq,
		.cap = { .max_send_wr = cap_wr, .max_send_sge = cap_sge,
			 .max_inline_data = cap_inline },
		.qp_type = IBV_QPT_DRIVER,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		.pd = pd,
		.send_ops_flags = send_ops,
	};
	struct mlx5dv_qp_init_attr cva = {
		.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC | MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS,
		.dc_init_attr = { .dc_type = MLX5DV_DCTYPE_DCI,
				  .dci_streams = { .log_num_concurent = DC_LOG_STREAMS } },
	};
	dci = mlx5dv_create_qp(ctx, &ca, &cva);
	if (!dci)
		die("mlx5dv_create_qp (DCI): %s", strerror(errno));
	ah = ibv_create_ah(pd, &(struct ibv_ah_attr){ .dlid = port.lid, .port_num = 1 });
	if (!ah)
		die("ibv_create_ah failed");

	/* The initiator and the target, in loopback. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = 0;
	modify(ini, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	modify(tgt, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.ah_attr.dlid = port.lid;
	a.ah_attr.port_num = 1;
	a.dest_qp_num = tgt->qp_num;
	modify(ini, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN,
	       "RTR");
	a.dest_qp_num = ini->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	modify(tgt, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
	       "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	modify(tgt, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_SQ_PSN, "RTS");
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	modify(ini, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");
	/* The DCT to RTR, the DCI to RTS. */
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
			    IBV_ACCESS_REMOTE_ATOMIC;
	modify(dct, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
	       "INIT");
	a.qp_access_flags = 0;
	modify(dci, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.min_rnr_timer = 12;
	a.ah_attr.port_num = 1;
	modify(dct, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_MIN_RNR_TIMER, "RTR");
	modify(dci, &a, IBV_QP_STATE | IBV_QP_PATH_MTU, "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	modify(dci, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
				IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
	       "RTS");

	for (i = 0; i < recvs; i++) {
		struct ibv_sge sg = { buf_va + recv_off, 1024, mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = i, .sg_list = &sg, .num_sge = 1 }, *bad;

		if (ibv_post_srq_recv(xsrq, &rw, &bad) || ibv_post_srq_recv(srq, &rw, &bad))
			die("ibv_post_srq_recv failed");
	}

	inix = wr_api ? ibv_qp_to_qp_ex(ini) : NULL;
	dcix = ibv_qp_to_qp_ex(dci);
	dcimx = mlx5dv_qp_ex_from_ibv_qp_ex(dcix);
	if (!dcix || !dcimx || (wr_api && !inix))
		die("no extended QP");
	for (p = 0; p < nposts; p++) {
		unsigned first = post_start[p], end = post_start[p + 1], want = 0;
		double t0;

		if (first == end)
			continue;
		for (i = first; i < end; i++)
			want += wrs[i].flags & 1;
		if (wrs[first].qp == 'd' || wr_api) {
			struct ibv_qp_ex *qx = wrs[first].qp == 'd' ? dcix : inix;

			ibv_wr_start(qx);
			for (i = first; i < end; i++)
				wr_one(qx, dcimx, &wrs[i], ah, dct->qp_num, srqn, mr->lkey,
				       mr->rkey);
			if (ibv_wr_complete(qx))
				die("post %u: ibv_wr_complete failed", p);
		} else {
			struct ibv_send_wr sw[64], *bad;
			struct ibv_sge sg[64][MAX_SGE];

			if (end - first > 64)
				die("chain too long");
			for (i = first; i < end; i++) {
				const struct wrspec *w = &wrs[i];
				struct ibv_send_wr *s = &sw[i - first];
				static const enum ibv_wr_opcode ops[] = {
					IBV_WR_SEND, IBV_WR_SEND_WITH_IMM, IBV_WR_RDMA_WRITE,
					IBV_WR_RDMA_WRITE_WITH_IMM, IBV_WR_RDMA_READ,
					IBV_WR_ATOMIC_CMP_AND_SWP, IBV_WR_ATOMIC_FETCH_AND_ADD
				};

				memset(s, 0, sizeof(*s));
				fill_sges(w, sg[i - first], mr->lkey);
				s->wr_id = i;
				s->sg_list = sg[i - first];
				s->num_sge = w->nsge;
				s->opcode = ops[w->op];
				s->send_flags = send_flags(w);
				s->imm_data = htobe32(w->imm);
				s->qp_type.xrc.remote_srqn = srqn;
				if (w->op == OP_CAS || w->op == OP_FAA) {
					s->wr.atomic.remote_addr = buf_va + w->roff;
					s->wr.atomic.rkey = mr->rkey;
					s->wr.atomic.compare_add =
						w->op == OP_CAS ? w->compare : w->swap_add;
					s->wr.atomic.swap = w->swap_add;
				} else {
					s->wr.rdma.remote_addr = buf_va + w->roff;
					s->wr.rdma.rkey = mr->rkey;
				}
				s->next = i + 1 < end ? &sw[i - first + 1] : NULL;
			}
			if (ibv_post_send(ini, sw, &bad))
				die("post %u: ibv_post_send failed", p);
		}
		t0 = now_s();
		while (want > 0) {
			struct ibv_wc wc[16];
			int got = ibv_poll_cq(scq, 16, wc), j;

			if (got < 0)
				die("ibv_poll_cq failed");
			for (j = 0; j < got; j++)
				if (wc[j].status != IBV_WC_SUCCESS)
					die("post %u: send completion %s (vendor_err %#x)", p,
					    ibv_wc_status_str(wc[j].status), wc[j].vendor_err);
			want = (unsigned)got >= want ? 0 : want - got;
			drain(rcq);
			if (!got) {
				if (now_s() - t0 > 10.0)
					die("post %u: no send completion in 10 s", p);
				sched_yield();
			}
		}
		drain(rcq);
	}
	printf("info ini=%#x dci=%#x srqn=%#x dctn=%#x lkey=%#x rkey=%#x\n", ini->qp_num,
	       dci->qp_num, srqn, dct->qp_num, mr->lkey, mr->rkey);
	return 0;
}
