/*
 * Asynchronous events with several contexts on one device: each event
 * reaches the context whose object it names, and only that one.
 *
 * Two ibv_contexts on mlx5_0 (one device-model function, looped back):
 * context A sends, context B receives on an SRQ whose limit is armed
 * (ibv_modify_srq IBV_SRQ_LIMIT). When fewer receives than the limit are
 * left, B gets IBV_EVENT_SRQ_LIMIT_REACHED naming its SRQ, A gets nothing,
 * and the limit reads 0 again (the device disarms it). A third context
 * opened and closed in between must not stop B's events: the limit is
 * armed and reached a second time.
 *
 * Run with MLX5_DEVICES=emu and LD_LIBRARY_PATH at the library; prints
 * "async_events: ok".
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/verbs.h>

static void die(const char *what)
{
	fprintf(stderr, "async_events: FAIL %s: %s\n", what, strerror(errno));
	exit(1);
}

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_srq *srq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char buf[4096];
	union ibv_gid gid;
};

static void open_side(struct ibv_device *dev, struct side *s, int with_srq)
{
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };

	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("ibv_open_device");
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0);
	s->mr = ibv_reg_mr(s->pd, s->buf, sizeof(s->buf), IBV_ACCESS_LOCAL_WRITE);
	if (!s->pd || !s->cq || !s->mr)
		die("PD, CQ or MR");
	if (with_srq) {
		s->srq = ibv_create_srq(s->pd, &sa);
		if (!s->srq)
			die("ibv_create_srq");
		ia.srq = s->srq;
	}
	ia.send_cq = s->cq;
	ia.recv_cq = s->cq;
	s->qp = ibv_create_qp(s->pd, &ia);
	if (!s->qp)
		die("ibv_create_qp");
	if (ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_query_gid");
}

static void connect_to(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
	};

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		die("RTR");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static void wait_wcs(struct side *s, int n)
{
	struct ibv_wc wc;

	while (n > 0) {
		int got = ibv_poll_cq(s->cq, 1, &wc);
		if (got < 0)
			die("ibv_poll_cq");
		if (got && wc.status != IBV_WC_SUCCESS) {
			fprintf(stderr, "async_events: FAIL completion %s\n",
				ibv_wc_status_str(wc.status));
			exit(1);
		}
		n -= got;
	}
}

static void post_recvs(struct side *s, int n)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, 64, s->mr->lkey };
	struct ibv_recv_wr wr = { .sg_list = &sge, .num_sge = 1 }, *bad;

	while (n-- > 0)
		if (ibv_post_srq_recv(s->srq, &wr, &bad))
			die("ibv_post_srq_recv");
}

static void sends(struct side *s, int n)
{
	struct ibv_sge sge = { (uintptr_t)s->buf, 8, s->mr->lkey };
	struct ibv_send_wr wr = {
		.sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND,
		.send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	int i;

	for (i = 0; i < n; i++)
		if (ibv_post_send(s->qp, &wr, &bad))
			die("ibv_post_send");
	wait_wcs(s, n);
}

static unsigned limit_of(struct ibv_srq *srq)
{
	struct ibv_srq_attr a;

	if (ibv_query_srq(srq, &a))
		die("ibv_query_srq");
	return a.srq_limit;
}

/* The next event of `c`: waits for it at most 20 s (a missing event is a
 * failure, not a hang). */
static struct ibv_async_event next_event(struct ibv_context *c)
{
	struct pollfd p = { .fd = c->async_fd, .events = POLLIN };
	struct ibv_async_event ev;

	if (poll(&p, 1, 20000) != 1)
		die("no async event");
	if (ibv_get_async_event(c, &ev))
		die("ibv_get_async_event");
	ibv_ack_async_event(&ev);
	return ev;
}

static void expect_limit_event(struct side *b, struct side *a, const char *round)
{
	struct ibv_async_event ev = next_event(b->ctx);
	int fl;

	if (ev.event_type != IBV_EVENT_SRQ_LIMIT_REACHED || ev.element.srq != b->srq) {
		fprintf(stderr, "async_events: FAIL %s: event %s on %p, want %s on %p\n",
			round, ibv_event_type_str(ev.event_type), (void *)ev.element.srq,
			ibv_event_type_str(IBV_EVENT_SRQ_LIMIT_REACHED), (void *)b->srq);
		exit(1);
	}
	/* Nothing for A: its async_fd, non-blocking, has no event. */
	fl = fcntl(a->ctx->async_fd, F_GETFL);
	if (fcntl(a->ctx->async_fd, F_SETFL, fl | O_NONBLOCK))
		die("fcntl");
	if (ibv_get_async_event(a->ctx, &ev) == 0 || errno != EAGAIN) {
		fprintf(stderr, "async_events: FAIL %s: context A got event %s\n", round,
			ibv_event_type_str(ev.event_type));
		exit(1);
	}
	if (fcntl(a->ctx->async_fd, F_SETFL, fl))
		die("fcntl");
	if (limit_of(b->srq) != 0) {
		fprintf(stderr, "async_events: FAIL %s: limit %u after its event, want 0\n",
			round, limit_of(b->srq));
		exit(1);
	}
	printf("%s: SRQ limit event on context B only, limit disarmed\n", round);
}

int main(void)
{
	static struct side a, b;
	struct ibv_srq_attr lim = { 0 };
	struct ibv_device **list;
	struct ibv_context *c;
	int n;

	list = ibv_get_device_list(&n);
	if (!list || n < 1)
		die("ibv_get_device_list");
	open_side(list[0], &a, 0);
	open_side(list[0], &b, 1);
	connect_to(&a, &b);
	connect_to(&b, &a);

	/* 8 receives, limit 6: the third SEND leaves 5. */
	post_recvs(&b, 8);
	lim.srq_limit = 6;
	if (ibv_modify_srq(b.srq, &lim, IBV_SRQ_LIMIT))
		die("ibv_modify_srq");
	if (limit_of(b.srq) != 6)
		die("limit not read back");
	sends(&a, 2);
	wait_wcs(&b, 2);
	sends(&a, 1);
	wait_wcs(&b, 1);
	expect_limit_event(&b, &a, "round 1");

	/* A third context comes and goes; B's events still arrive. */
	c = ibv_open_device(list[0]);
	if (!c || ibv_close_device(c))
		die("third context");
	lim.srq_limit = 4;
	if (ibv_modify_srq(b.srq, &lim, IBV_SRQ_LIMIT))
		die("ibv_modify_srq again");
	sends(&a, 2);
	wait_wcs(&b, 2);
	expect_limit_event(&b, &a, "round 2");

	/* A limit of the SRQ's size or more is refused. */
	lim.srq_limit = 1 << 20;
	if (ibv_modify_srq(b.srq, &lim, IBV_SRQ_LIMIT) == 0)
		die("a limit past the SRQ's size was taken");

	struct side *sides[2] = { &a, &b };
	for (n = 0; n < 2; n++) {
		struct side *s = sides[n];
		if (ibv_destroy_qp(s->qp) || (s->srq && ibv_destroy_srq(s->srq)) ||
		    ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) || ibv_dealloc_pd(s->pd) ||
		    ibv_close_device(s->ctx))
			die("teardown");
	}
	ibv_free_device_list(list);
	printf("async_events: ok\n");
	return 0;
}
