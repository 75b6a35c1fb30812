/*
 * wqe-compare harness: posts a corpus of send work requests with plain libibverbs
 * (ibv_post_send -> Debian's unmodified libmlx5) on the first RDMA device, which under
 * LD_PRELOAD=libmlx5_emu_preload.so is the emulated ConnectX. The emulator records every WQE
 * it fetches (MLX5_EMU_WQE_LOG); the Rust test compares them with the mlx5 crate's WQEs.
 *
 * Usage: wqe-harness <corpus-file> [post|wr]    (format: tools/wqe-compare/src/corpus.rs)
 *   post (default): every chain is one ibv_post_send call;
 *   wr: every chain is one ibv_wr_start .. ibv_wr_complete sequence (the extended post API
 *       perftest uses), one ibv_wr_<op> + ibv_wr_set_ud_addr + ibv_wr_set_sge_list /
 *       ibv_wr_set_inline_data_list per WR.
 *
 * Objects are created in this order (the Rust side uses the same order, so the emulator
 * gives both the same numbers): PD, MR (the whole buffer, every access right), send CQ (256),
 * receive CQ (1024), RC requester, RC responder, UD requester, UD responder, UC requester,
 * UC responder, AH.
 *
 * After each ibv_post_send the harness waits until the device has consumed the doorbell
 * (both BlueFlame halves of the QP's register read back as zero: the emulator clears a
 * doorbell word when it takes it), so every doorbell is seen on its own, as in the stepped
 * Rust run. Then it waits for the post's completions (its signaled WRs, or all of them when
 * the corpus says "sigall 1": the requester QPs are then created with sq_sig_all). Any
 * failure: message on stderr, exit status 1. On success it prints "info key=value ..." for
 * the comparison. libmlx5 knobs (MLX5_SCATTER_TO_CQE, MLX5_POST_SEND_PREFER_BF,
 * MLX5_SHUT_UP_BF) and the emulator's (MLX5_EMU_*) come from the environment the Rust test
 * sets (src/harness.rs).
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
#include <sys/mman.h>
#include <time.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_SGE 8
enum { QP_RC = 0, QP_UD = 1, QP_UC = 2, NQP = 3 };
static const char *const qp_names[NQP] = { "rc", "ud", "uc" };

struct wrspec {
	int qp;
	unsigned opcode, flags;
	uint32_t imm;
	uint64_t remote_off, compare, swap_add;
	unsigned nsge;
	uint64_t off[MAX_SGE];
	uint32_t len[MAX_SGE];
};

struct caps {
	unsigned max_send_wr, max_send_sge, max_inline, max_recv_wr;
};

struct corpus {
	uint64_t buf_va, buf_len, src_off, src_len;
	struct caps caps[NQP];
	unsigned recv_count[NQP];
	uint64_t recv_off[NQP];
	uint32_t recv_len[NQP];
	uint32_t qkey;
	int sig_all;
	/* RoCE port: the GRH of the UD AH (and the RC/UC paths) to the own GID at sgid_index. */
	int roce;
	unsigned sgid_index, flow_label, sl, tclass, hop_limit;
	/* posts: post_start[i] .. post_start[i+1] index into wrs */
	struct wrspec *wrs;
	unsigned nwrs, wrs_cap;
	unsigned *post_start;
	unsigned nposts, posts_cap;
};

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("wqe-harness: ", stderr);
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

static int qp_index(const char *s)
{
	int q;

	for (q = 0; q < NQP; q++)
		if (!strcmp(s, qp_names[q]))
			return q;
	die("unknown QP selector '%s'", s);
	return -1;
}

static void read_corpus(const char *path, struct corpus *c)
{
	FILE *f = fopen(path, "r");
	char line[4096], sel[8];
	int ended = 0;

	if (!f)
		die("cannot open %s: %s", path, strerror(errno));
	memset(c, 0, sizeof(*c));
	while (fgets(line, sizeof(line), f)) {
		unsigned a, b, d, e, n;
		uint64_t x, y;

		if (!strncmp(line, "buf ", 4)) {
			if (sscanf(line, "buf %" SCNi64 " %" SCNi64, &x, &y) != 2)
				die("bad line: %s", line);
			c->buf_va = x;
			c->buf_len = y;
		} else if (!strncmp(line, "src ", 4)) {
			if (sscanf(line, "src %" SCNi64 " %" SCNi64, &x, &y) != 2)
				die("bad line: %s", line);
			c->src_off = x;
			c->src_len = y;
		} else if (!strncmp(line, "caps ", 5)) {
			if (sscanf(line, "caps %7s %u %u %u %u", sel, &a, &b, &d, &e) != 5)
				die("bad line: %s", line);
			c->caps[qp_index(sel)] = (struct caps){ a, b, d, e };
		} else if (!strncmp(line, "recv ", 5)) {
			if (sscanf(line, "recv %7s %u %" SCNi64 " %i", sel, &n, &x, (int *)&a) != 4)
				die("bad line: %s", line);
			c->recv_count[qp_index(sel)] = n;
			c->recv_off[qp_index(sel)] = x;
			c->recv_len[qp_index(sel)] = a;
		} else if (!strncmp(line, "qkey ", 5)) {
			if (sscanf(line, "qkey %i", (int *)&a) != 1)
				die("bad line: %s", line);
			c->qkey = a;
		} else if (!strncmp(line, "sigall ", 7)) {
			if (sscanf(line, "sigall %d", &c->sig_all) != 1)
				die("bad line: %s", line);
		} else if (!strncmp(line, "roce ", 5)) {
			if (sscanf(line, "roce %u %i %u %i %u", &c->sgid_index, (int *)&c->flow_label,
				   &c->sl, (int *)&c->tclass, &c->hop_limit) != 5)
				die("bad line: %s", line);
			c->roce = 1;
		} else if (!strncmp(line, "post ", 5)) {
			if (c->nposts + 1 >= c->posts_cap) {
				c->posts_cap = c->posts_cap ? 2 * c->posts_cap : 256;
				c->post_start = realloc(c->post_start, c->posts_cap * sizeof(unsigned));
				if (!c->post_start)
					die("out of memory");
			}
			c->post_start[c->nposts++] = c->nwrs;
		} else if (!strncmp(line, "wr ", 3)) {
			struct wrspec w;
			char *p = line + 3, *end;
			unsigned i;

			memset(&w, 0, sizeof(w));
			if (sscanf(p, "%7s", sel) != 1 || !c->nposts)
				die("bad line: %s", line);
			w.qp = qp_index(sel);
			p += strlen(sel) + 1;
			w.opcode = strtoul(p, &p, 0);
			w.flags = strtoul(p, &p, 0);
			w.imm = strtoul(p, &p, 0);
			w.remote_off = strtoull(p, &p, 0);
			w.compare = strtoull(p, &p, 0);
			w.swap_add = strtoull(p, &p, 0);
			w.nsge = strtoul(p, &p, 0);
			if (w.nsge > MAX_SGE)
				die("too many SGEs: %s", line);
			for (i = 0; i < w.nsge; i++) {
				w.off[i] = strtoull(p, &end, 0);
				if (*end != ':')
					die("bad SGE in: %s", line);
				w.len[i] = strtoul(end + 1, &p, 0);
			}
			if (c->nwrs == c->wrs_cap) {
				c->wrs_cap = c->wrs_cap ? 2 * c->wrs_cap : 512;
				c->wrs = realloc(c->wrs, c->wrs_cap * sizeof(*c->wrs));
				if (!c->wrs)
					die("out of memory");
			}
			c->wrs[c->nwrs++] = w;
		} else if (!strncmp(line, "end", 3)) {
			ended = 1;
			break;
		} else if (line[0] != '\n' && line[0] != '#') {
			die("unknown line: %s", line);
		}
	}
	fclose(f);
	if (!ended || !c->buf_va)
		die("corpus %s is incomplete", path);
	c->post_start[c->nposts] = c->nwrs;
}

struct side {
	struct ibv_qp *qp;
	struct mlx5dv_qp dv;
	struct ibv_qp_cap cap;
};

static void wait_doorbell_taken(const struct side *s)
{
	volatile uint64_t *h0 = (volatile uint64_t *)s->dv.bf.reg;
	volatile uint64_t *h1 = (volatile uint64_t *)((char *)s->dv.bf.reg + s->dv.bf.size);
	double t0 = now_s();

	while (*h0 != 0 || *h1 != 0) {
		if (now_s() - t0 > 10.0)
			die("the device did not consume a doorbell of QP %#x in 10 s", s->qp->qp_num);
		sched_yield();
	}
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

	do {
		n = ibv_poll_cq(cq, 16, wc);
		if (n < 0)
			die("ibv_poll_cq (recv) failed");
		for (i = 0; i < n; i++)
			if (wc[i].status != IBV_WC_SUCCESS)
				die("receive completion %s (vendor_err %#x)",
				    ibv_wc_status_str(wc[i].status), wc[i].vendor_err);
	} while (n == 16);
}

/* Post the chain `wrs` (built for ibv_post_send) through the extended API instead. */
static int post_wr_api(struct ibv_qp *qp, struct ibv_send_wr *wrs)
{
	struct ibv_qp_ex *x = ibv_qp_to_qp_ex(qp);
	struct ibv_send_wr *w;

	if (!x)
		die("ibv_qp_to_qp_ex failed");
	ibv_wr_start(x);
	for (w = wrs; w; w = w->next) {
		x->wr_id = w->wr_id;
		x->wr_flags = w->send_flags & ~IBV_SEND_INLINE;
		switch (w->opcode) {
		case IBV_WR_SEND:
			ibv_wr_send(x);
			break;
		case IBV_WR_SEND_WITH_IMM:
			ibv_wr_send_imm(x, w->imm_data);
			break;
		case IBV_WR_SEND_WITH_INV:
			ibv_wr_send_inv(x, w->invalidate_rkey);
			break;
		case IBV_WR_RDMA_WRITE:
			ibv_wr_rdma_write(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			ibv_wr_rdma_write_imm(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr, w->imm_data);
			break;
		case IBV_WR_RDMA_READ:
			ibv_wr_rdma_read(x, w->wr.rdma.rkey, w->wr.rdma.remote_addr);
			break;
		case IBV_WR_ATOMIC_CMP_AND_SWP:
			ibv_wr_atomic_cmp_swp(x, w->wr.atomic.rkey, w->wr.atomic.remote_addr,
					      w->wr.atomic.compare_add, w->wr.atomic.swap);
			break;
		case IBV_WR_ATOMIC_FETCH_AND_ADD:
			ibv_wr_atomic_fetch_add(x, w->wr.atomic.rkey, w->wr.atomic.remote_addr,
						w->wr.atomic.compare_add);
			break;
		default:
			die("opcode %d not in the corpus vocabulary", (int)w->opcode);
		}
		if (qp->qp_type == IBV_QPT_UD)
			ibv_wr_set_ud_addr(x, w->wr.ud.ah, w->wr.ud.remote_qpn, w->wr.ud.remote_qkey);
		if (w->send_flags & IBV_SEND_INLINE) {
			struct ibv_data_buf bufs[MAX_SGE];
			int i;

			for (i = 0; i < w->num_sge; i++) {
				bufs[i].addr = (void *)(uintptr_t)w->sg_list[i].addr;
				bufs[i].length = w->sg_list[i].length;
			}
			ibv_wr_set_inline_data_list(x, w->num_sge, bufs);
		} else {
			ibv_wr_set_sge_list(x, w->num_sge, w->sg_list);
		}
	}
	return ibv_wr_complete(x);
}

/* RoCE: a connected path to the own GID, as the mlx5 crate's to_rtr (hop limit 64). */
static void set_path_grh(struct ibv_ah_attr *ah, const struct corpus *c, const union ibv_gid *gid)
{
	if (!c->roce)
		return;
	ah->is_global = 1;
	ah->grh.dgid = *gid;
	ah->grh.sgid_index = c->sgid_index;
	ah->grh.hop_limit = 64;
}

int main(int argc, char **argv)
{
	struct corpus c;
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_port_attr port;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *scq, *rcq;
	struct ibv_ah *ah;
	union ibv_gid gid;
	struct side sd[NQP], peer[NQP];
	uint8_t *buf;
	unsigned p, i, k;
	uint64_t posted[NQP] = { 0, 0, 0 };
	int rd_atom, q, wr_api = 0;

	if (argc < 2 || argc > 3)
		die("usage: %s <corpus-file> [post|wr]", argv[0]);
	if (argc == 3) {
		if (!strcmp(argv[2], "wr"))
			wr_api = 1;
		else if (strcmp(argv[2], "post"))
			die("unknown mode '%s' (post or wr)", argv[2]);
	}
	read_corpus(argv[1], &c);
	buf = mmap((void *)(uintptr_t)c.buf_va, c.buf_len, PROT_READ | PROT_WRITE,
		   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (buf == MAP_FAILED || (uint64_t)(uintptr_t)buf != c.buf_va)
		die("cannot map the buffer at %#" PRIx64 ": %s", c.buf_va, strerror(errno));
	for (i = 0; i < c.src_len; i++)
		buf[c.src_off + i] = src_byte(c.src_off + i);

	list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		die("no RDMA device (is the preload loaded?)");
	ctx = ibv_open_device(list[0]);
	if (!ctx)
		die("ibv_open_device(%s) failed", ibv_get_device_name(list[0]));
	if (ibv_query_device(ctx, &dattr) || ibv_query_port(ctx, 1, &port))
		die("query device/port failed");
	if (c.roce != (port.link_layer == IBV_LINK_LAYER_ETHERNET))
		die("corpus is for %s, the port's link layer is %u", c.roce ? "RoCE" : "InfiniBand",
		    port.link_layer);
	memset(&gid, 0, sizeof(gid));
	if (c.roce && ibv_query_gid(ctx, 1, c.sgid_index, &gid))
		die("ibv_query_gid(%u) failed", c.sgid_index);
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd failed");
	mr = ibv_reg_mr(pd, buf, c.buf_len,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_ATOMIC);
	if (!mr)
		die("ibv_reg_mr failed: %s", strerror(errno));
	scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 1024, NULL, NULL, 0);
	if (!scq || !rcq)
		die("ibv_create_cq failed");

	for (k = 0; k < 2 * NQP; k++) {
		int qi = k / 2, ud = qi == QP_UD;
		struct caps *cp = &c.caps[qi];
		struct side *s = (k & 1) ? &peer[qi] : &sd[qi];
		struct ibv_qp_init_attr_ex a;
		struct mlx5dv_obj obj;

		memset(&a, 0, sizeof(a));
		a.qp_type = qi == QP_RC ? IBV_QPT_RC : qi == QP_UD ? IBV_QPT_UD : IBV_QPT_UC;
		a.send_cq = scq;
		a.recv_cq = rcq;
		a.cap.max_send_wr = cp->max_send_wr;
		a.cap.max_recv_wr = cp->max_recv_wr;
		a.cap.max_send_sge = cp->max_send_sge;
		a.cap.max_recv_sge = 1;
		a.cap.max_inline_data = cp->max_inline;
		a.comp_mask = IBV_QP_INIT_ATTR_PD;
		a.pd = pd;
		a.sq_sig_all = !(k & 1) && c.sig_all;
		if (ud) {
			/* For the ibv_wr_* API; a UD QP's overhead is ctrl + AV either way. */
			a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM;
		} else if (qi == QP_UC) {
			/* ctrl + raddr (32 B) instead of the 192 B default for UMR ops. */
			a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
					   IBV_QP_EX_WITH_RDMA_WRITE |
					   IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM;
		} else {
			/* Exactly the operations the corpus uses, so libmlx5 sizes WQEs for
			 * ctrl + raddr + atomic (48 B) instead of its 192 B default for UMR ops. */
			a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
			a.send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
					   IBV_QP_EX_WITH_SEND_WITH_INV | IBV_QP_EX_WITH_RDMA_WRITE |
					   IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
					   IBV_QP_EX_WITH_RDMA_READ |
					   IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
					   IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
		}
		s->qp = ibv_create_qp_ex(ctx, &a);
		if (!s->qp)
			die("ibv_create_qp_ex (%s) failed: %s", qp_names[qi], strerror(errno));
		s->cap = a.cap;
		obj.qp.in = s->qp;
		obj.qp.out = &s->dv;
		if (mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP))
			die("mlx5dv_init_obj failed");
	}
	{
		struct ibv_ah_attr aa;

		memset(&aa, 0, sizeof(aa));
		aa.dlid = port.lid;
		aa.port_num = 1;
		if (c.roce) {
			aa.is_global = 1;
			aa.grh.dgid = gid;
			aa.grh.sgid_index = c.sgid_index;
			aa.grh.flow_label = c.flow_label;
			aa.grh.traffic_class = c.tclass;
			aa.grh.hop_limit = c.hop_limit;
			aa.sl = c.sl;
		}
		ah = ibv_create_ah(pd, &aa);
		if (!ah)
			die("ibv_create_ah failed: %s", strerror(errno));
	}

	/* RC pair in loopback; same attributes as the mlx5 crate's to_init/to_rtr/to_rts. */
	rd_atom = dattr.max_qp_rd_atom < 16 ? dattr.max_qp_rd_atom : 16;
	for (k = 0; k < 2; k++) {
		struct ibv_qp *qp = k ? peer[QP_RC].qp : sd[QP_RC].qp;
		struct ibv_qp *remote = k ? sd[QP_RC].qp : peer[QP_RC].qp;
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
				    IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		       "INIT");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = remote->qp_num;
		a.rq_psn = 0;
		a.max_dest_rd_atomic = rd_atom > 0 ? rd_atom : 1;
		a.min_rnr_timer = 12;
		a.ah_attr.dlid = port.lid;
		a.ah_attr.port_num = 1;
		set_path_grh(&a.ah_attr, &c, &gid);
		modify(qp, &a,
		       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			       IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
		       "RTR");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		a.timeout = 14;
		a.retry_cnt = 7;
		a.rnr_retry = 7;
		a.max_rd_atomic = dattr.max_qp_init_rd_atom < 16 ? dattr.max_qp_init_rd_atom : 16;
		if (!a.max_rd_atomic)
			a.max_rd_atomic = 1;
		modify(qp, &a,
		       IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			       IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC,
		       "RTS");
	}
	for (k = 0; k < 2; k++) {
		struct ibv_qp *qp = k ? peer[QP_UD].qp : sd[QP_UD].qp;
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qkey = c.qkey;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY, "INIT");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		modify(qp, &a, IBV_QP_STATE, "RTR");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
	}
	/* UC pair in loopback; same attributes as the mlx5 crate's to_init/to_rtr/to_rts. */
	for (k = 0; k < 2; k++) {
		struct ibv_qp *qp = k ? peer[QP_UC].qp : sd[QP_UC].qp;
		struct ibv_qp *remote = k ? sd[QP_UC].qp : peer[QP_UC].qp;
		struct ibv_qp_attr a;

		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
		       "INIT");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTR;
		a.path_mtu = IBV_MTU_1024;
		a.dest_qp_num = remote->qp_num;
		a.rq_psn = 0;
		a.ah_attr.dlid = port.lid;
		a.ah_attr.port_num = 1;
		set_path_grh(&a.ah_attr, &c, &gid);
		modify(qp, &a,
		       IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN,
		       "RTR");
		memset(&a, 0, sizeof(a));
		a.qp_state = IBV_QPS_RTS;
		a.sq_psn = 0;
		modify(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN, "RTS");
	}
	/* Receives for every WR that consumes one. */
	for (q = 0; q < NQP; q++) {
		struct ibv_sge sge = { .addr = c.buf_va + c.recv_off[q],
				       .length = c.recv_len[q],
				       .lkey = mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 0, .sg_list = &sge, .num_sge = 1 }, *bad;

		for (i = 0; i < c.recv_count[q]; i++) {
			rw.wr_id = i;
			if (ibv_post_recv(peer[q].qp, &rw, &bad))
				die("ibv_post_recv failed");
		}
	}

	for (p = 0; p < c.nposts; p++) {
		unsigned first = c.post_start[p], n = c.post_start[p + 1] - first;
		struct ibv_send_wr wrs[8], *bad = NULL;
		struct ibv_sge sges[8][MAX_SGE];
		unsigned want = 0;
		int qi, rc;
		double t0;

		if (n == 0 || n > 8)
			die("post %u has %u WRs", p, n);
		qi = c.wrs[first].qp;
		memset(wrs, 0, sizeof(wrs));
		for (i = 0; i < n; i++) {
			const struct wrspec *w = &c.wrs[first + i];
			struct ibv_send_wr *x = &wrs[i];

			if (w->qp != qi)
				die("post %u mixes QPs", p);
			for (k = 0; k < w->nsge; k++) {
				sges[i][k].addr = c.buf_va + w->off[k];
				sges[i][k].length = w->len[k];
				sges[i][k].lkey = mr->lkey;
			}
			x->wr_id = (uint64_t)p * 8 + i;
			x->next = i + 1 < n ? &wrs[i + 1] : NULL;
			x->sg_list = sges[i];
			x->num_sge = w->nsge;
			x->opcode = (enum ibv_wr_opcode)w->opcode;
			x->send_flags = w->flags;
			if ((w->flags & IBV_SEND_SIGNALED) || c.sig_all)
				want++;
			switch (w->opcode) {
			case IBV_WR_SEND_WITH_IMM:
			case IBV_WR_RDMA_WRITE_WITH_IMM:
				x->imm_data = htobe32(w->imm);
				break;
			case IBV_WR_SEND_WITH_INV:
				x->invalidate_rkey = w->imm;
				break;
			default:
				break;
			}
			switch (w->opcode) {
			case IBV_WR_RDMA_WRITE:
			case IBV_WR_RDMA_WRITE_WITH_IMM:
			case IBV_WR_RDMA_READ:
				x->wr.rdma.remote_addr = c.buf_va + w->remote_off;
				x->wr.rdma.rkey = mr->rkey;
				break;
			case IBV_WR_ATOMIC_CMP_AND_SWP:
			case IBV_WR_ATOMIC_FETCH_AND_ADD:
				x->wr.atomic.remote_addr = c.buf_va + w->remote_off;
				x->wr.atomic.rkey = mr->rkey;
				/* verbs: compare_add is the compare (CS) or the add (FA) operand */
				x->wr.atomic.compare_add =
					w->opcode == IBV_WR_ATOMIC_CMP_AND_SWP ? w->compare : w->swap_add;
				x->wr.atomic.swap = w->swap_add;
				break;
			default:
				break;
			}
			if (qi == QP_UD) {
				x->wr.ud.ah = ah;
				x->wr.ud.remote_qpn = peer[QP_UD].qp->qp_num;
				x->wr.ud.remote_qkey = c.qkey;
			}
		}
		if (wr_api) {
			rc = post_wr_api(sd[qi].qp, wrs);
			if (rc)
				die("post %u: ibv_wr_complete: %s", p, strerror(rc));
		} else {
			rc = ibv_post_send(sd[qi].qp, wrs, &bad);
			if (rc)
				die("post %u: ibv_post_send: %s (bad WR %ld)", p, strerror(rc),
				    bad ? (long)(bad - wrs) : -1L);
		}
		posted[qi] += n;
		wait_doorbell_taken(&sd[qi]);
		t0 = now_s();
		while (want > 0) {
			struct ibv_wc wc[16];
			int got = ibv_poll_cq(scq, 16, wc), j;

			if (got < 0)
				die("ibv_poll_cq failed");
			for (j = 0; j < got; j++)
				if (wc[j].status != IBV_WC_SUCCESS)
					die("post %u: send completion %s (vendor_err %#x, wr_id %" PRIu64
					    ")",
					    p, ibv_wc_status_str(wc[j].status), wc[j].vendor_err,
					    wc[j].wr_id);
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

	printf("info lkey=%#x rkey=%#x\n", mr->lkey, mr->rkey);
	for (q = 0; q < NQP; q++)
		printf("info %s_qpn=%#x %s_peer_qpn=%#x %s_max_send_wr=%u %s_max_inline=%u "
		       "%s_sq_wqe_cnt=%u %s_posted=%" PRIu64 "\n",
		       qp_names[q], sd[q].qp->qp_num, qp_names[q], peer[q].qp->qp_num, qp_names[q],
		       sd[q].cap.max_send_wr, qp_names[q], sd[q].cap.max_inline_data, qp_names[q],
		       sd[q].dv.sq.wqe_cnt, qp_names[q], posted[q]);
	fflush(stdout);

	ibv_destroy_ah(ah);
	for (q = 0; q < NQP; q++) {
		ibv_destroy_qp(sd[q].qp);
		ibv_destroy_qp(peer[q].qp);
	}
	ibv_destroy_cq(scq);
	ibv_destroy_cq(rcq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	munmap(buf, c.buf_len);
	return 0;
}
