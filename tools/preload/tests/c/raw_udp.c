/*
 * A RAW_PACKET QP through libibverbs/libmlx5, for tools/preload/tests/raw_tap.rs.
 *
 *   raw_udp send SMAC DMAC SIP DIP SPORT DPORT COUNT
 *       sends COUNT IPv4/UDP frames (payload: "seq N") with both checksums left zero
 *       and IBV_SEND_IP_CSUM, so the device computes them (checksum offload).
 *   raw_udp recv MAC IP DPORT COUNT
 *       steers IPv4/UDP frames to MAC/IP/DPORT into the QP (ibv_create_flow), receives
 *       COUNT of them; prints per frame "frame LEN csum_ok=0|1 ts=T", and checks that the
 *       completion timestamps are non-decreasing and between the raw clock read before the
 *       first receive and after the last one (ibv_query_rt_values_ex).
 *
 * Exits non-zero with a message on any failure.
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define DIE(...) do { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); exit(1); } while (0)
#define SLOTS 64
#define SLOT 2048

static void mac_of(const char *s, uint8_t m[6])
{
	unsigned v[6];
	if (sscanf(s, "%x:%x:%x:%x:%x:%x", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5]) != 6)
		DIE("bad MAC %s", s);
	for (int i = 0; i < 6; i++)
		m[i] = (uint8_t)v[i];
}

static uint64_t raw_clock(struct ibv_context *ctx)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	if (ibv_query_rt_values_ex(ctx, &v))
		DIE("ibv_query_rt_values_ex failed");
	return (uint64_t)v.raw_clock.tv_sec * 1000000000ull + (uint64_t)v.raw_clock.tv_nsec;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		DIE("usage: raw_udp send|recv ...");
	int sending = strcmp(argv[1], "send") == 0;
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n < 1)
		DIE("no device");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		DIE("ibv_open_device failed");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq_init_attr_ex cqa = {
		.cqe = 2 * SLOTS,
		.wc_flags = IBV_WC_EX_WITH_BYTE_LEN | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP,
	};
	struct ibv_cq_ex *cq = ibv_create_cq_ex(ctx, &cqa);
	if (!pd || !cq)
		DIE("pd/cq failed");
	struct ibv_qp_init_attr qa = {
		.send_cq = ibv_cq_ex_to_cq(cq),
		.recv_cq = ibv_cq_ex_to_cq(cq),
		.cap = { .max_send_wr = SLOTS, .max_recv_wr = SLOTS, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RAW_PACKET,
		.sq_sig_all = 1,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &qa);
	if (!qp)
		DIE("ibv_create_qp(RAW_PACKET) failed: %s", strerror(errno));
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1 };
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PORT))
		DIE("INIT failed");
	a.qp_state = IBV_QPS_RTR;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		DIE("RTR failed");
	a.qp_state = IBV_QPS_RTS;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE))
		DIE("RTS failed");
	uint8_t *buf = aligned_alloc(4096, SLOTS * SLOT);
	memset(buf, 0, SLOTS * SLOT);
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, SLOTS * SLOT, IBV_ACCESS_LOCAL_WRITE);
	if (!mr)
		DIE("reg_mr failed");

	if (sending) {
		if (argc != 9)
			DIE("usage: raw_udp send SMAC DMAC SIP DIP SPORT DPORT COUNT");
		uint8_t smac[6], dmac[6];
		mac_of(argv[2], smac);
		mac_of(argv[3], dmac);
		in_addr_t sip = inet_addr(argv[4]), dip = inet_addr(argv[5]);
		int sport = atoi(argv[6]), dport = atoi(argv[7]), count = atoi(argv[8]);
		for (int i = 0; i < count; i++) {
			uint8_t *f = buf + (i % SLOTS) * SLOT;
			char pay[32];
			int plen = snprintf(pay, sizeof(pay), "seq %d", i);
			int len = 14 + 20 + 8 + plen;
			memset(f, 0, len);
			memcpy(f, dmac, 6);
			memcpy(f + 6, smac, 6);
			f[12] = 0x08;
			f[14] = 0x45;
			uint16_t tot = htons(20 + 8 + plen);
			memcpy(f + 16, &tot, 2);
			f[22] = 64;
			f[23] = 17;
			memcpy(f + 26, &sip, 4);
			memcpy(f + 30, &dip, 4);
			uint16_t sp = htons(sport), dp = htons(dport), ul = htons(8 + plen);
			memcpy(f + 34, &sp, 2);
			memcpy(f + 36, &dp, 2);
			memcpy(f + 38, &ul, 2);
			memcpy(f + 42, pay, plen);
			struct ibv_sge sge = { .addr = (uintptr_t)f, .length = len, .lkey = mr->lkey };
			struct ibv_send_wr wr = {
				.wr_id = i, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
				.send_flags = IBV_SEND_SIGNALED | IBV_SEND_IP_CSUM,
			}, *bad;
			if (ibv_post_send(qp, &wr, &bad))
				DIE("post_send %d failed: %s", i, strerror(errno));
			struct ibv_wc wc;
			int got;
			while ((got = ibv_poll_cq(ibv_cq_ex_to_cq(cq), 1, &wc)) == 0)
				;
			if (got < 0 || wc.status != IBV_WC_SUCCESS)
				DIE("send %d completed with %s", i, ibv_wc_status_str(wc.status));
		}
		printf("sent %d\n", count);
		return 0;
	}

	if (argc != 6)
		DIE("usage: raw_udp recv MAC IP DPORT COUNT");
	struct flow_req {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_eth eth;
		struct ibv_flow_spec_ipv4 ip;
		struct ibv_flow_spec_tcp_udp udp;
	} __attribute__((packed));
	static union {
		struct flow_req r;
		struct ibv_flow_attr a;
	} u;
	struct flow_req *flp = &u.r;
#define fl (*flp)
	memset(&fl, 0, sizeof(fl));
	fl.attr.type = IBV_FLOW_ATTR_NORMAL;
	fl.attr.size = sizeof(fl);
	fl.attr.num_of_specs = 3;
	fl.attr.port = 1;
	fl.eth.type = IBV_FLOW_SPEC_ETH;
	fl.eth.size = sizeof(fl.eth);
	mac_of(argv[2], fl.eth.val.dst_mac);
	memset(fl.eth.mask.dst_mac, 0xff, 6);
	fl.ip.type = IBV_FLOW_SPEC_IPV4;
	fl.ip.size = sizeof(fl.ip);
	fl.ip.val.dst_ip = inet_addr(argv[3]);
	fl.ip.mask.dst_ip = 0xffffffff;
	fl.udp.type = IBV_FLOW_SPEC_UDP;
	fl.udp.size = sizeof(fl.udp);
	fl.udp.val.dst_port = htons(atoi(argv[4]));
	fl.udp.mask.dst_port = 0xffff;
	struct ibv_flow *flow = ibv_create_flow(qp, &u.a);
	if (!flow)
		DIE("ibv_create_flow failed: %s", strerror(errno));
	int count = atoi(argv[5]);
	for (int i = 0; i < SLOTS; i++) {
		struct ibv_sge sge = { .addr = (uintptr_t)(buf + i * SLOT), .length = SLOT, .lkey = mr->lkey };
		struct ibv_recv_wr wr = { .wr_id = i, .sg_list = &sge, .num_sge = 1 }, *bad;
		if (ibv_post_recv(qp, &wr, &bad))
			DIE("post_recv failed");
	}
	printf("ready\n");
	fflush(stdout);
	/* Let the device's clock page move (it does at least every 10 ms). */
	usleep(30000);
	uint64_t before = raw_clock(ctx), last = 0;
	int got = 0;
	while (got < count) {
		struct ibv_poll_cq_attr pa = { 0 };
		if (ibv_start_poll(cq, &pa))
			continue;
		do {
			if (cq->status != IBV_WC_SUCCESS)
				DIE("receive completed with %s", ibv_wc_status_str(cq->status));
			uint64_t ts = ibv_wc_read_completion_ts(cq);
			int ok = !!(ibv_wc_read_wc_flags(cq) & IBV_WC_IP_CSUM_OK);
			printf("frame %u csum_ok=%d ts=%llu\n", ibv_wc_read_byte_len(cq), ok,
			       (unsigned long long)ts);
			if (ts < last)
				DIE("timestamp went backwards: %llu after %llu",
				    (unsigned long long)ts, (unsigned long long)last);
			if (ts < before)
				DIE("timestamp %llu before the clock read at the start %llu",
				    (unsigned long long)ts, (unsigned long long)before);
			last = ts;
			int slot = (int)cq->wr_id;
			struct ibv_sge sge = { .addr = (uintptr_t)(buf + slot * SLOT), .length = SLOT, .lkey = mr->lkey };
			struct ibv_recv_wr wr = { .wr_id = slot, .sg_list = &sge, .num_sge = 1 }, *bad;
			if (ibv_post_recv(qp, &wr, &bad))
				DIE("post_recv failed");
			got++;
		} while (got < count && ibv_next_poll(cq) == 0);
		ibv_end_poll(cq);
	}
	/* The device's clock page moves at least every 10 ms while a context is open. */
	usleep(30000);
	uint64_t after = raw_clock(ctx);
	if (last > after)
		DIE("timestamp %llu after the clock read at the end %llu",
		    (unsigned long long)last, (unsigned long long)after);
	printf("received %d clock %llu..%llu\n", got, (unsigned long long)before,
	       (unsigned long long)after);
	ibv_destroy_flow(flow);
	return 0;
}
