/* Finding 7 of issue 20, re-checked through libmlx5 as rdma-core's users meet it: an SRQ,
 * CQ and QP whose buffers libmlx5 tries to put in huge pages (MLX5_*_ALLOC_TYPE=PREFER_HUGE,
 * run by the Rust test with no huge page free, so libmlx5 falls back to ordinary memory),
 * and mlx5dv_create_qp asking for the MKEY configure and UMR (MR interleaved / list) send
 * operations: libmlx5 44 accepts those flags and mlx5_ib creates such a QP without looking
 * at them, so both must succeed. Prints one "key value" line per result; exit 0 unless the
 * device cannot be opened. */
#include <errno.h>
#include <stdio.h>
#include <infiniband/mlx5dv.h>

static void report(const char *what, const void *obj)
{
	printf("%s %d\n", what, obj ? 0 : errno);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx) {
		fprintf(stderr, "ibv_open_device: %d\n", errno);
		return 1;
	}
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	report("pd", pd);
	struct ibv_srq_init_attr sa = {.attr = {.max_wr = 64, .max_sge = 1}};
	report("srq", ibv_create_srq(pd, &sa));
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	report("cq", cq);
	struct ibv_qp_init_attr qa = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
	};
	report("qp", ibv_create_qp(pd, &qa));
	const struct { const char *name; uint64_t ops; } dv_ops[] = {
		{"mkey_configure_qp", MLX5DV_QP_EX_WITH_MKEY_CONFIGURE},
		{"mr_interleaved_qp", MLX5DV_QP_EX_WITH_MR_INTERLEAVED},
		{"mr_list_qp", MLX5DV_QP_EX_WITH_MR_LIST},
		/* A flag libmlx5 does not know: refused by libmlx5 itself (EOPNOTSUPP). */
		{"unknown_ops_qp", 1ull << 40},
	};
	for (unsigned i = 0; i < sizeof(dv_ops) / sizeof(dv_ops[0]); i++) {
		struct ibv_qp_init_attr_ex x = {
			.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .pd = pd,
			.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
			.send_ops_flags = IBV_QP_EX_WITH_SEND,
		};
		struct mlx5dv_qp_init_attr dv = {
			.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
			.send_ops_flags = dv_ops[i].ops,
		};
		report(dv_ops[i].name, mlx5dv_create_qp(ctx, &x, &dv));
	}
	return 0;
}
