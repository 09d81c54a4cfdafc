/*
 * mlx5dv indirect mkeys through the C ABI, as a program writes them
 * against rdma-core's <infiniband/mlx5dv.h>: two device-model functions
 * in this process, an RC QP on A (plain verbs) and one on B made by
 * mlx5dv_create_qp with the mkey builders; B configures an indirect mkey
 * by UMR work requests (mlx5dv_wr_mr_list, then mlx5dv_wr_mkey_configure
 * with its access and interleaved-layout setters), and A WRITEs and
 * READs through its rkey; every byte is checked where the layout puts
 * it. Bad use gets errnos: a setter without a configuration, a
 * configuration without IBV_SEND_INLINE, another WR before its setters,
 * a key without INDIRECT, a key destroyed twice.
 *
 * Prints "ok: ..." per check and "mkey: N failed" at the end.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

#include "mlx5_userspace.h"

#define EXAMPLE "mkey"
#include "example_checks.h"

#define SIZE 16384

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	unsigned char *buf;
	union ibv_gid gid;
};

static void open_side(struct ibv_device *dev, struct side *s, int umr)
{
	struct ibv_qp_init_attr_ex a = {
		.qp_type = IBV_QPT_RC,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.cap = { .max_send_wr = 16, .max_recv_wr = 4, .max_send_sge = 1,
			 .max_recv_sge = 1, .max_inline_data = 512 },
	};
	struct mlx5dv_qp_init_attr dv = {
		.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_SEND_OPS_FLAGS,
		.send_ops_flags = MLX5DV_QP_EX_WITH_MKEY_CONFIGURE | MLX5DV_QP_EX_WITH_MR_LIST |
				  MLX5DV_QP_EX_WITH_MR_INTERLEAVED,
	};

	s->ctx = ibv_open_device(dev);
	if (!s->ctx || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0)))
		die("open");
	s->buf = calloc(1, SIZE);
	s->mr = ibv_reg_mr(s->pd, s->buf, SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ);
	if (!s->mr || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_reg_mr / ibv_query_gid");
	a.send_cq = a.recv_cq = s->cq;
	a.pd = s->pd;
	s->qp = umr ? mlx5dv_create_qp(s->ctx, &a, &dv) : ibv_create_qp_ex(s->ctx, &a);
	if (!s->qp)
		die("create QP");
}

static void connect_to(struct side *s, struct side *peer)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ,
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

/* A's one WR through B's key (zero-based), signaled; its status. */
static int a_does(struct side *a, enum ibv_wr_opcode op, uint32_t rkey, uint64_t raddr,
		  uint32_t at, uint32_t len)
{
	struct ibv_sge s = { (uintptr_t)a->buf + at, len, a->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 100, .sg_list = &s, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED }, *bad;

	w.wr.rdma.remote_addr = raddr;
	w.wr.rdma.rkey = rkey;
	if (ibv_post_send(a->qp, &w, &bad))
		die("ibv_post_send");
	return poll_one(a->cq).status;
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device **list;
	int n, i;

	if (mlx5u_set_devices("emu,emu") || !(list = ibv_get_device_list(&n)) || n != 2)
		die("devices");
	open_side(list[0], &a, 0);
	open_side(list[1], &b, 1);
	connect_to(&a, &b);
	connect_to(&b, &a);

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(b.qp);
	struct mlx5dv_qp_ex *dv = mlx5dv_qp_ex_from_ibv_qp_ex(qx);
	struct mlx5dv_qp_ex *plain = mlx5dv_qp_ex_from_ibv_qp_ex(ibv_qp_to_qp_ex(a.qp));
	CHECK(dv && dv->wr_mr_list && dv->wr_mkey_configure && dv->wr_set_mkey_layout_interleaved,
	      "a QP made with the mkey send operations has their builders");
	CHECK(plain && !plain->wr_mr_list && !plain->wr_mkey_configure,
	      "a plain verbs QP has none");

	struct mlx5dv_mkey_init_attr ka = { .pd = b.pd, .create_flags = 0, .max_entries = 4 };
	errno = 0;
	CHECK(!mlx5dv_create_mkey(&ka) && errno, "a key without MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT: refused");
	ka.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT;
	struct mlx5dv_mkey *k = mlx5dv_create_mkey(&ka);
	if (!k)
		die("mlx5dv_create_mkey");
	CHECK(k->lkey == k->rkey && k->lkey != 0, "an indirect mkey (lkey = rkey)");
	CHECK(ibv_dealloc_pd(b.pd) == EBUSY, "its PD is busy while it lives");

	/* Bad use first: each batch fails whole. */
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_set_mkey_access_flags(dv, IBV_ACCESS_REMOTE_WRITE);
	CHECK(ibv_wr_complete(qx) == EINVAL, "a setter without mlx5dv_wr_mkey_configure: EINVAL");
	ibv_wr_start(qx);
	qx->wr_flags = IBV_SEND_SIGNALED;
	mlx5dv_wr_mkey_configure(dv, k, 1, NULL);
	mlx5dv_wr_set_mkey_access_flags(dv, IBV_ACCESS_REMOTE_WRITE);
	CHECK(ibv_wr_complete(qx) == EINVAL, "a configuration without IBV_SEND_INLINE: EINVAL");
	ibv_wr_start(qx);
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mkey_configure(dv, k, 2, NULL);
	mlx5dv_wr_set_mkey_access_flags(dv, IBV_ACCESS_REMOTE_WRITE);
	ibv_wr_send(qx);
	ibv_wr_set_inline_data(qx, "x", 1);
	CHECK(ibv_wr_complete(qx) == EINVAL, "another WR before the configuration's setters: EINVAL");

	/* A KLM list: 32 bytes at B's 0x100, then 32 at B's 0x1000. */
	struct ibv_sge kl[2] = {
		{ (uintptr_t)b.buf + 0x100, 32, b.mr->lkey },
		{ (uintptr_t)b.buf + 0x1000, 32, b.mr->lkey },
	};
	ibv_wr_start(qx);
	qx->wr_id = 7;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(dv, k, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			  IBV_ACCESS_REMOTE_READ, 2, kl);
	CHECK(ibv_wr_complete(qx) == 0, "mlx5dv_wr_mr_list posted");
	struct ibv_wc w = poll_one(b.cq);
	CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 7 && w.opcode == (enum ibv_wc_opcode)MLX5DV_WC_UMR,
	      "its UMR completed (MLX5DV_WC_UMR)");
	for (i = 0; i < 64; i++)
		a.buf[i] = (unsigned char)(0x80 + i);
	CHECK(a_does(&a, IBV_WR_RDMA_WRITE, k->rkey, 0, 0, 64) == IBV_WC_SUCCESS,
	      "A WRITEs 64 bytes through the key");
	CHECK(!memcmp(b.buf + 0x100, a.buf, 32) && !memcmp(b.buf + 0x1000, a.buf + 32, 32),
	      "they landed split over the list's two pieces");

	/* An interleaved layout, by configure and two setters: per
	 * repetition 8 bytes of B's 0x2000 area (stride 16) then 4 of its
	 * 0x3000 area (stride 4); two repetitions, 24 bytes. */
	for (i = 0; i < 64; i++) {
		b.buf[0x2000 + i] = (unsigned char)i;
		b.buf[0x3000 + i] = (unsigned char)(0xc0 + i);
	}
	struct mlx5dv_mr_interleaved il[2] = {
		{ (uintptr_t)b.buf + 0x2000, 8, 8, b.mr->lkey },
		{ (uintptr_t)b.buf + 0x3000, 4, 0, b.mr->lkey },
	};
	ibv_wr_start(qx);
	qx->wr_id = 8;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mkey_configure(dv, k, 2, NULL);
	mlx5dv_wr_set_mkey_access_flags(dv, IBV_ACCESS_REMOTE_READ);
	mlx5dv_wr_set_mkey_layout_interleaved(dv, 2, 2, il);
	CHECK(ibv_wr_complete(qx) == 0, "mlx5dv_wr_mkey_configure with two setters posted");
	w = poll_one(b.cq);
	CHECK(w.status == IBV_WC_SUCCESS && w.wr_id == 8, "its UMR completed");
	memset(a.buf + 0x400, 0, 64);
	CHECK(a_does(&a, IBV_WR_RDMA_READ, k->rkey, 0, 0x400, 24) == IBV_WC_SUCCESS,
	      "A READs the key's 24 bytes");
	unsigned char want[24];
	memcpy(want, b.buf + 0x2000, 8);
	memcpy(want + 8, b.buf + 0x3000, 4);
	memcpy(want + 12, b.buf + 0x2010, 8);
	memcpy(want + 20, b.buf + 0x3004, 4);
	CHECK(!memcmp(a.buf + 0x400, want, 24), "in the interleaved order");
	/* A key made for remote invalidation, configured, then invalidated by
	 * A's SEND with invalidate (a zero-length receive on B, as rdma-core's
	 * test_mkey_remote_invalidate posts it). */
	ka.create_flags = MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT |
			  MLX5DV_MKEY_INIT_ATTR_FLAGS_REMOTE_INVALIDATE;
	struct mlx5dv_mkey *ki = mlx5dv_create_mkey(&ka);
	CHECK(ki != NULL, "a key that may be invalidated remotely");
	ibv_wr_start(qx);
	qx->wr_id = 9;
	qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
	mlx5dv_wr_mr_list(dv, ki, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE, 2, kl);
	CHECK(ibv_wr_complete(qx) == 0 && poll_one(b.cq).status == IBV_WC_SUCCESS,
	      "configured by mlx5dv_wr_mr_list");
	/* The receive the SEND takes scatters through the very key it
	 * invalidates (rdma-core's test leaves one so); a zero-length one
	 * follows. */
	struct ibv_sge rk = { 0, 16, ki->lkey }, rz = { 0, 0, ki->lkey };
	struct ibv_recv_wr rw2 = { .wr_id = 11, .sg_list = &rz, .num_sge = 1 };
	struct ibv_recv_wr rw = { .wr_id = 10, .sg_list = &rk, .num_sge = 1, .next = &rw2 }, *bad_r;
	CHECK(!ibv_post_recv(b.qp, &rw, &bad_r), "B posts a receive through the key, then a zero-length one");
	struct ibv_sge sz = { 0, 0, a.mr->lkey };
	struct ibv_send_wr inv = { .wr_id = 12, .sg_list = &sz, .num_sge = 1,
				   .opcode = IBV_WR_SEND_WITH_INV,
				   .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	inv.invalidate_rkey = ki->rkey;
	CHECK(!ibv_post_send(a.qp, &inv, &bad_s), "A sends with invalidate of B's key");
	w = poll_one(a.cq);
	printf("A: status %d\n", w.status);
	w = poll_one(b.cq);
	printf("B: status %d vendor %u flags %#x inv %#x\n", w.status, w.vendor_err, w.wc_flags, w.invalidated_rkey);
	CHECK(w.status == IBV_WC_SUCCESS && (w.wc_flags & IBV_WC_WITH_INV) &&
	      w.invalidated_rkey == ki->rkey,
	      "B's receive names the invalidated key");
	CHECK(!mlx5dv_destroy_mkey(ki), "that key destroyed");

	/* Last of A's WRs: an error moves its QP to ERR. */
	CHECK(a_does(&a, IBV_WR_RDMA_WRITE, k->rkey, 0, 0, 8) != IBV_WC_SUCCESS,
	      "a WRITE to the key, now read-only, fails");

	CHECK(!mlx5dv_destroy_mkey(k), "the key destroyed");
	errno = 0;
	CHECK(mlx5dv_destroy_mkey(k) == EINVAL, "destroyed twice: EINVAL");
	CHECK(!ibv_destroy_qp(a.qp) && !ibv_destroy_qp(b.qp), "the QPs destroyed");
	CHECK(!ibv_dereg_mr(a.mr) && !ibv_dereg_mr(b.mr), "the MRs deregistered");
	CHECK(!ibv_destroy_cq(a.cq) && !ibv_destroy_cq(b.cq), "the CQs destroyed");
	CHECK(!ibv_dealloc_pd(a.pd), "A's PD deallocated");
	CHECK(!ibv_dealloc_pd(b.pd), "B's PD (its key's) deallocated");
	ibv_close_device(a.ctx);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("mkey: %d failed\n", failed);
	return failed != 0;
}
