/*
 * wqe-compare RAW_PACKET harness: posts a corpus of frames on a raw Ethernet QP with Debian's
 * unmodified libmlx5 (ibv_post_send, or the ibv_wr_* API: ibv_wr_send with
 * ibv_wr_set_sge_list / ibv_wr_set_inline_data_list), on the first RDMA device (under the
 * preload: the emulated ConnectX on an Ethernet port, which records every WQE it fetches in
 * MLX5_EMU_WQE_LOG). The Rust side (src/raw.rs) sends the same frames through the mlx5
 * crate's RawQp.
 *
 * Usage: wqe-harness-raw <corpus-file> [post|wr]   (format: src/raw.rs, `Corpus::text`)
 *
 * Objects, in this order on both sides: PD, MR (the whole buffer at the corpus's address,
 * local write), send CQ (256), receive CQ (256), the raw QP (no receive queue). Each frame is
 * the concatenation of its SGEs' bytes; libmlx5 copies the device's minimum inline header
 * bytes (eth_min_inline: 0 or 18) out of them into the Ethernet segment itself. After each
 * post the harness waits for the post's signaled completions (the corpus signals the last WR
 * of every post). On success it prints "info key=value ...".
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

#include <infiniband/verbs.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

#define MAX_SGE 4
#define MAX_WRS 4096

/* Corpus flag bits (src/raw.rs `flag`). VLAN only tells the Rust side how to send. */
enum { F_SIGNALED = 1, F_FENCE = 2, F_SOLICITED = 4, F_CSUM = 8 };

struct wrspec {
	unsigned flags, inl, nsge;
	uint64_t off[MAX_SGE];
	uint32_t len[MAX_SGE];
};

static uint64_t buf_va, buf_len;
static unsigned cap_wr, cap_sge, cap_inline;
static struct wrspec wrs[MAX_WRS];
static unsigned post_start[MAX_WRS + 1], nposts, nwrs;
static char *buf;

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("wqe-harness-raw: ", stderr);
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
	char line[4096];

	if (!f)
		die("cannot open %s: %s", path, strerror(errno));
	while (fgets(line, sizeof(line), f)) {
		if (!strncmp(line, "buf ", 4)) {
			if (sscanf(line, "buf %" SCNi64 " %" SCNi64, &buf_va, &buf_len) != 2)
				die("bad line: %s", line);
			buf = mmap((void *)(uintptr_t)buf_va, buf_len, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
			if (buf == MAP_FAILED || (uint64_t)(uintptr_t)buf != buf_va)
				die("cannot map the buffer at %#" PRIx64, buf_va);
			for (uint64_t i = 0; i < buf_len; i++)
				buf[i] = src_byte(i);
		} else if (!strncmp(line, "caps ", 5)) {
			if (sscanf(line, "caps %u %u %u", &cap_wr, &cap_sge, &cap_inline) != 3)
				die("bad line: %s", line);
		} else if (!strncmp(line, "bytes ", 6)) {
			/* bytes <offset> <hex>: frame headers written over the source bytes */
			char *p = line + 6, *end;
			uint64_t off = strtoull(p, &end, 0);

			if (!buf || end == p || *end != ' ')
				die("bad line: %s", line);
			p = end + 1;
			while (p[0] && p[1] && p[0] != '\n') {
				char h[3] = { p[0], p[1], 0 };

				if (off >= buf_len)
					die("bytes past the buffer: %s", line);
				buf[off++] = (char)strtoul(h, NULL, 16);
				p += 2;
			}
		} else if (!strncmp(line, "post", 4)) {
			if (nposts >= MAX_WRS)
				die("too many posts");
			post_start[nposts++] = nwrs;
		} else if (!strncmp(line, "wr ", 3)) {
			struct wrspec *w;
			char *p = line + 3, *end;
			unsigned i;

			if (nwrs >= MAX_WRS || !nposts)
				die("bad line: %s", line);
			w = &wrs[nwrs++];
			memset(w, 0, sizeof(*w));
			w->flags = strtoul(p, &p, 0);
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

static unsigned send_flags(const struct wrspec *w)
{
	return ((w->flags & F_SIGNALED) ? IBV_SEND_SIGNALED : 0) |
	       ((w->flags & F_FENCE) ? IBV_SEND_FENCE : 0) |
	       ((w->flags & F_SOLICITED) ? IBV_SEND_SOLICITED : 0) |
	       ((w->flags & F_CSUM) ? IBV_SEND_IP_CSUM : 0) | (w->inl ? IBV_SEND_INLINE : 0);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *scq, *rcq;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qx = NULL;
	struct ibv_qp_attr a;
	unsigned p, i;
	int wr_api;

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
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		die("ibv_alloc_pd failed");
	mr = ibv_reg_mr(pd, buf, buf_len, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		die("ibv_reg_mr failed");
	scq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	if (!scq || !rcq)
		die("ibv_create_cq failed");
	struct ibv_qp_init_attr_ex ia = {
		.send_cq = scq,
		.recv_cq = rcq,
		.cap = { .max_send_wr = cap_wr, .max_send_sge = cap_sge,
			 .max_inline_data = cap_inline },
		.qp_type = IBV_QPT_RAW_PACKET,
		.comp_mask = IBV_QP_INIT_ATTR_PD | (wr_api ? IBV_QP_INIT_ATTR_SEND_OPS_FLAGS : 0),
		.pd = pd,
		.send_ops_flags = wr_api ? IBV_QP_EX_WITH_SEND : 0,
	};
	qp = ibv_create_qp_ex(ctx, &ia);
	if (!qp)
		die("ibv_create_qp_ex (RAW_PACKET): %s", strerror(errno));
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PORT, "INIT");
	a.qp_state = IBV_QPS_RTR;
	modify(qp, &a, IBV_QP_STATE, "RTR");
	a.qp_state = IBV_QPS_RTS;
	modify(qp, &a, IBV_QP_STATE, "RTS");
	if (wr_api) {
		qx = ibv_qp_to_qp_ex(qp);
		if (!qx)
			die("no extended QP");
	}

	for (p = 0; p < nposts; p++) {
		unsigned first = post_start[p], end = post_start[p + 1], want = 0;
		double t0;

		if (first == end)
			continue;
		for (i = first; i < end; i++)
			want += wrs[i].flags & F_SIGNALED;
		if (wr_api) {
			ibv_wr_start(qx);
			for (i = first; i < end; i++) {
				const struct wrspec *w = &wrs[i];
				struct ibv_sge sg[MAX_SGE];
				struct ibv_data_buf db[MAX_SGE];
				unsigned k;

				qx->wr_id = i;
				qx->wr_flags = send_flags(w) & ~IBV_SEND_INLINE;
				ibv_wr_send(qx);
				for (k = 0; k < w->nsge; k++) {
					sg[k] = (struct ibv_sge){ buf_va + w->off[k], w->len[k],
								  mr->lkey };
					db[k] = (struct ibv_data_buf){ buf + w->off[k], w->len[k] };
				}
				if (w->inl)
					ibv_wr_set_inline_data_list(qx, w->nsge, db);
				else
					ibv_wr_set_sge_list(qx, w->nsge, sg);
			}
			if (ibv_wr_complete(qx))
				die("post %u: ibv_wr_complete failed", p);
		} else {
			struct ibv_send_wr sw[64], *bad;
			struct ibv_sge sg[64][MAX_SGE];
			int rc;

			if (end - first > 64)
				die("chain too long");
			for (i = first; i < end; i++) {
				const struct wrspec *w = &wrs[i];
				struct ibv_send_wr *s = &sw[i - first];
				unsigned k;

				memset(s, 0, sizeof(*s));
				for (k = 0; k < w->nsge; k++)
					sg[i - first][k] = (struct ibv_sge){ buf_va + w->off[k],
									     w->len[k], mr->lkey };
				s->wr_id = i;
				s->sg_list = sg[i - first];
				s->num_sge = w->nsge;
				s->opcode = IBV_WR_SEND;
				s->send_flags = send_flags(w);
				s->next = i + 1 < end ? &sw[i - first + 1] : NULL;
			}
			rc = ibv_post_send(qp, sw, &bad);
			if (rc)
				die("post %u: ibv_post_send: %s", p, strerror(rc));
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
			if (!got) {
				if (now_s() - t0 > 10.0)
					die("post %u: no send completion in 10 s", p);
				sched_yield();
			}
		}
	}
	printf("info qpn=%#x lkey=%#x max_send_wr=%#x max_inline=%#x\n", qp->qp_num, mr->lkey,
	       ia.cap.max_send_wr, ia.cap.max_inline_data);
	return 0;
}
