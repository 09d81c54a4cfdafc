/*
 * SPDK-style embedding of the mlx5-userspace libibverbs.so.1: the program
 * names its devices itself (two device-model functions in this process,
 * cabled together), then uses plain verbs: PD, MR over its own heap
 * memory, a CQ with a completion channel, RC QPs moved to RTS over RoCE
 * v2 GIDs, an RDMA WRITE and a SEND with immediate, a completion event,
 * and checks the bytes that arrived.
 *
 * Build: cc -I ibverbs-c/include embed.c -L DIR -libverbs (DIR holds the
 * library as libibverbs.so); run with LD_LIBRARY_PATH=DIR.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mlx5_userspace.h"

#define SIZE 4096

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	char *buf;
	union ibv_gid gid;
};

static int die(const char *what)
{
	fprintf(stderr, "embed: %s: %s\n", what, strerror(errno));
	exit(1);
}

static void open_side(struct ibv_device *dev, struct side *s)
{
	struct ibv_qp_init_attr ia = {
		.qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16,
			 .max_send_sge = 1, .max_recv_sge = 1 },
	};

	s->ctx = ibv_open_device(dev);
	if (!s->ctx)
		die("ibv_open_device");
	s->pd = ibv_alloc_pd(s->ctx);
	if (!s->pd)
		die("ibv_alloc_pd");
	s->ch = ibv_create_comp_channel(s->ctx);
	if (!s->ch)
		die("ibv_create_comp_channel");
	s->cq = ibv_create_cq(s->ctx, 32, s, s->ch, 0);
	if (!s->cq)
		die("ibv_create_cq");
	s->buf = calloc(1, SIZE);
	s->mr = ibv_reg_mr(s->pd, s->buf, SIZE,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!s->mr)
		die("ibv_reg_mr");
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
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
		.qp_access_flags = IBV_ACCESS_REMOTE_WRITE,
	};

	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX |
			  IBV_QP_PORT | IBV_QP_ACCESS_FLAGS))
		die("INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qp->qp_num;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = 0;
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
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	if (ibv_modify_qp(s->qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT |
			  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			  IBV_QP_MAX_QP_RD_ATOMIC))
		die("RTS");
}

static struct ibv_wc wait_one(struct side *s)
{
	struct ibv_wc wc;
	int n;

	do {
		n = ibv_poll_cq(s->cq, 1, &wc);
	} while (n == 0);
	if (n < 0)
		die("ibv_poll_cq");
	if (wc.status != IBV_WC_SUCCESS) {
		fprintf(stderr, "embed: completion %s\n", ibv_wc_status_str(wc.status));
		exit(1);
	}
	return wc;
}

int main(void)
{
	struct side a = { 0 }, b = { 0 };
	struct ibv_device **list;
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	struct ibv_wc wc;
	int n, i;

	if (mlx5u_set_devices("emu,emu"))
		die("mlx5u_set_devices");
	list = ibv_get_device_list(&n);
	if (!list || n != 2)
		die("ibv_get_device_list");
	if (mlx5u_set_devices("emu") != EBUSY)
		die("mlx5u_set_devices after the list was read");
	open_side(list[0], &a);
	open_side(list[1], &b);
	connect_to(&a, &b);
	connect_to(&b, &a);

	for (i = 0; i < SIZE; i++)
		a.buf[i] = (char)(i * 7 + 1);
	/* RDMA WRITE of the whole buffer into b's. */
	struct ibv_sge sge = { (uintptr_t)a.buf, SIZE, a.mr->lkey };
	struct ibv_send_wr wr = {
		.wr_id = 1, .sg_list = &sge, .num_sge = 1,
		.opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED,
	}, *bad;
	wr.wr.rdma.remote_addr = (uintptr_t)b.buf;
	wr.wr.rdma.rkey = b.mr->rkey;
	if (ibv_post_send(a.qp, &wr, &bad))
		die("ibv_post_send WRITE");
	wc = wait_one(&a);
	if (wc.wr_id != 1 || wc.opcode != IBV_WC_RDMA_WRITE)
		die("WRITE completion");
	if (memcmp(a.buf, b.buf, SIZE)) {
		fprintf(stderr, "embed: RDMA WRITE bytes differ\n");
		return 1;
	}

	/* SEND with immediate, b waiting on its completion channel. */
	struct ibv_sge rsge = { (uintptr_t)b.buf, 64, b.mr->lkey };
	struct ibv_recv_wr rwr = { .wr_id = 7, .sg_list = &rsge, .num_sge = 1 }, *rbad;
	if (ibv_post_recv(b.qp, &rwr, &rbad))
		die("ibv_post_recv");
	if (ibv_req_notify_cq(b.cq, 0))
		die("ibv_req_notify_cq");
	memcpy(a.buf, "hello from embed.c", 19);
	sge.length = 19;
	wr.wr_id = 2;
	wr.opcode = IBV_WR_SEND_WITH_IMM;
	wr.imm_data = htobe32(0x1234abcd);
	if (ibv_post_send(a.qp, &wr, &bad))
		die("ibv_post_send SEND");
	wait_one(&a);
	if (ibv_get_cq_event(b.ch, &ev_cq, &ev_ctx) || ev_cq != b.cq || ev_ctx != &b)
		die("ibv_get_cq_event");
	ibv_ack_cq_events(ev_cq, 1);
	wc = wait_one(&b);
	if (wc.wr_id != 7 || wc.opcode != IBV_WC_RECV || !(wc.wc_flags & IBV_WC_WITH_IMM) ||
	    be32toh(wc.imm_data) != 0x1234abcd || wc.byte_len != 19 ||
	    strcmp(b.buf, "hello from embed.c")) {
		fprintf(stderr, "embed: SEND arrived wrong\n");
		return 1;
	}

	struct side *sides[2] = { &a, &b };
	for (i = 0; i < 2; i++) {
		struct side *s = sides[i];
		if (ibv_destroy_qp(s->qp) || ibv_dereg_mr(s->mr) || ibv_destroy_cq(s->cq) ||
		    ibv_destroy_comp_channel(s->ch) || ibv_dealloc_pd(s->pd) ||
		    ibv_close_device(s->ctx))
			die("teardown");
		free(s->buf);
	}
	ibv_free_device_list(list);
	printf("embed: ok (RDMA WRITE %d bytes, SEND with immediate, a completion event)\n", SIZE);
	return 0;
}
