/* Queue depths as libibverbs programs see them on the emulated HCA: for each asked depth, the
 * depth ibv_create_qp/ibv_create_srq told, the depth ibv_query_qp/ibv_query_srq report, and the
 * number of receives the queue accepted before refusing one. One line per queue:
 *   qp ASK told TOLD query QUERY sge QUERY_SGE accepted N
 *   srq ASK told TOLD query QUERY accepted N
 * Exit status 0 when every verb succeeded. */
#include <stdint.h>
#include <stdio.h>
#include <infiniband/verbs.h>

static char buf[4096];

static int fill_qp(struct ibv_qp *qp, struct ibv_mr *mr) {
	int n = 0;
	for (; n < 1000; n++) {
		struct ibv_sge s = { (uintptr_t)buf, 16, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = n, .sg_list = &s, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			break;
	}
	return n;
}

static int fill_srq(struct ibv_srq *srq, struct ibv_mr *mr) {
	int n = 0;
	for (; n < 1000; n++) {
		struct ibv_sge s = { (uintptr_t)buf, 16, mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = n, .sg_list = &s, .num_sge = 1 }, *bad;
		if (ibv_post_srq_recv(srq, &wr, &bad))
			break;
	}
	return n;
}

int main(void) {
	int num;
	struct ibv_device **list = ibv_get_device_list(&num);
	if (!list || num == 0) { fprintf(stderr, "no device\n"); return 1; }
	struct ibv_context *ctx = ibv_open_device(list[0]);
	struct ibv_pd *pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	struct ibv_cq *cq = pd ? ibv_create_cq(ctx, 256, NULL, NULL, 0) : NULL;
	struct ibv_mr *mr = cq ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!mr) { perror("setup"); return 1; }
	static const unsigned asks[] = { 1, 3, 4, 5, 9, 100 };
	for (unsigned i = 0; i < sizeof asks / sizeof asks[0]; i++) {
		unsigned ask = asks[i];
		struct ibv_qp_init_attr ia = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 4, .max_recv_wr = ask, .max_send_sge = 1,
				 .max_recv_sge = 1 },
		};
		struct ibv_qp *qp = ibv_create_qp(pd, &ia);
		if (!qp) { perror("ibv_create_qp"); return 1; }
		/* libmlx5 accepts receives from INIT on (its per-state SGE limit is 0 in RESET). */
		struct ibv_qp_attr ma = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
		if (ibv_modify_qp(qp, &ma, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS)) { perror("ibv_modify_qp"); return 1; }
		struct ibv_qp_attr qa;
		struct ibv_qp_init_attr qi;
		if (ibv_query_qp(qp, &qa, IBV_QP_CAP, &qi)) { perror("ibv_query_qp"); return 1; }
		int n = fill_qp(qp, mr);
		printf("qp %u told %u query %u sge %u accepted %d\n", ask, ia.cap.max_recv_wr,
		       qa.cap.max_recv_wr, qa.cap.max_recv_sge, n);
		if (ibv_destroy_qp(qp)) { perror("ibv_destroy_qp"); return 1; }

		struct ibv_srq_init_attr sa = { .attr = { .max_wr = ask, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(pd, &sa);
		if (!srq) { perror("ibv_create_srq"); return 1; }
		struct ibv_srq_attr q;
		if (ibv_query_srq(srq, &q)) { perror("ibv_query_srq"); return 1; }
		n = fill_srq(srq, mr);
		printf("srq %u told %u query %u accepted %d\n", ask, sa.attr.max_wr, q.max_wr, n);
		if (ibv_destroy_srq(srq)) { perror("ibv_destroy_srq"); return 1; }
	}
	ibv_dereg_mr(mr);
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	return 0;
}
