/*
 * The device clock through the C ABI, as a program uses it against
 * rdma-core's <infiniband/verbs.h> and <infiniband/mlx5dv.h>: two
 * device-model functions in this process, an RC QP on each, A's CQ made
 * by ibv_create_cq_ex with completion timestamps (device cycles and wall
 * clock). Checked: ibv_query_device_ex's clock fields, the raw clock of
 * ibv_query_rt_values_ex (it moves, and catches up with a completion's
 * stamp), mlx5dv_query_device's clock-info period and the mapped
 * internal timer, mlx5dv_get_clock_info, a WRITE's completion stamp
 * between raw clock readings before and after it, its wall time between
 * CLOCK_REALTIME readings, the header's own mlx5dv_ts_to_ns giving the
 * library's wall time; bad use gets errnos.
 *
 * Prints "ok: ..." per check and "timestamp: N failed" at the end.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <endian.h>

#include <infiniband/mlx5dv.h>

#include "mlx5_userspace.h"

#define EXAMPLE "timestamp"
#include "example_checks.h"

#define SIZE 4096
#define SEC 1000000000ULL

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq_ex *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
	union ibv_gid gid;
};

static void open_side(struct ibv_device *dev, struct side *s)
{
	struct ibv_cq_init_attr_ex c = {
		.cqe = 16,
		.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
			    IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK,
	};
	struct ibv_qp_init_attr a = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1 },
	};

	s->ctx = ibv_open_device(dev);
	if (!s->ctx || !(s->pd = ibv_alloc_pd(s->ctx)) || !(s->cq = ibv_create_cq_ex(s->ctx, &c)))
		die("open");
	s->buf = calloc(1, SIZE);
	s->mr = ibv_reg_mr(s->pd, s->buf, SIZE, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_reg_mr / ibv_query_gid");
	a.send_cq = a.recv_cq = ibv_cq_ex_to_cq(s->cq);
	if (!(s->qp = ibv_create_qp(s->pd, &a)))
		die("ibv_create_qp");
}

static void connect_to(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
			  IBV_QP_ACCESS_FLAGS))
		die("to INIT");
	a = (struct ibv_qp_attr){
		.qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
		.dest_qp_num = peer->qp->qp_num, .max_dest_rd_atomic = 1, .min_rnr_timer = 12,
		.ah_attr = { .is_global = 1, .port_num = 1,
			     .grh = { .dgid = peer->gid, .sgid_index = 0, .hop_limit = 64 } },
	};
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
			  IBV_QP_MIN_RNR_TIMER))
		die("to RTR");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				  .rnr_retry = 7, .max_rd_atomic = 1 };
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("to RTS");
}

/* The device clock in cycles (ibv_query_rt_values_ex), or 0. */
static uint64_t raw_clock(struct ibv_context *ctx)
{
	struct ibv_values_ex v = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };

	if (ibv_query_rt_values_ex(ctx, &v) || !(v.comp_mask & IBV_VALUES_MASK_RAW_CLOCK))
		return 0;
	return (uint64_t)v.raw_clock.tv_nsec;
}

static uint64_t wall_ns(void)
{
	struct timespec t;

	clock_gettime(CLOCK_REALTIME, &t);
	return (uint64_t)t.tv_sec * SEC + (uint64_t)t.tv_nsec;
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device **list;
	int n;

	if (mlx5u_set_devices("emu,emu") || !(list = ibv_get_device_list(&n)) || n != 2)
		die("devices");
	open_side(list[0], &a);
	open_side(list[1], &b);
	connect_to(&a, &b);
	connect_to(&b, &a);

	struct ibv_device_attr_ex dx;
	CHECK(!ibv_query_device_ex(a.ctx, NULL, &dx) && dx.hca_core_clock > 0 &&
		      dx.completion_timestamp_mask == 0x7fffffffffffffffULL,
	      "ibv_query_device_ex: hca_core_clock (kHz) and the timestamp mask");
	printf("hca_core_clock %llu kHz\n", (unsigned long long)dx.hca_core_clock);

	uint64_t c0 = raw_clock(a.ctx);
	CHECK(c0 > 0, "ibv_query_rt_values_ex: the raw clock");
	struct ibv_values_ex bad = { .comp_mask = 1 << 1 };
	CHECK(ibv_query_rt_values_ex(a.ctx, &bad) == EINVAL,
	      "ibv_query_rt_values_ex: an unknown mask bit is EINVAL");

	struct mlx5dv_context dv = {
		.comp_mask = MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE |
			     MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK,
	};
	CHECK(!mlx5dv_query_device(a.ctx, &dv) &&
		      dv.comp_mask & MLX5DV_CONTEXT_MASK_CLOCK_INFO_UPDATE &&
		      dv.max_clock_info_update_nsec > SEC,
	      "mlx5dv_query_device: how long clock info stays good");
	if (dv.comp_mask & MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK) {
		/* The internal timer, mapped: high word, low word, big-endian. */
		volatile uint32_t *t = dv.hca_core_clock;
		uint64_t m = (uint64_t)be32toh(t[0]) << 32 | be32toh(t[1]);
		CHECK(m >= c0, "mlx5dv_query_device: the mapped internal timer reads the clock");
	} else {
		CHECK(0, "mlx5dv_query_device: hca_core_clock");
	}

	struct mlx5dv_clock_info ci;
	CHECK(!mlx5dv_get_clock_info(a.ctx, &ci) && ci.mult > 0 &&
		      ci.mask == (1ULL << 41) - 1 && ci.nsec > 0,
	      "mlx5dv_get_clock_info");
	CHECK(mlx5dv_get_clock_info(a.ctx, NULL) == EINVAL, "mlx5dv_get_clock_info(NULL): EINVAL");

	/* One signaled WRITE A -> B; its completion's stamps. */
	uint64_t w0 = wall_ns();
	uint64_t r0 = raw_clock(a.ctx);
	struct ibv_sge s = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr w = { .wr_id = 7, .sg_list = &s, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *badw;
	w.wr.rdma.remote_addr = (uintptr_t)b.buf;
	w.wr.rdma.rkey = b.mr->rkey;
	if (ibv_post_send(a.qp, &w, &badw))
		die("ibv_post_send");
	struct ibv_poll_cq_attr pa = { 0 };
	long spins = 0;
	int r;
	while ((r = ibv_start_poll(a.cq, &pa)) == ENOENT)
		if (++spins > 2000000000L)
			die("no completion");
	if (r)
		die("ibv_start_poll");
	uint64_t ts = ibv_wc_read_completion_ts(a.cq);
	uint64_t wall = ibv_wc_read_completion_wallclock_ns(a.cq);
	CHECK(a.cq->status == IBV_WC_SUCCESS && a.cq->wr_id == 7, "the WRITE completed");
	ibv_end_poll(a.cq);
	uint64_t w1 = wall_ns();
	printf("raw clock before %llu, stamp %llu\n", (unsigned long long)r0,
	       (unsigned long long)ts);
	CHECK(ts >= r0, "the completion's stamp is not before the raw clock read before the post");
	/* The clock as read catches up with the stamp. */
	uint64_t r1;
	spins = 0;
	while ((r1 = raw_clock(a.ctx)) < ts && ++spins < 100000000L)
		;
	CHECK(r1 >= ts, "the raw clock reaches the completion's stamp");
	/* Wall time: within a second of the CLOCK_REALTIME readings around
	 * the WRITE (the clock info is the device clock as last read beside
	 * the wall clock). */
	CHECK(wall + SEC > w0 && wall < w1 + SEC, "the completion's wall time is when it happened");
	printf("wall clock before %llu, completion %llu, after %llu\n",
	       (unsigned long long)w0, (unsigned long long)wall, (unsigned long long)w1);
	if (!mlx5dv_get_clock_info(a.ctx, &ci)) {
		uint64_t h = mlx5dv_ts_to_ns(&ci, ts);
		uint64_t d = h > wall ? h - wall : wall - h;
		CHECK(d < 10000000ULL,
		      "the header's mlx5dv_ts_to_ns gives the library's wall time");
	}

	/* A CQ without timestamps has no timestamp readers (as libmlx5). */
	struct ibv_cq_init_attr_ex plain = { .cqe = 4, .wc_flags = IBV_WC_STANDARD_FLAGS };
	struct ibv_cq_ex *pc = ibv_create_cq_ex(a.ctx, &plain);
	CHECK(pc && !pc->read_completion_ts && !pc->read_completion_wallclock_ns,
	      "a CQ without timestamps has no timestamp readers");
	if (pc)
		ibv_destroy_cq(ibv_cq_ex_to_cq(pc));
	struct ibv_cq_init_attr_ex vlan = { .cqe = 4,
					    .wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_CVLAN };
	errno = 0;
	CHECK(!ibv_create_cq_ex(a.ctx, &vlan) && errno == EOPNOTSUPP,
	      "a field the driver does not report (CVLAN): EOPNOTSUPP");

	ibv_destroy_qp(a.qp);
	ibv_destroy_qp(b.qp);
	ibv_destroy_cq(ibv_cq_ex_to_cq(a.cq));
	ibv_destroy_cq(ibv_cq_ex_to_cq(b.cq));
	ibv_dereg_mr(a.mr);
	ibv_dereg_mr(b.mr);
	ibv_dealloc_pd(a.pd);
	ibv_dealloc_pd(b.pd);
	ibv_close_device(a.ctx);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("%s: %d failed\n", EXAMPLE, failed);
	return failed != 0;
}
