/* The port counters in sysfs as a program reads them: $SYSFS_PATH (where libibverbs reads
 * sysfs; the emulator's preload points it at its tree) class/infiniband/<dev>/ports/1/
 * counters/. N UD SENDs of S bytes from a QP to itself (the port transmits and receives each
 * packet); the program prints the counters' growth across the traffic, once the tree has
 * been refreshed; then 3 more with no receive posted (hw_counters/out_of_buffer).
 * Usage: port_counters N S. */
#define _GNU_SOURCE
#include <infiniband/verbs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *names[] = { "port_xmit_packets", "port_xmit_data", "port_rcv_packets",
			       "port_rcv_data", "port_rcv_errors", "port_xmit_discards" };
#define NC (sizeof names / sizeof names[0])

static void fail(const char *what)
{
	printf("FAIL %s\n", what);
	exit(1);
}

static unsigned long long read_one(const char *dev, const char *group, const char *name)
{
	const char *root = getenv("SYSFS_PATH");
	char p[512];
	unsigned long long v;
	snprintf(p, sizeof p, "%s/class/infiniband/%s/ports/1/%s/%s", root ? root : "/sys", dev, group, name);
	FILE *f = fopen(p, "r");
	if (!f || fscanf(f, "%llu", &v) != 1)
		fail(p);
	fclose(f);
	return v;
}

static void read_all(const char *dev, unsigned long long *v)
{
	const char *root = getenv("SYSFS_PATH");
	for (unsigned i = 0; i < NC; i++) {
		char p[512];
		snprintf(p, sizeof p, "%s/class/infiniband/%s/ports/1/counters/%s", root ? root : "/sys", dev,
			 names[i]);
		FILE *f = fopen(p, "r");
		if (!f || fscanf(f, "%llu", &v[i]) != 1)
			fail(p);
		fclose(f);
	}
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc != 3)
		fail("usage: port_counters N S");
	int n = atoi(argv[1]), sz = atoi(argv[2]);
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		fail("no device");
	const char *dev = ibv_get_device_name(list[0]);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_port_attr port;
	if (!ctx || ibv_query_port(ctx, 1, &port))
		fail("open");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	char *buf = calloc(1, 2 * (sz + 40));
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, 2 * (sz + 40), IBV_ACCESS_LOCAL_WRITE);
	struct ibv_cq *cq = ibv_create_cq(ctx, 2 * n + 2, NULL, NULL, 0);
	struct ibv_qp_init_attr ia = { .send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_UD,
				       .cap = { .max_send_wr = n, .max_recv_wr = n, .max_send_sge = 1, .max_recv_sge = 1 } };
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	if (!pd || !mr || !cq || !qp)
		fail("objects");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1, .qkey = 0x11111111 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_QKEY))
		fail("init");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		fail("rtr");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 0;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN))
		fail("rts");
	struct ibv_ah_attr aa = { .dlid = port.lid, .port_num = 1 };
	struct ibv_ah *ah = ibv_create_ah(pd, &aa);
	if (!ah)
		fail("ah");
	unsigned long long before[NC], after[NC];
	read_all(dev, before);
	for (int i = 0; i < n; i++) {
		struct ibv_sge rs = { (uintptr_t)(buf + sz), sz + 40, mr->lkey };
		struct ibv_recv_wr r = { .wr_id = i, .sg_list = &rs, .num_sge = 1 }, *br;
		if (ibv_post_recv(qp, &r, &br))
			fail("post_recv");
		struct ibv_sge s = { (uintptr_t)buf, sz, mr->lkey };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED }, *bw;
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = qp->qp_num;
		w.wr.ud.remote_qkey = 0x11111111;
		if (ibv_post_send(qp, &w, &bw))
			fail("post_send");
		for (int got = 0; got < 2;) {
			struct ibv_wc wc;
			int k = ibv_poll_cq(cq, 1, &wc);
			if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS))
				fail("completion");
			got += k;
		}
	}
	/* The tree is refreshed every 100 ms: wait until it shows the sends (at most 10 s on a
	 * loaded machine), then once more so that every file is of one refresh. */
	for (int tries = 0; tries < 100; tries++) {
		read_all(dev, after);
		if (after[0] - before[0] >= (unsigned long long)n && after[2] - before[2] >= (unsigned long long)n)
			break;
		usleep(100000);
	}
	usleep(300000);
	read_all(dev, after);
	for (unsigned i = 0; i < NC; i++)
		printf("%s +%llu\n", names[i], after[i] - before[i]);

	/* Then 3 SENDs with no receive posted: the port receives them, the QP has no WQE for
	 * them (hw_counters/out_of_buffer), UD drops them. */
	unsigned long long oob0 = read_one(dev, "hw_counters", "out_of_buffer");
	unsigned long long rcv0 = read_one(dev, "counters", "port_rcv_packets");
	for (int i = 0; i < 3; i++) {
		struct ibv_sge s = { (uintptr_t)buf, sz, mr->lkey };
		struct ibv_send_wr w = { .wr_id = i, .sg_list = &s, .num_sge = 1, .opcode = IBV_WR_SEND,
					 .send_flags = IBV_SEND_SIGNALED }, *bw;
		w.wr.ud.ah = ah;
		w.wr.ud.remote_qpn = qp->qp_num;
		w.wr.ud.remote_qkey = 0x11111111;
		if (ibv_post_send(qp, &w, &bw))
			fail("post_send");
		struct ibv_wc wc;
		int k;
		while ((k = ibv_poll_cq(cq, 1, &wc)) == 0)
			;
		if (k < 0 || wc.status != IBV_WC_SUCCESS)
			fail("completion");
	}
	unsigned long long oob = oob0, rcv = rcv0;
	for (int tries = 0; tries < 100 && (oob < oob0 + 3 || rcv < rcv0 + 3); tries++) {
		usleep(100000);
		oob = read_one(dev, "hw_counters", "out_of_buffer");
		rcv = read_one(dev, "counters", "port_rcv_packets");
	}
	usleep(300000);
	oob = read_one(dev, "hw_counters", "out_of_buffer");
	rcv = read_one(dev, "counters", "port_rcv_packets");
	printf("no receive posted: out_of_buffer +%llu port_rcv_packets +%llu\n", oob - oob0, rcv - rcv0);
	ibv_destroy_qp(qp);
	ibv_destroy_ah(ah);
	ibv_destroy_cq(cq);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
