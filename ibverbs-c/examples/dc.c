/*
 * Dynamically Connected QPs through the C ABI, as a DC program writes
 * them against rdma-core's <infiniband/mlx5dv.h>: two ConnectX-6
 * device-model functions in this process, a DCT on B (its SRQ and CQ,
 * made by mlx5dv_create_qp, moved RESET -> INIT -> RTR, when it gets its
 * number), a DCI on A moved to RTS, and work requests through
 * ibv_wr_* with mlx5dv_wr_set_dc_addr: an RDMA WRITE, a SEND (inline) to
 * the DCT's SRQ, an RDMA READ and a fetch-and-add, each checked in
 * memory. mlx5dv_query_device gives the DCI stream limits; the DCI has
 * two streams, and a WR refused by the DCT (a wrong DC key) errs its
 * stream only: the other still works, and mlx5dv_dci_stream_id_reset
 * brings the errored one back. Bad use on the way gets errnos:
 * posting to a DC QP through ibv_post_send / ibv_post_recv, a DCT moved
 * with the wrong attributes, a DCT without an SRQ, a DCI WR without its
 * DC address, and the mlx5dv entry points handed NULL or nonsense.
 *
 * Prints "ok: ..." per check and "dc: N failed" at the end.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <infiniband/mlx5dv.h>

#include "mlx5_userspace.h"

#define EXAMPLE "dc"
#include "example_checks.h"

#define SIZE 4096
#define KEY 0x00dc00000000beefULL

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static void open_side(struct ibv_device *dev, struct side *s)
{
	s->ctx = ibv_open_device(dev);
	if (!s->ctx || !(s->pd = ibv_alloc_pd(s->ctx)) ||
	    !(s->cq = ibv_create_cq(s->ctx, 64, NULL, NULL, 0)))
		die("open");
	s->buf = calloc(1, SIZE);
	s->mr = ibv_reg_mr(s->pd, s->buf, SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			   IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
	if (!s->mr || ibv_query_gid(s->ctx, 1, 0, &s->gid))
		die("ibv_reg_mr / ibv_query_gid");
}

static struct ibv_qp *create_dc(struct side *s, struct ibv_srq *srq, int dct)
{
	struct ibv_qp_init_attr_ex a = {
		.send_cq = s->cq, .recv_cq = s->cq, .srq = srq,
		.qp_type = IBV_QPT_DRIVER, .pd = s->pd,
		.comp_mask = IBV_QP_INIT_ATTR_PD,
		.cap = { .max_send_wr = dct ? 0 : 16, .max_send_sge = dct ? 0 : 1,
			 .max_inline_data = dct ? 0 : 64 },
	};
	struct mlx5dv_qp_init_attr dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC };

	if (dct) {
		dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCT;
		dv.dc_init_attr.dct_access_key = KEY;
	} else {
		dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
		dv.comp_mask |= MLX5DV_QP_INIT_ATTR_MASK_DCI_STREAMS;
		dv.dc_init_attr.dci_streams.log_num_concurent = 1;
		dv.dc_init_attr.dci_streams.log_num_errored = 1;
		a.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		a.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND |
				   IBV_QP_EX_WITH_RDMA_READ |
				   IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
	}
	return mlx5dv_create_qp(s->ctx, &a, &dv);
}

static struct ibv_ah_attr av_to(struct side *peer)
{
	struct ibv_ah_attr ah = {
		.is_global = 1, .port_num = 1,
		.grh = { .dgid = peer->gid, .sgid_index = 0, .hop_limit = 64 },
	};
	return ah;
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device **list;
	int n;

	if (mlx5u_set_devices("emu:cx6,emu:cx6") ||
	    !(list = ibv_get_device_list(&n)) || n != 2)
		die("devices");
	open_side(list[0], &a);
	open_side(list[1], &b);

	/* mlx5dv entry points handed NULL or nonsense: errnos, no crash. */
	struct mlx5dv_port mport;
	struct mlx5dv_qp_init_attr bad_dv = { .comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC };
	struct ibv_qp_init_attr_ex bad_ex = { .qp_type = IBV_QPT_DRIVER, .pd = a.pd,
					      .comp_mask = IBV_QP_INIT_ATTR_PD,
					      .send_cq = a.cq, .recv_cq = a.cq };
	errno = 0;
	CHECK(!mlx5dv_create_qp(a.ctx, NULL, NULL) && errno == EINVAL, "mlx5dv_create_qp(NULL attributes): EINVAL");
	bad_dv.dc_init_attr.dc_type = 7;
	errno = 0;
	CHECK(!mlx5dv_create_qp(a.ctx, &bad_ex, &bad_dv) && errno == EINVAL, "a DC QP of no DC type: EINVAL");
	CHECK(!mlx5dv_qp_ex_from_ibv_qp_ex(NULL), "mlx5dv_qp_ex_from_ibv_qp_ex(NULL): NULL");
	errno = 0;
	CHECK(!mlx5dv_create_mkey(NULL) && errno == EINVAL, "mlx5dv_create_mkey(NULL): EINVAL");
	CHECK(mlx5dv_destroy_mkey(NULL) == EINVAL, "mlx5dv_destroy_mkey(NULL): EINVAL");
	CHECK(mlx5dv_query_device(NULL, NULL) == EINVAL && mlx5dv_query_device(a.ctx, NULL) == EINVAL,
	      "mlx5dv_query_device without a context or a struct: EINVAL");
	CHECK(mlx5dv_query_port(a.ctx, 9, &mport) == EINVAL && mlx5dv_query_port(NULL, 1, &mport) == EINVAL,
	      "mlx5dv_query_port of port 9 or no context: EINVAL");
	CHECK(!mlx5dv_query_port(a.ctx, 1, &mport) && mport.flags == 0,
	      "mlx5dv_query_port of port 1: no switchdev or multiport attributes");
	errno = 0;
	CHECK(!mlx5dv_create_cq(a.ctx, NULL, NULL) && errno == EINVAL, "mlx5dv_create_cq(NULL attributes): EINVAL");
	CHECK(mlx5dv_dci_stream_id_reset(NULL, 0) == EINVAL, "mlx5dv_dci_stream_id_reset(NULL): EINVAL");

	struct mlx5dv_context dvc = {
		.comp_mask = MLX5DV_CONTEXT_MASK_DCI_STREAMS | MLX5DV_CONTEXT_MASK_CQE_COMPRESION |
			     MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK,
	};
	CHECK(!mlx5dv_query_device(a.ctx, &dvc) &&
	      dvc.comp_mask == (MLX5DV_CONTEXT_MASK_DCI_STREAMS |
				MLX5DV_CONTEXT_MASK_CQE_COMPRESION |
				MLX5DV_CONTEXT_MASK_HCA_CORE_CLOCK) &&
	      dvc.dci_streams_caps.max_log_num_concurent >= 1 &&
	      dvc.dci_streams_caps.max_log_num_errored >= 1 && dvc.cqe_comp_caps.max_num == 0 &&
	      dvc.hca_core_clock != NULL,
	      "mlx5dv_query_device: DCI stream limits, no CQE compression, the clock's mapping");

	/* B: the DC target over an SRQ, with one receive posted. */
	struct ibv_srq_init_attr sa = { .attr = { .max_wr = 16, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(b.pd, &sa);
	if (!srq)
		die("ibv_create_srq");
	errno = 0;
	CHECK(!create_dc(&b, NULL, 1) && errno == EINVAL, "a DCT without an SRQ: EINVAL");
	struct ibv_qp *dct = create_dc(&b, srq, 1);
	if (!dct)
		die("mlx5dv_create_qp (DCT)");
	CHECK(dct->qp_type == IBV_QPT_DRIVER && dct->qp_num == 0,
	      "a DCT in RESET: IBV_QPT_DRIVER, no number yet");
	struct ibv_sge rs = { (uintptr_t)b.buf + 1024, 64, b.mr->lkey };
	struct ibv_recv_wr rw = { .wr_id = 77, .sg_list = &rs, .num_sge = 1 }, *bad_r;
	if (ibv_post_srq_recv(srq, &rw, &bad_r))
		die("ibv_post_srq_recv");
	CHECK(ibv_post_recv(dct, &rw, &bad_r) == EINVAL && bad_r == &rw,
	      "ibv_post_recv on a DCT: EINVAL");

	struct ibv_qp_attr qa = { .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(dct, &qa, IBV_QP_STATE) == EINVAL, "a DCT RESET -> RTR: EINVAL");
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE |
						      IBV_ACCESS_REMOTE_READ |
						      IBV_ACCESS_REMOTE_ATOMIC };
	CHECK(ibv_modify_qp(dct, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX) == EINVAL,
	      "a DCT to INIT without its access flags: EINVAL");
	if (ibv_modify_qp(dct, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
			  IBV_QP_ACCESS_FLAGS))
		die("DCT to INIT");
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				   .min_rnr_timer = 12, .ah_attr = av_to(&a) };
	if (ibv_modify_qp(dct, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
			  IBV_QP_MIN_RNR_TIMER))
		die("DCT to RTR");
	uint32_t dctn = dct->qp_num;
	CHECK(dctn != 0, "a DCT at RTR has its number (qp_num)");
	struct ibv_qp_init_attr qi;
	CHECK(!ibv_query_qp(dct, &qa, 0, &qi) && qa.qp_state == IBV_QPS_RTR &&
	      qi.srq == srq && qi.qp_type == IBV_QPT_DRIVER,
	      "ibv_query_qp of a DCT: RTR, its SRQ");
	CHECK(ibv_destroy_srq(srq) == EBUSY, "ibv_destroy_srq under a DCT: EBUSY");

	/* A: the DC initiator, to RTS as mlx5_ib moves a DCI. */
	struct ibv_qp *dci = create_dc(&a, NULL, 0);
	if (!dci)
		die("mlx5dv_create_qp (DCI)");
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				   .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(dci, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX |
			    IBV_QP_ACCESS_FLAGS) == EINVAL,
	      "a DCI takes no access flags: EINVAL");
	if (ibv_modify_qp(dci, &qa, IBV_QP_STATE | IBV_QP_PORT | IBV_QP_PKEY_INDEX))
		die("DCI to INIT");
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTR, .path_mtu = IBV_MTU_1024,
				   .ah_attr = av_to(&b) };
	if (ibv_modify_qp(dci, &qa, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU))
		die("DCI to RTR");
	qa = (struct ibv_qp_attr){ .qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7,
				   .rnr_retry = 7, .sq_psn = 0, .max_rd_atomic = 1 };
	if (ibv_modify_qp(dci, &qa, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
			  IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC))
		die("DCI to RTS");
	struct ibv_ah_attr aa = av_to(&b);
	struct ibv_ah *ah = ibv_create_ah(a.pd, &aa);
	if (!ah)
		die("ibv_create_ah");

	struct ibv_sge ss = { (uintptr_t)a.buf, 64, a.mr->lkey };
	struct ibv_send_wr sw = { .wr_id = 1, .sg_list = &ss, .num_sge = 1,
				  .opcode = IBV_WR_RDMA_WRITE,
				  .send_flags = IBV_SEND_SIGNALED }, *bad_s;
	sw.wr.rdma.remote_addr = (uintptr_t)b.buf;
	sw.wr.rdma.rkey = b.mr->rkey;
	CHECK(ibv_post_send(dci, &sw, &bad_s) == EINVAL && bad_s == &sw,
	      "ibv_post_send on a DCI (no DC address): EINVAL");
	CHECK(ibv_post_send(dct, &sw, &bad_s) == EINVAL, "ibv_post_send on a DCT: EINVAL");
	CHECK(!ibv_qp_to_qp_ex(dct), "a DCT has no ibv_qp_ex");

	struct ibv_qp_ex *qx = ibv_qp_to_qp_ex(dci);
	struct mlx5dv_qp_ex *dv = mlx5dv_qp_ex_from_ibv_qp_ex(qx);
	CHECK(qx && dv && dv->wr_set_dc_addr && dv->wr_set_dc_addr_stream,
	      "a DCI's mlx5dv_qp_ex has the DC address setters");

	/* A WR with no DC address: the batch fails, nothing is posted. */
	ibv_wr_start(qx);
	qx->wr_id = 9;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 64);
	CHECK(ibv_wr_complete(qx) == EINVAL, "a DCI WR without mlx5dv_wr_set_dc_addr: EINVAL");

	/* RDMA WRITE of 64 bytes to B, then a SEND of 16 inline bytes to
	 * the DCT's SRQ, in one batch. */
	for (int i = 0; i < 64; i++)
		a.buf[i] = (char)(0x40 + i);
	ibv_wr_start(qx);
	qx->wr_id = 1;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf);
	mlx5dv_wr_set_dc_addr(dv, ah, dctn, KEY);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 64);
	qx->wr_id = 2;
	ibv_wr_send(qx);
	mlx5dv_wr_set_dc_addr_stream(dv, ah, dctn, KEY, 0);
	ibv_wr_set_inline_data(qx, "dc-send-inline!", 16);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete of a WRITE and a SEND");
	struct ibv_wc w1 = poll_one(a.cq), w2 = poll_one(a.cq);
	CHECK(w1.status == IBV_WC_SUCCESS && w1.wr_id == 1 && w1.opcode == IBV_WC_RDMA_WRITE &&
	      w2.status == IBV_WC_SUCCESS && w2.wr_id == 2 && w2.opcode == IBV_WC_SEND,
	      "the DCI's WRITE and SEND completed");
	CHECK(!memcmp(b.buf, a.buf, 64), "the WRITE's 64 bytes arrived at B");
	struct ibv_wc r = poll_one(b.cq);
	CHECK(r.status == IBV_WC_SUCCESS && r.wr_id == 77 && r.opcode == IBV_WC_RECV &&
	      r.byte_len == 16 && r.qp_num == dctn,
	      "the DCT received the SEND (its SRQ's WR, qp_num the DCT's)");
	CHECK(!memcmp(b.buf + 1024, "dc-send-inline!", 16), "the SEND's bytes are in the SRQ's buffer");

	/* RDMA READ of B's first 64 bytes, and a fetch-and-add on B. */
	uint64_t *counter = (uint64_t *)(b.buf + 2048);
	*counter = 1000;
	ibv_wr_start(qx);
	qx->wr_id = 3;
	ibv_wr_rdma_read(qx, b.mr->rkey, (uintptr_t)b.buf);
	mlx5dv_wr_set_dc_addr(dv, ah, dctn, KEY);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf + 512, 64);
	qx->wr_id = 4;
	ibv_wr_atomic_fetch_add(qx, b.mr->rkey, (uintptr_t)counter, 5);
	mlx5dv_wr_set_dc_addr(dv, ah, dctn, KEY);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf + 1024, 8);
	CHECK(ibv_wr_complete(qx) == 0, "ibv_wr_complete of a READ and a fetch-and-add");
	w1 = poll_one(a.cq);
	w2 = poll_one(a.cq);
	CHECK(w1.status == IBV_WC_SUCCESS && w1.opcode == IBV_WC_RDMA_READ &&
	      w2.status == IBV_WC_SUCCESS && w2.opcode == IBV_WC_FETCH_ADD,
	      "the DCI's READ and fetch-and-add completed");
	CHECK(!memcmp(a.buf + 512, b.buf, 64), "the READ brought B's 64 bytes");
	CHECK(*(uint64_t *)(a.buf + 1024) == 1000 && *counter == 1005,
	      "the fetch-and-add read 1000 and left 1005");

	/* A wrong DC key on stream 0: the WR fails (the DCT counts a key
	 * violation); stream 1 still writes. */
	ibv_wr_start(qx);
	qx->wr_id = 5;
	qx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf);
	mlx5dv_wr_set_dc_addr_stream(dv, ah, dctn, KEY + 1, 0);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_complete(qx);
	w1 = poll_one(a.cq);
	CHECK(w1.wr_id == 5 && w1.status != IBV_WC_SUCCESS, "a WR with the wrong DC key fails");
	memset(a.buf + 3072, 0x5a, 32);
	ibv_wr_start(qx);
	qx->wr_id = 6;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf + 3072);
	mlx5dv_wr_set_dc_addr_stream(dv, ah, dctn, KEY, 1);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf + 3072, 32);
	CHECK(ibv_wr_complete(qx) == 0, "a WRITE on the other stream posted");
	w1 = poll_one(a.cq);
	CHECK(w1.wr_id == 6 && w1.status == IBV_WC_SUCCESS && !memcmp(b.buf + 3072, a.buf + 3072, 32),
	      "the other stream still writes (one errored stream of two allowed)");
	CHECK(mlx5dv_dci_stream_id_reset(dct, 0) == EINVAL, "a stream reset of a DCT: EINVAL");
	CHECK(mlx5dv_dci_stream_id_reset(dci, 1) != 0, "a stream not in error: the device refuses its reset");
	CHECK(mlx5dv_dci_stream_id_reset(dci, 0) == 0, "mlx5dv_dci_stream_id_reset of the errored stream");
	memset(a.buf + 3072, 0xa5, 32);
	ibv_wr_start(qx);
	qx->wr_id = 7;
	ibv_wr_rdma_write(qx, b.mr->rkey, (uintptr_t)b.buf + 3072);
	mlx5dv_wr_set_dc_addr_stream(dv, ah, dctn, KEY, 0);
	ibv_wr_set_sge(qx, a.mr->lkey, (uintptr_t)a.buf + 3072, 32);
	ibv_wr_complete(qx);
	w1 = poll_one(a.cq);
	CHECK(w1.wr_id == 7 && w1.status == IBV_WC_SUCCESS && !memcmp(b.buf + 3072, a.buf + 3072, 32),
	      "the reset stream writes again");

	CHECK(!ibv_destroy_qp(dct) && !ibv_destroy_srq(srq), "the DCT, then its SRQ, destroyed");
	CHECK(!ibv_destroy_ah(ah) && !ibv_destroy_qp(dci), "the AH and the DCI destroyed");
	CHECK(!ibv_dereg_mr(a.mr) && !ibv_dereg_mr(b.mr) && !ibv_destroy_cq(a.cq) &&
	      !ibv_destroy_cq(b.cq) && !ibv_dealloc_pd(a.pd) && !ibv_dealloc_pd(b.pd),
	      "MRs, CQs and PDs go");
	ibv_close_device(a.ctx);
	ibv_close_device(b.ctx);
	ibv_free_device_list(list);
	printf("dc: %d failed\n", failed);
	return failed != 0;
}
