/* DEVX through libmlx5's own calls, as rdma-core's users probe it: open a DEVX context,
 * read the general and atomic capability pages, register a umem, allocate DEVX UARs (the
 * BlueFlame one and the NC one), create and destroy an event channel, run a general command
 * the firmware does not implement. Prints one "key value" line per result; the Rust test
 * (tests/devx_probe.rs) checks them. Exit 0 unless a call that must succeed failed. */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/mlx5dv.h>

/* PRM numbers (no installed header carries them). */
#define OP_QUERY_HCA_CAP 0x100
#define OP_QUERY_LAG 0x842

static void set16(uint8_t *b, int byte, uint16_t v) { b[byte] = v >> 8; b[byte + 1] = v & 0xff; }

/* Bits [bit, bit + width) of a big-endian PRM mailbox. */
static uint64_t get_bits(const uint8_t *b, int bit, int width)
{
	uint64_t v = 0;
	for (int i = 0; i < width; i++) {
		int x = bit + i;
		v = (v << 1) | ((b[x / 8] >> (7 - x % 8)) & 1);
	}
	return v;
}

static int query_cap(struct ibv_context *ctx, int type, uint8_t *out, size_t outlen)
{
	uint8_t in[16] = {0};
	set16(in, 0, OP_QUERY_HCA_CAP);
	set16(in, 6, (uint16_t)(type << 1 | 1));
	return mlx5dv_devx_general_cmd(ctx, in, sizeof(in), out, outlen);
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0) {
		fprintf(stderr, "no device\n");
		return 1;
	}
	struct mlx5dv_context_attr attr = {.flags = MLX5DV_CONTEXT_FLAGS_DEVX};
	struct ibv_context *ctx = mlx5dv_open_device(list[0], &attr);
	if (!ctx) {
		fprintf(stderr, "mlx5dv_open_device(DEVX): %s\n", strerror(errno));
		return 1;
	}
	static uint8_t out[16 + 4096];
	int rc = query_cap(ctx, 0, out, sizeof(out));
	printf("general_rc %d\n", rc);
	/* Page at bit 0x80: log_max_msg 0x1c3/5, atomic 0x21e/1, dct 0x21a/1. */
	printf("log_max_msg %llu\n", (unsigned long long)get_bits(out, 0x80 + 0x1c3, 5));
	printf("atomic %llu\n", (unsigned long long)get_bits(out, 0x80 + 0x21e, 1));
	printf("dct %llu\n", (unsigned long long)get_bits(out, 0x80 + 0x21a, 1));
	memset(out, 0, sizeof(out));
	rc = query_cap(ctx, 3, out, sizeof(out));
	printf("atomic_rc %d\n", rc);
	printf("atomic_operations %llu\n", (unsigned long long)get_bits(out, 0x80 + 0x90, 16));
	printf("atomic_size_qp %llu\n", (unsigned long long)get_bits(out, 0x80 + 0xb0, 16));
	uint8_t lag_in[16] = {0}, lag_out[64] = {0};
	set16(lag_in, 0, OP_QUERY_LAG);
	rc = mlx5dv_devx_general_cmd(ctx, lag_in, sizeof(lag_in), lag_out, sizeof(lag_out));
	printf("query_lag %d errno %d status %u\n", rc, rc ? errno : 0, lag_out[0]);

	void *buf = aligned_alloc(4096, 8192);
	struct mlx5dv_devx_umem *umem = mlx5dv_devx_umem_reg(ctx, buf, 8192, IBV_ACCESS_LOCAL_WRITE);
	printf("umem %d id_nonzero %d\n", umem ? 0 : errno, umem ? umem->umem_id != 0 : 0);
	if (umem)
		printf("umem_dereg %d\n", mlx5dv_devx_umem_dereg(umem));

	struct mlx5dv_devx_uar *bf = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_BF);
	printf("uar_bf %d page_id_nonzero %d\n", bf ? 0 : errno, bf ? bf->page_id != 0 : 0);
	struct mlx5dv_devx_uar *nc = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
	printf("uar_nc %d\n", nc ? 0 : errno);
	if (bf)
		mlx5dv_devx_free_uar(bf);
	if (nc)
		mlx5dv_devx_free_uar(nc);

	struct mlx5dv_devx_event_channel *ch =
		mlx5dv_devx_create_event_channel(ctx, MLX5DV_DEVX_CREATE_EVENT_CHANNEL_FLAGS_OMIT_EV_DATA);
	printf("event_channel %d fd_valid %d\n", ch ? 0 : errno, ch ? ch->fd >= 0 : 0);
	if (ch)
		mlx5dv_devx_destroy_event_channel(ch);

	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	return 0;
}
