/*
 * A program with its own memory hooks, as UCX's bistro hooks make one: this executable
 * defines mmap, mmap64 and munmap itself (libibverbs and libmlx5 bind to them, ahead of
 * libc and of the preload), and they issue the system calls directly. So libmlx5's UAR
 * mmap of the uverbs descriptor never passes through a libc-level hook.
 *
 * Then, through libibverbs/libmlx5 objects: two RC QPs connected to each other on port 1,
 * ITERS RDMA WRITEs and SENDs whose doorbells libmlx5 rings on the UAR page it mapped that
 * way, every byte checked; a UAR page mapped by the program itself with syscall(SYS_mmap);
 * and the forwarded cases: a one-page anonymous munmap really unmaps, and an mmap of an
 * ordinary file whose descriptor lies in the device descriptors' range maps that file.
 *
 * Prints "hooked mmap N munmap M", "ops K ns_per_op T", "direct uar ok", "forwarded ok".
 * With the argument "exec" it then runs itself again by execv (without the argument): the
 * new image inherits the seccomp filter and installs its own at its device open.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define ITERS 200
#define SIZE 4096

static unsigned long hooked_mmaps, hooked_munmaps;

void *mmap(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	long r;

	if (fd >= 0)
		__atomic_fetch_add(&hooked_mmaps, 1, __ATOMIC_RELAXED);
	r = syscall(SYS_mmap, addr, len, prot, flags, fd, off);
	return r == -1 ? MAP_FAILED : (void *)r;
}

void *mmap64(void *addr, size_t len, int prot, int flags, int fd, off_t off)
{
	return mmap(addr, len, prot, flags, fd, off);
}

int munmap(void *addr, size_t len)
{
	__atomic_fetch_add(&hooked_munmaps, 1, __ATOMIC_RELAXED);
	return (int)syscall(SYS_munmap, addr, len);
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond)) {                                                 \
			fprintf(stderr, __VA_ARGS__);                          \
			fprintf(stderr, " (errno %d: %s)\n", errno,            \
				strerror(errno));                              \
			exit(1);                                               \
		}                                                              \
	} while (0)

static void to_rts(struct ibv_qp *qp, uint32_t remote_qpn, uint16_t lid)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				     IBV_QP_ACCESS_FLAGS),
	      "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = remote_qpn;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.dlid = lid;
	a.ah_attr.port_num = 1;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				     IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				     IBV_QP_MAX_DEST_RD_ATOMIC |
				     IBV_QP_MIN_RNR_TIMER),
	      "RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	CHECK(!ibv_modify_qp(qp, &a,
			     IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				     IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				     IBV_QP_MAX_QP_RD_ATOMIC),
	      "RTS");
}

/* Poll until `n` completions arrived (2 s at most), each successful. */
static void wait_cq(struct ibv_cq *cq, int n)
{
	struct ibv_wc wc[4];
	struct timespec t0, t;

	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (n > 0) {
		int got = ibv_poll_cq(cq, 4, wc);

		CHECK(got >= 0, "poll_cq");
		for (int i = 0; i < got; i++)
			CHECK(wc[i].status == IBV_WC_SUCCESS,
			      "completion %s (wr_id %lu)",
			      ibv_wc_status_str(wc[i].status),
			      (unsigned long)wc[i].wr_id);
		n -= got;
		clock_gettime(CLOCK_MONOTONIC, &t);
		CHECK((t.tv_sec - t0.tv_sec) < 2,
		      "no completion within 2 s: the doorbell was not executed");
	}
}

int main(int argc, char **argv)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	struct ibv_context *ctx;
	struct ibv_port_attr port;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	struct ibv_mr *ma, *mb;
	struct ibv_qp_init_attr qi;
	unsigned char *a, *b;
	struct timespec t0, t1;

	CHECK(list && list[0], "no device");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx, "ibv_open_device");
	CHECK(!ibv_query_port(ctx, 1, &port), "query_port");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd, "alloc_pd");
	cq = ibv_create_cq(ctx, 64, NULL, NULL, 0);
	CHECK(cq, "create_cq");
	memset(&qi, 0, sizeof(qi));
	qi.send_cq = cq;
	qi.recv_cq = cq;
	qi.qp_type = IBV_QPT_RC;
	qi.cap.max_send_wr = 16;
	qi.cap.max_recv_wr = 16;
	qi.cap.max_send_sge = 1;
	qi.cap.max_recv_sge = 1;
	qa = ibv_create_qp(pd, &qi);
	qb = ibv_create_qp(pd, &qi);
	CHECK(qa && qb, "create_qp");
	to_rts(qa, qb->qp_num, port.lid);
	to_rts(qb, qa->qp_num, port.lid);
	a = aligned_alloc(4096, SIZE);
	b = aligned_alloc(4096, SIZE);
	CHECK(a && b, "alloc");
	memset(b, 0, SIZE);
	ma = ibv_reg_mr(pd, a, SIZE, IBV_ACCESS_LOCAL_WRITE);
	mb = ibv_reg_mr(pd, b, SIZE,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	CHECK(ma && mb, "reg_mr");

	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (int it = 0; it < ITERS; it++) {
		struct ibv_sge sge = { (uintptr_t)a, SIZE, ma->lkey };
		struct ibv_sge rsge = { (uintptr_t)b, SIZE, mb->lkey };
		struct ibv_send_wr wr, *bad;
		struct ibv_recv_wr rwr = { .wr_id = 1000 + it, .sg_list = &rsge,
					   .num_sge = 1 }, *rbad;
		size_t len = 1 + (size_t)(it * 37) % SIZE;

		for (size_t i = 0; i < SIZE; i++)
			a[i] = (unsigned char)(i * 7 + it);
		sge.length = (uint32_t)len;
		memset(&wr, 0, sizeof(wr));
		wr.wr_id = it;
		wr.sg_list = &sge;
		wr.num_sge = 1;
		if (it % 2 == 0) {
			wr.opcode = IBV_WR_RDMA_WRITE;
			wr.send_flags = IBV_SEND_SIGNALED;
			wr.wr.rdma.remote_addr = (uintptr_t)b;
			wr.wr.rdma.rkey = mb->rkey;
			CHECK(!ibv_post_send(qa, &wr, &bad), "post write");
			wait_cq(cq, 1);
		} else {
			CHECK(!ibv_post_recv(qb, &rwr, &rbad), "post recv");
			wr.opcode = IBV_WR_SEND;
			wr.send_flags = IBV_SEND_SIGNALED;
			CHECK(!ibv_post_send(qa, &wr, &bad), "post send");
			wait_cq(cq, 2);
		}
		for (size_t i = 0; i < len; i++)
			CHECK(b[i] == a[i], "iteration %d byte %zu: %u, sent %u",
			      it, i, b[i], a[i]);
	}
	clock_gettime(CLOCK_MONOTONIC, &t1);
	printf("ops %d ns_per_op %ld\n", ITERS,
	       ((t1.tv_sec - t0.tv_sec) * 1000000000L +
		(t1.tv_nsec - t0.tv_nsec)) / ITERS);

	/* A UAR page mapped by the program itself, below libc. */
	{
		long p = syscall(SYS_mmap, NULL, 4096, PROT_WRITE, MAP_SHARED,
				 ctx->cmd_fd, 0);

		CHECK(p != -1, "syscall(SYS_mmap) of UAR page 0");
		CHECK(syscall(SYS_munmap, (void *)p, 4096) == 0,
		      "syscall(SYS_munmap) of the UAR page");
		/* Private or fixed mappings of the device are refused, as by mlx5_ib. */
		p = syscall(SYS_mmap, NULL, 4096, PROT_WRITE, MAP_PRIVATE,
			    ctx->cmd_fd, 0);
		CHECK(p == -1 && errno == EINVAL, "private mapping not refused");
		printf("direct uar ok\n");
	}

	/* What is not the device's is forwarded to the kernel unchanged. */
	{
		unsigned char vec;
		char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE,
			       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		int mfd = memfd_create("fida-probe", 0), hi;
		char *q;

		CHECK(p != MAP_FAILED, "anonymous mmap");
		p[0] = 1;
		CHECK(munmap(p, 4096) == 0, "one-page munmap");
		CHECK(mincore(p, 4096, &vec) == -1 && errno == ENOMEM,
		      "the page is still mapped after munmap");
		CHECK(mfd >= 0 && write(mfd, "forwarded", 9) == 9, "memfd");
		hi = fcntl(mfd, F_DUPFD, ctx->cmd_fd + 1);
		CHECK(hi > ctx->cmd_fd, "dup into the device range");
		q = mmap(NULL, 4096, PROT_READ, MAP_SHARED, hi, 0);
		CHECK(q != MAP_FAILED && !memcmp(q, "forwarded", 9),
		      "mmap of an ordinary file in the device range");
		CHECK(munmap(q, 4096) == 0, "munmap of the file");
		close(hi);
		close(mfd);
		printf("forwarded ok\n");
	}

	CHECK(!ibv_dereg_mr(ma) && !ibv_dereg_mr(mb), "dereg");
	CHECK(!ibv_destroy_qp(qa) && !ibv_destroy_qp(qb), "destroy qp");
	CHECK(!ibv_destroy_cq(cq) && !ibv_dealloc_pd(pd), "destroy");
	CHECK(!ibv_close_device(ctx), "close");
	ibv_free_device_list(list);
	printf("hooked mmap %lu munmap %lu\n", hooked_mmaps, hooked_munmaps);
	if (argc > 1 && !strcmp(argv[1], "exec")) {
		char *args[] = { argv[0], NULL };

		fflush(stdout);
		execv("/proc/self/exe", args);
		CHECK(0, "execv");
	}
	return 0;
}
