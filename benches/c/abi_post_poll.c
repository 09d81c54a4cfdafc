/*
 * The C side of benches/benches/c_abi.rs: ibv_post_send and ibv_poll_cq
 * through the mlx5-userspace libibverbs.so.1 (the header's inline
 * functions, through ibv_context.ops), on two built-in model functions of
 * this process with an RC QP between them. Prints one line per case:
 * "CASE ns_per_op", the median of its rounds' times. The Rust bench runs the same cases on the driver's
 * API and prints both.
 */
#include <errno.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mlx5_userspace.h"

#define SQ 1024
/* The wait after a round's last bytes landed, for its CQEs (post_round). */
#define SETTLE_NS 200000.0
/* The empty CQ's polls are timed in this many rounds. */
#define ROUNDS_EMPTY 100

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void die(const char *what)
{
	fprintf(stderr, "abi_post_poll: %s: %s\n", what, strerror(errno));
	exit(1);
}

static double now_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1e9 + t.tv_nsec;
}

static void open_side(struct ibv_device *dev, struct side *s)
{
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = SQ, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1 },
	};

	if (!(s->ctx = ibv_open_device(dev)) || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, SQ, NULL, NULL, 0)))
		die("open");
	s->buf = aligned_alloc(4096, 1 << 20);
	s->mr = ibv_reg_mr(s->pd, s->buf, 1 << 20, IBV_ACCESS_LOCAL_WRITE |
			   IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ);
	ia.send_cq = ia.recv_cq = s->cq;
	if (!s->mr || !(s->qp = ibv_create_qp(s->pd, &ia)) || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("objects");
}

static void connect_to(struct side *s, struct side *p)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				 .qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ };

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_4096;
	a.dest_qp_num = p->qp->qp_num;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = p->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
			  IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static void wait_cqe(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	int n;

	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	if (n < 0 || wc.status != IBV_WC_SUCCESS)
		die("completion");
}

/* The timed loops, each its own function so that callgrind can collect
 * them alone (--toggle-collect=loop_*). */

__attribute__((noinline)) static void loop_poll_empty(struct ibv_cq *cq, long n)
{
	struct ibv_wc wc;

	for (long i = 0; i < n; i++)
		if (ibv_poll_cq(cq, 1, &wc) != 0)
			die("poll of an empty CQ");
}

/* n WRs of `wr`, one ibv_post_send each, the last signaled. */
__attribute__((noinline)) static void loop_post(struct ibv_qp *qp, struct ibv_send_wr *wr, long n)
{
	struct ibv_send_wr *bad;

	for (long i = 0; i < n; i++) {
		wr->wr_id = i;
		wr->send_flags = i == n - 1 ? IBV_SEND_SIGNALED : 0;
		if (ibv_post_send(qp, wr, &bad))
			die("ibv_post_send");
	}
}

/* Polls n completions one per call; the calls that found none. */
__attribute__((noinline)) static long loop_poll_full(struct ibv_cq *cq, long n)
{
	struct ibv_wc wc;
	long got = 0, empty = 0;

	while (got < n) {
		int k = ibv_poll_cq(cq, 1, &wc);

		if (k < 0 || (k == 1 && wc.status != IBV_WC_SUCCESS))
			die("completion");
		got += k;
		empty += !k;
	}
	return empty;
}

/* Polls n completions up to 16 per call; the calls that found none. */
__attribute__((noinline)) static long loop_poll16(struct ibv_cq *cq, long n)
{
	struct ibv_wc wc[16];
	long got = 0, empty = 0;

	while (got < n) {
		int k = ibv_poll_cq(cq, 16, wc);

		if (k < 0)
			die("completion");
		for (int j = 0; j < k; j++)
			if (wc[j].status != IBV_WC_SUCCESS)
				die("completion");
		got += k;
		empty += !k;
	}
	return empty;
}

/* SQ-1 signaled WRITEs, WR i from and to slot i (round r's stamps), the
 * wait until the last one's bytes landed at B, and then SETTLE_NS more:
 * the CQEs trail the bytes, and a timed poll racing the model's CQE
 * writes measures the race, not the poll (the empty calls, counted,
 * show whether the settle was long enough). */
static void post_round(struct side *a, struct side *b, long r)
{
	struct ibv_sge sge = { 0, 64, a->mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	volatile uint64_t *last = (volatile uint64_t *)(b->buf + 64 * (SQ - 2));
	uint64_t stamp = (r + 1) << 16;

	wr.wr.rdma.rkey = b->mr->rkey;
	for (long i = 0; i < SQ - 1; i++) {
		*(uint64_t *)(a->buf + 64 * i) = stamp + i;
		sge.addr = (uintptr_t)a->buf + 64 * i;
		wr.wr.rdma.remote_addr = (uintptr_t)b->buf + 64 * i;
		wr.wr_id = i;
		if (ibv_post_send(a->qp, &wr, &bad))
			die("ibv_post_send");
	}
	double t0;

	while (*last != stamp + SQ - 2)
		sched_yield();
	for (t0 = now_ns(); now_ns() - t0 < SETTLE_NS;)
		sched_yield();
}

static int cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x, b = *(const double *)y;

	return (a > b) - (a < b);
}

/* The median of n round times, per operation: a round that a preemption
 * or a neighbour's burst fell on does not move it. */
static double median_per_op(double *v, long n, double ops)
{
	qsort(v, n, sizeof(*v), cmp_double);
	return v[n / 2] / ops;
}

int main(int argc, char **argv)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device **list;
	long polls = argc > 1 ? atol(argv[1]) : 2000000, rounds = argc > 2 ? atol(argv[2]) : 200;
	double t0, *tr;
	long i, r, empty;
	int n;

	if (mlx5u_set_devices("emu,emu") || !(list = ibv_get_device_list(&n)) || n != 2)
		die("devices");
	open_side(list[0], &a);
	open_side(list[1], &b);
	connect_to(&a, &b);
	connect_to(&b, &a);

	if (rounds < 1 || polls < ROUNDS_EMPTY || !(tr = calloc(rounds > ROUNDS_EMPTY ? rounds : ROUNDS_EMPTY, sizeof(*tr))))
		die("arguments");

	/* An empty CQ: the poll path alone, in ROUNDS_EMPTY rounds. */
	for (r = 0; r < ROUNDS_EMPTY; r++) {
		t0 = now_ns();
		loop_poll_empty(a.cq, polls / ROUNDS_EMPTY);
		tr[r] = now_ns() - t0;
	}
	printf("poll_empty %.2f\n", median_per_op(tr, ROUNDS_EMPTY, polls / ROUNDS_EMPTY));

	/* SQ-1 unsignaled 64-byte RDMA WRITEs then one signaled: the post
	 * path (timed alone), then the completion. */
	struct ibv_sge sge = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr wr = { .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_RDMA_WRITE }, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey;
	for (r = 0; r < rounds; r++) {
		t0 = now_ns();
		loop_post(a.qp, &wr, SQ - 1);
		tr[r] = now_ns() - t0;
		wait_cqe(a.cq);
	}
	printf("post_write %.2f\n", median_per_op(tr, rounds, SQ - 1));

	/* SQ-1 signaled WRITEs; once the last one's bytes landed at B, their
	 * completions polled one per call (timed; the calls that found none
	 * are counted and their empty-poll cost taken off). */
	empty = 0;
	for (r = 0; r < rounds; r++) {
		post_round(&a, &b, r);
		t0 = now_ns();
		empty += loop_poll_full(a.cq, SQ - 1);
		tr[r] = now_ns() - t0;
	}
	printf("poll_1cqe %.2f\n", median_per_op(tr, rounds, SQ - 1));
	printf("poll_1cqe_empty_calls %ld\n", empty);

	/* The same, polled up to 16 a call: ns per completion. */
	empty = 0;
	for (r = 0; r < rounds; r++) {
		post_round(&a, &b, rounds + r);
		t0 = now_ns();
		empty += loop_poll16(a.cq, SQ - 1);
		tr[r] = now_ns() - t0;
	}
	printf("poll_16 %.2f\n", median_per_op(tr, rounds, SQ - 1));
	printf("poll_16_empty_calls %ld\n", empty);

	/* One signaled WRITE and its completion, back to back. */
	wr.send_flags = IBV_SEND_SIGNALED;
	t0 = now_ns();
	for (i = 0; i < rounds * 10; i++) {
		if (ibv_post_send(a.qp, &wr, &bad))
			die("ibv_post_send");
		wait_cqe(a.cq);
	}
	printf("write_roundtrip %.2f\n", (now_ns() - t0) / (rounds * 10));
	return 0;
}
