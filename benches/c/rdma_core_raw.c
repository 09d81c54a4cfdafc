/*
 * rdma-core's raw packet send path, timed without a NIC (issue 26).
 *
 * libmlx5 of rdma-core 44.0 (Debian 12's 44.0-2), built from source by
 * the team's rdma-core-bench reference tool (its build.sh, outside this
 * repository; its cache is ~/.cache/rdma-core-bench), is linked in as its
 * objects (providers/mlx5/ *.o) and its libibverbs.so.1.  An
 * IBV_QPT_RAW_PACKET QP is made by the provider's own functions
 * (mlx5_alloc_pd, mlx5_reg_mr, mlx5_create_cq, mlx5_create_qp,
 * mlx5_create_qp_ex, mlx5_modify_qp RESET->INIT->RTR->RTS, mlx5_query_port);
 * only the kernel is faked: the ibv_cmd_* calls those make are defined
 * below (the linker takes these over libibverbs' own), and the
 * mlx5_context is filled the way mlx5_set_context() leaves it for a
 * ConnectX-4 Lx on an Ethernet port: eth_min_inline_size 18
 * (MLX5_ETH_L2_INLINE_HEADER_SIZE), IBV_DEVICE_RAW_IP_CSUM in the cached
 * device caps, the port's link layer Ethernet (through mlx5_query_port),
 * one ordinary page standing in for the UAR.  The UAR being memory, the
 * cases ring the doorbell only (ctx->prefer_bf = 0, what
 * MLX5_POST_SEND_PREFER_BF=0 does), as the driver's posts to the model's
 * BAR do.
 *
 * Timed: ibv_post_send of a linked list of N WRs (N = 1, 8, 32), each
 * IBV_WR_SEND of one 64-byte frame by one SGE with IBV_SEND_IP_CSUM,
 * IBV_SEND_SIGNALED on the last only; and the same burst through
 * ibv_wr_start / ibv_wr_send / ibv_wr_set_sge / ibv_wr_complete.  libmlx5
 * copies the frame's first 18 bytes into the Ethernet segment and points
 * one data segment at the other 46: one 64-byte WQE per frame.  Beside
 * them, for scale, ibv_post_send of N RDMA WRITEs (64 B, one SGE, the last
 * signaled) on an RC QP made the same way.
 *
 * Completions are emulated: after each burst sq.tail = sq.head (one store,
 * inside the timed loop), as the reference harness does.
 *
 * Output: one JSON object per case on stdout; ns_per_op is per packet (WR),
 * the median of the rounds; min the fastest round (on a loaded machine the
 * rounds a preemption fell into stretch the median).
 */
#define _GNU_SOURCE
#include <config.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>
#include <infiniband/driver.h>
#include "mlx5.h"
#include "mlx5-abi.h"
#include "wqe.h"

/* ------------------------------------------------------------------ */
/* Fake kernel                                                         */
/* ------------------------------------------------------------------ */
static uint32_t next_handle = 1;
static uint32_t next_qpn = 0x100;

int ibv_cmd_alloc_pd(struct ibv_context *context, struct ibv_pd *pd,
		     struct ibv_alloc_pd *cmd, size_t cmd_size,
		     struct ib_uverbs_alloc_pd_resp *resp, size_t resp_size)
{
	struct mlx5_alloc_pd_resp *r =
		container_of(resp, struct mlx5_alloc_pd_resp, ibv_resp);

	pd->context = context;
	pd->handle = next_handle++;
	r->ibv_resp.pd_handle = pd->handle;
	r->pdn = pd->handle;
	return 0;
}

int ibv_cmd_reg_mr(struct ibv_pd *pd, void *addr, size_t length,
		   uint64_t hca_va, int access, struct verbs_mr *vmr,
		   struct ibv_reg_mr *cmd, size_t cmd_size,
		   struct ib_uverbs_reg_mr_resp *resp, size_t resp_size)
{
	vmr->ibv_mr.context = pd->context;
	vmr->ibv_mr.pd = pd;
	vmr->ibv_mr.addr = addr;
	vmr->ibv_mr.length = length;
	vmr->ibv_mr.handle = next_handle++;
	vmr->ibv_mr.lkey = 0x1000 + vmr->ibv_mr.handle;
	vmr->ibv_mr.rkey = 0x2000 + vmr->ibv_mr.handle;
	vmr->mr_type = IBV_MR_TYPE_MR;
	return 0;
}

int ibv_cmd_create_cq_ex(struct ibv_context *context,
			 const struct ibv_cq_init_attr_ex *cq_attr,
			 struct verbs_cq *cq, struct ibv_create_cq_ex *cmd,
			 size_t cmd_size, struct ib_uverbs_ex_create_cq_resp *resp,
			 size_t resp_size, uint32_t cmd_flags)
{
	struct mlx5_create_cq_ex_resp *r =
		container_of(resp, struct mlx5_create_cq_ex_resp, ibv_resp);

	cq->cq.context = context;
	cq->cq.channel = cq_attr->channel;
	cq->cq.cq_context = cq_attr->cq_context;
	cq->cq.cqe = cq_attr->cqe;
	cq->cq.handle = next_handle++;
	pthread_mutex_init(&cq->cq.mutex, NULL);
	pthread_cond_init(&cq->cq.cond, NULL);
	r->drv_payload.cqn = cq->cq.handle;
	return 0;
}

/* bfreg 1: the first low-latency (dedicated, lock-free) BlueFlame register */
#define FAKE_BFREG_INDEX 1

/*
 * CREATE_QP: mlx5_ib answers a raw packet QP with the numbers of the SQ,
 * RQ, TIS and TIR it made (the QP number being the SQ's); libmlx5 keeps
 * them, none is read on the send path.
 */
int ibv_cmd_create_qp_ex(struct ibv_context *context, struct verbs_qp *vqp,
			 struct ibv_qp_init_attr_ex *attr,
			 struct ibv_create_qp *cmd, size_t cmd_size,
			 struct ib_uverbs_create_qp_resp *resp, size_t resp_size)
{
	struct mlx5_create_qp_resp *r =
		container_of(resp, struct mlx5_create_qp_resp, ibv_resp);
	struct ibv_qp *qp = &vqp->qp;

	qp->context = context;
	qp->qp_context = attr->qp_context;
	qp->pd = attr->pd;
	qp->send_cq = attr->send_cq;
	qp->recv_cq = attr->recv_cq;
	qp->srq = attr->srq;
	qp->qp_type = attr->qp_type;
	qp->state = IBV_QPS_RESET;
	qp->events_completed = 0;
	qp->handle = next_handle++;
	qp->qp_num = next_qpn++;
	pthread_mutex_init(&qp->mutex, NULL);
	pthread_cond_init(&qp->cond, NULL);
	vqp->comp_mask = 0;
	r->drv_payload.bfreg_index = FAKE_BFREG_INDEX;
	if (attr->qp_type == IBV_QPT_RAW_PACKET) {
		r->drv_payload.comp_mask = MLX5_IB_CREATE_QP_RESP_MASK_TIRN |
			MLX5_IB_CREATE_QP_RESP_MASK_TISN |
			MLX5_IB_CREATE_QP_RESP_MASK_RQN |
			MLX5_IB_CREATE_QP_RESP_MASK_SQN;
		r->drv_payload.sqn = qp->qp_num;
		r->drv_payload.rqn = qp->qp_num + 0x1000;
		r->drv_payload.tisn = qp->qp_num + 0x2000;
		r->drv_payload.tirn = qp->qp_num + 0x3000;
	}
	return 0;
}

int ibv_cmd_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
		      int attr_mask, struct ibv_modify_qp *cmd, size_t cmd_size)
{
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
}

int ibv_cmd_modify_qp_ex(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int attr_mask, struct ibv_modify_qp_ex *cmd,
			 size_t cmd_size, struct ib_uverbs_ex_modify_qp_resp *resp,
			 size_t resp_size)
{
	return ibv_cmd_modify_qp(qp, attr, attr_mask, NULL, 0);
}

/* QUERY_PORT: port 1 of a ConnectX-4 Lx, Ethernet, up */
int ibv_cmd_query_port(struct ibv_context *context, uint8_t port_num,
		       struct ibv_port_attr *port_attr,
		       struct ibv_query_port *cmd, size_t cmd_size)
{
	if (port_num != 1)
		return EINVAL;
	memset(port_attr, 0, sizeof(*port_attr));
	port_attr->state = IBV_PORT_ACTIVE;
	port_attr->max_mtu = IBV_MTU_4096;
	port_attr->active_mtu = IBV_MTU_1024;
	port_attr->gid_tbl_len = 256;
	port_attr->pkey_tbl_len = 1;
	port_attr->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

/* ------------------------------------------------------------------ */
/* Context: what mlx5_alloc_context()/mlx5_set_context() would leave.  */
/* ------------------------------------------------------------------ */
static void *uar_page;

static struct mlx5_context *make_context(void)
{
	long psz = sysconf(_SC_PAGESIZE);
	struct mlx5_device *mdev = calloc(1, sizeof(*mdev));
	struct mlx5_context *ctx = calloc(1, sizeof(*ctx));
	struct ibv_port_attr pa;
	int i, nbf = 4;	/* one UAR: bfregs 0..3 (0 = no BF, 1 = low latency) */

	if (!mdev || !ctx)
		abort();
	mdev->page_size = psz;
	mdev->driver_abi_ver = 1;
	ctx->ibv_ctx.context.device = &mdev->verbs_dev.device;
	ctx->ibv_ctx.context.cmd_fd = -1;
	ctx->ibv_ctx.context.async_fd = -1;
	pthread_mutex_init(&ctx->ibv_ctx.context.mutex, NULL);

	/* the verbs_context_ops the data-path wrappers dispatch through */
	ctx->ibv_ctx.context.ops.post_send = mlx5_post_send;
	ctx->ibv_ctx.context.ops.post_recv = mlx5_post_recv;
	ctx->ibv_ctx.context.ops.poll_cq = mlx5_poll_cq_v1;
	ctx->ibv_ctx.context.ops.req_notify_cq = mlx5_arm_cq;

	/* a ConnectX-4 Lx's alloc_ucontext response */
	ctx->max_num_qps = 1 << 18;
	ctx->bf_reg_size = 512;
	ctx->cache_line_size = 64;
	ctx->max_sq_desc_sz = 512;
	ctx->max_rq_desc_sz = 512;
	ctx->max_send_wqebb = 1 << 15;
	ctx->num_ports = 1;
	ctx->max_recv_wr = 1 << 15;
	ctx->max_srq_recv_wr = 1 << 15;
	ctx->cqe_version = 1;
	ctx->num_uars_per_page = 1;
	ctx->dump_fill_mkey = MLX5_INVALID_LKEY;
	ctx->dump_fill_mkey_be = htobe32(MLX5_INVALID_LKEY);
	/*
	 * eth_min_inline = MLX5_USER_INLINE_MODE_L2 (a ConnectX-4 Lx's
	 * vport min inline mode): the L2 header goes into the WQE.
	 */
	ctx->eth_min_inline_size = MLX5_ETH_L2_INLINE_HEADER_SIZE;
	ctx->atomic_cap = IBV_ATOMIC_HCA;
	/* mlx5_query_device_ctx(): the kernel's device_cap_flags */
	ctx->cached_device_cap_flags = IBV_DEVICE_RAW_IP_CSUM |
				       IBV_DEVICE_UD_IP_CSUM;
	list_head_init(&ctx->dyn_uar_bf_list);
	list_head_init(&ctx->dyn_uar_qp_shared_list);
	list_head_init(&ctx->dyn_uar_qp_dedicated_list);
	pthread_mutex_init(&ctx->qp_table_mutex, NULL);
	pthread_mutex_init(&ctx->srq_table_mutex, NULL);
	pthread_mutex_init(&ctx->uidx_table_mutex, NULL);
	pthread_mutex_init(&ctx->mkey_table_mutex, NULL);
	pthread_mutex_init(&ctx->dyn_bfregs_mutex, NULL);
	pthread_mutex_init(&ctx->crypto_login_mutex, NULL);
	list_head_init(&ctx->dbr_available_pages);
	cl_qmap_init(&ctx->dbr_map);
	pthread_mutex_init(&ctx->dbr_map_mutex, NULL);
	ctx->prefer_bf = 0;	/* MLX5_POST_SEND_PREFER_BF=0: doorbell only */
	ctx->shut_up_bf = 0;
	ctx->tot_uuars = nbf;
	ctx->low_lat_uuars = 1;
	ctx->bfs = calloc(nbf, sizeof(*ctx->bfs));
	if (!ctx->bfs)
		abort();
	ctx->flags |= MLX5_CTX_FLAGS_NO_KERN_DYN_UAR;
	/* ordinary memory standing in for the UAR page */
	if (posix_memalign(&uar_page, psz, psz))
		abort();
	memset(uar_page, 0, psz);
	ctx->uar[0].reg = uar_page;
	ctx->uar[0].type = MLX5_UAR_TYPE_REGULAR;
	for (i = 0; i < nbf; i++) {
		struct mlx5_bf *bf = &ctx->bfs[i];

		bf->reg = (char *)uar_page + MLX5_BF_OFFSET + i * ctx->bf_reg_size;
		bf->need_lock = (i == 0 || i > ctx->low_lat_uuars);
		mlx5_spinlock_init(&bf->lock, bf->need_lock);
		bf->offset = 0;
		if (i)
			bf->buf_size = ctx->bf_reg_size / 2;
		bf->uuarn = i;
	}
	ctx->stall_enable = 0;
	ctx->dbg_fp = stderr;

	/* mlx5_set_context(): each port's link layer, by QUERY_PORT */
	for (i = 0; i < ctx->num_ports; i++) {
		memset(&pa, 0, sizeof(pa));
		if (!mlx5_query_port(&ctx->ibv_ctx.context, i + 1, &pa)) {
			ctx->cached_link_layer[i] = pa.link_layer;
			ctx->cached_port_flags[i] = pa.flags;
		}
	}
	return ctx;
}

/* ------------------------------------------------------------------ */
/* Objects                                                             */
/* ------------------------------------------------------------------ */
/*
 * Send rings of the same size as the driver's in raw_eth.rs: the raw packet
 * QPs 2048 WQEBBs (128 KiB, one 64-byte WQE per frame, as the driver's raw
 * QP with log_sq_bbs 11); the RC QP 512 (32 KiB: the driver's RC rig
 * rewinds its ring every 512 WQEs).  libmlx5 sizes an RC ring for its
 * largest WQE (192 B with the default ops, atomics and binds included), so
 * 128 WRs give 512 blocks; a 64-byte WRITE takes one.
 */
#define SQ_DEPTH 2048
#define RC_SQ_WRS 128
#define RC_SQ_BBS 512
#define CQ_DEPTH 256
#define FRAME 64
#define MAXB 32

struct objs {
	struct mlx5_context *ctx;
	struct ibv_context *ibctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *cq;
	struct ibv_qp *raw;	/* ibv_post_send */
	struct ibv_qp *rawx;	/* ibv_wr_* */
	struct ibv_qp *rc;	/* RDMA WRITE, for scale */
	char *buf;
};

static void modify(struct ibv_qp *qp, struct ibv_qp_attr *a, int mask)
{
	if (mlx5_modify_qp(qp, a, mask)) {
		fprintf(stderr, "mlx5_modify_qp to %d failed\n", a->qp_state);
		abort();
	}
}

/* What mlx5_ib accepts for a raw packet QP: INIT with the port, then
 * RTR and RTS by state alone. */
static void raw_to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PORT);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	modify(qp, &a, IBV_QP_STATE);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	modify(qp, &a, IBV_QP_STATE);
	if (qp->state != IBV_QPS_RTS)
		abort();
}

static void rc_to_rts(struct ibv_qp *qp)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
	       IBV_QP_ACCESS_FLAGS);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = qp->qp_num;
	a.ah_attr.port_num = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.hop_limit = 64;
	a.min_rnr_timer = 12;
	a.max_dest_rd_atomic = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
	       IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
	       IBV_QP_MIN_RNR_TIMER);
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	modify(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
	       IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC);
	if (qp->state != IBV_QPS_RTS)
		abort();
}

static struct ibv_qp *make_qp(struct objs *o, enum ibv_qp_type type, int ex,
			      uint32_t max_send_wr)
{
	struct ibv_qp_init_attr_ex ax;
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof(a));
	a.send_cq = o->cq;
	a.recv_cq = o->cq;
	a.qp_type = type;
	a.cap.max_send_wr = max_send_wr;
	a.cap.max_recv_wr = 16;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	if (ex) {
		memset(&ax, 0, sizeof(ax));
		memcpy(&ax, &a, sizeof(a));
		ax.pd = o->pd;
		ax.comp_mask = IBV_QP_INIT_ATTR_PD |
			       IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
		ax.send_ops_flags = IBV_QP_EX_WITH_SEND;
		qp = mlx5_create_qp_ex(o->ibctx, &ax);
	} else {
		qp = mlx5_create_qp(o->pd, &a);
	}
	if (!qp) {
		perror(ex ? "mlx5_create_qp_ex" : "mlx5_create_qp");
		abort();
	}
	return qp;
}

static void make_objs(struct objs *o, int single_threaded)
{
	int i;

	/* what mlx5_init_context() sets from MLX5_SINGLE_THREADED */
	mlx5_single_threaded = single_threaded;

	o->ctx = make_context();
	o->ibctx = &o->ctx->ibv_ctx.context;
	o->pd = mlx5_alloc_pd(o->ibctx);
	if (!o->pd)
		abort();
	if (posix_memalign((void **)&o->buf, 4096, 1 << 16))
		abort();
	memset(o->buf, 0, 1 << 16);
	/* 32 frames: Ethernet (to 02:00:00:00:00:01, IPv4), IPv4, UDP, payload */
	for (i = 0; i < MAXB; i++) {
		unsigned char *f = (unsigned char *)o->buf + i * FRAME;

		memcpy(f, "\x02\x00\x00\x00\x00\x01\x02\x00\x00\x00\x00\x02"
			  "\x08\x00\x45\x00", 16);
		memset(f + 16, 0x5a + i, FRAME - 16);
	}
	o->mr = mlx5_reg_mr(o->pd, o->buf, 1 << 16, (uintptr_t)o->buf,
			    IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	if (!o->mr)
		abort();
	o->cq = mlx5_create_cq(o->ibctx, CQ_DEPTH - 1, NULL, 0);
	if (!o->cq) {
		perror("mlx5_create_cq");
		abort();
	}
	o->raw = make_qp(o, IBV_QPT_RAW_PACKET, 0, SQ_DEPTH);
	raw_to_rts(o->raw);
	o->rawx = make_qp(o, IBV_QPT_RAW_PACKET, 1, SQ_DEPTH);
	raw_to_rts(o->rawx);
	o->rc = make_qp(o, IBV_QPT_RC, 0, RC_SQ_WRS);
	rc_to_rts(o->rc);

	/* sanity: wired the way the data path expects */
	for (i = 0; i < 3; i++) {
		struct ibv_qp *qp = i == 0 ? o->raw : i == 1 ? o->rawx : o->rc;
		struct mlx5_qp *m = to_mqp(qp);

		if (m->bf != &o->ctx->bfs[FAKE_BFREG_INDEX] ||
		    m->sq.lock.need_lock != !single_threaded ||
		    m->sq.wqe_shift != 6 ||
		    m->sq.wqe_cnt != (i < 2 ? SQ_DEPTH : RC_SQ_BBS) ||
		    (i < 2 && !(m->qp_cap_cache & MLX5_CSUM_SUPPORT_RAW_OVER_ETH))) {
			fprintf(stderr, "object setup sanity check failed (qp %d)\n", i);
			abort();
		}
	}
	if (!ibv_qp_to_qp_ex(o->rawx))
		abort();
}

/* ------------------------------------------------------------------ */
/* Work requests                                                       */
/* ------------------------------------------------------------------ */
static struct ibv_sge g_sge[MAXB];
/* burst lists: lists[k] for burst 1, 8, 32 */
static const int g_bursts[3] = { 1, 8, 32 };
static struct ibv_send_wr g_raw[3][MAXB];
static struct ibv_send_wr g_rc[3][MAXB];

static void init_wrs(struct objs *o)
{
	int k, i;

	for (i = 0; i < MAXB; i++) {
		g_sge[i].addr = (uintptr_t)o->buf + i * FRAME;
		g_sge[i].length = FRAME;
		g_sge[i].lkey = o->mr->lkey;
	}
	for (k = 0; k < 3; k++) {
		int n = g_bursts[k];

		for (i = 0; i < n; i++) {
			struct ibv_send_wr *w = &g_raw[k][i], *r = &g_rc[k][i];
			unsigned last = i == n - 1 ? IBV_SEND_SIGNALED : 0;

			memset(w, 0, sizeof(*w));
			w->wr_id = i;
			w->sg_list = &g_sge[i];
			w->num_sge = 1;
			w->opcode = IBV_WR_SEND;
			w->send_flags = IBV_SEND_IP_CSUM | last;
			w->next = i < n - 1 ? &g_raw[k][i + 1] : NULL;

			memset(r, 0, sizeof(*r));
			r->wr_id = i;
			r->sg_list = &g_sge[i];
			r->num_sge = 1;
			r->opcode = IBV_WR_RDMA_WRITE;
			r->send_flags = last;
			r->wr.rdma.remote_addr = 0x10000000ull + i * FRAME;
			r->wr.rdma.rkey = o->mr->rkey;
			r->next = i < n - 1 ? &g_rc[k][i + 1] : NULL;
		}
	}
}

/* one burst of n frames by ibv_wr_*, the last signaled */
static inline void wr_burst(struct ibv_qp_ex *qpx, uint32_t lkey,
			    uint64_t laddr, int n, uint64_t id)
{
	int j;

	ibv_wr_start(qpx);
	for (j = 0; j < n; j++) {
		qpx->wr_id = id + j;
		qpx->wr_flags = IBV_SEND_IP_CSUM |
				(j == n - 1 ? IBV_SEND_SIGNALED : 0);
		ibv_wr_send(qpx);
		ibv_wr_set_sge(qpx, lkey, laddr + j * FRAME, FRAME);
	}
	if (__builtin_expect(ibv_wr_complete(qpx), 0))
		abort();
}

/*
 * Untimed: one burst of 8 by each API, its WQEs checked: one 64-byte block
 * each (control, Ethernet segment with 18 bytes inline and the checksum
 * flags, one data segment for the other 46 bytes), CQ_UPDATE on the last.
 */
static int check_wqes(struct objs *o, struct ibv_qp *qp, unsigned start)
{
	struct mlx5_qp *m = to_mqp(qp);
	int i;

	for (i = 0; i < 8; i++) {
		unsigned idx = (start + i) & (m->sq.wqe_cnt - 1);
		unsigned char *w = mlx5_get_send_wqe(m, idx);
		struct mlx5_wqe_ctrl_seg *c = (void *)w;
		struct mlx5_wqe_eth_seg *e = (void *)(w + 16);
		struct mlx5_wqe_data_seg *d = (void *)(w + 48);
		const char *f = o->buf + i * FRAME;

		if ((be32toh(c->qpn_ds) & 0x3f) != 4 ||
		    (be32toh(c->opmod_idx_opcode) & 0xff) != MLX5_OPCODE_SEND ||
		    !!(c->fm_ce_se & MLX5_WQE_CTRL_CQ_UPDATE) != (i == 7) ||
		    be16toh(e->inline_hdr_sz) != MLX5_ETH_L2_INLINE_HEADER_SIZE ||
		    e->cs_flags != (MLX5_ETH_WQE_L3_CSUM | MLX5_ETH_WQE_L4_CSUM) ||
		    memcmp(e->inline_hdr_start, f, MLX5_ETH_L2_INLINE_HEADER_SIZE) ||
		    be32toh(d->byte_count) != FRAME - MLX5_ETH_L2_INLINE_HEADER_SIZE ||
		    be64toh(d->addr) != (uintptr_t)f + MLX5_ETH_L2_INLINE_HEADER_SIZE ||
		    be32toh(d->lkey) != o->mr->lkey)
			return -1;
	}
	return 0;
}

static void check(struct objs *o)
{
	struct ibv_send_wr *bad;
	struct mlx5_qp *m = to_mqp(o->raw), *mx = to_mqp(o->rawx);
	unsigned start = m->sq.cur_post, startx = mx->sq.cur_post;

	if (ibv_post_send(o->raw, g_raw[1], &bad))
		abort();
	m->sq.tail = m->sq.head;
	wr_burst(ibv_qp_to_qp_ex(o->rawx), o->mr->lkey, (uintptr_t)o->buf, 8, 0);
	mx->sq.tail = mx->sq.head;
	if (check_wqes(o, o->raw, start) || check_wqes(o, o->rawx, startx) ||
	    be32toh(m->db[MLX5_SND_DBR]) != ((start + 8) & 0xffff) ||
	    be32toh(mx->db[MLX5_SND_DBR]) != ((startx + 8) & 0xffff)) {
		fprintf(stderr, "WQE check failed: not the expected raw packet WQEs\n");
		abort();
	}
}

/* ------------------------------------------------------------------ */
/* Timing                                                              */
/* ------------------------------------------------------------------ */
static long g_ops = 2000000;	/* packets (WRs) per round */
static int g_rounds = 5;
static const char *g_filter;

static inline uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

typedef void (*case_fn)(struct objs *o, long iters, int k);

static void run_case(const char *api, int k, const char *locks, case_fn fn,
		     struct objs *o)
{
	int per = g_bursts[k];
	long iters = g_ops / per;
	double r[64], s[64];
	char name[64];
	int i;

	snprintf(name, sizeof(name), "%s_%d", api, per);
	if (g_filter && !strstr(name, g_filter))
		return;
	fn(o, iters / 10 + 1, k);	/* warm-up */
	for (i = 0; i < g_rounds; i++) {
		uint64_t t0 = now_ns();

		fn(o, iters, k);
		r[i] = (double)(now_ns() - t0) / ((double)iters * per);
	}
	memcpy(s, r, sizeof(double) * g_rounds);
	qsort(s, g_rounds, sizeof(double), cmp_d);
	printf("{\"case\": \"%s\", \"burst\": %d, \"locks\": \"%s\", "
	       "\"ns_per_op\": %.3f, \"min\": %.3f, \"unit\": \"pkt\", "
	       "\"ops_per_round\": %ld, \"rounds\": [",
	       name, per, locks, s[g_rounds / 2], s[0], iters * per);
	for (i = 0; i < g_rounds; i++)
		printf("%s%.3f", i ? ", " : "", r[i]);
	printf("]}\n");
	fflush(stdout);
}

/* ibv_post_send of the burst's list; the emulated completion after it */
static void post_list(struct ibv_qp *qp, struct ibv_send_wr *list, long iters)
{
	struct mlx5_qp *m = to_mqp(qp);
	struct ibv_send_wr *bad;
	long i;

	m->sq.tail = m->sq.head;
	for (i = 0; i < iters; i++) {
		list[0].wr_id = i;
		if (__builtin_expect(ibv_post_send(qp, list, &bad), 0))
			abort();
		m->sq.tail = m->sq.head;	/* emulated completion */
	}
}

static void post_raw(struct objs *o, long iters, int k)
{
	post_list(o->raw, g_raw[k], iters);
}

static void post_rc(struct objs *o, long iters, int k)
{
	post_list(o->rc, g_rc[k], iters);
}

static void wr_raw(struct objs *o, long iters, int k)
{
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(o->rawx);
	struct mlx5_qp *m = to_mqp(o->rawx);
	uint32_t lkey = o->mr->lkey;
	uint64_t laddr = (uintptr_t)o->buf;
	int n = g_bursts[k];
	long i;

	m->sq.tail = m->sq.head;
	for (i = 0; i < iters; i++) {
		wr_burst(qpx, lkey, laddr, n, i);
		m->sq.tail = m->sq.head;	/* emulated completion */
	}
}

static void run_all(struct objs *o, const char *locks)
{
	int k;

	init_wrs(o);
	check(o);
	for (k = 0; k < 3; k++)
		run_case("raw_post_send", k, locks, post_raw, o);
	for (k = 0; k < 3; k++)
		run_case("raw_wr_send", k, locks, wr_raw, o);
	for (k = 0; k < 3; k++)
		run_case("rc_post_send_write", k, locks, post_rc, o);
}

static void usage(const char *p)
{
	fprintf(stderr,
		"usage: %s [--ops N] [--rounds R] [--locks default|off|both] [--case SUBSTR]\n"
		"  --ops N     packets (WRs) per round (default 2000000)\n"
		"  --rounds R  timed rounds per case, median reported (default 5)\n"
		"  --locks     libmlx5's default locks, MLX5_SINGLE_THREADED (off), or both (default)\n",
		p);
	exit(2);
}

int main(int argc, char **argv)
{
	struct objs def, off;
	const char *locks = "both";
	int i;

	for (i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--ops") && i + 1 < argc)
			g_ops = atol(argv[++i]);
		else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
			g_rounds = atoi(argv[++i]);
		else if (!strcmp(argv[i], "--locks") && i + 1 < argc)
			locks = argv[++i];
		else if (!strcmp(argv[i], "--case") && i + 1 < argc)
			g_filter = argv[++i];
		else
			usage(argv[0]);
	}
	if (g_rounds < 1 || g_rounds > 64 || g_ops < MAXB ||
	    (strcmp(locks, "both") && strcmp(locks, "default") &&
	     strcmp(locks, "off")))
		usage(argv[0]);

	if (strcmp(locks, "off")) {
		make_objs(&def, 0);
		run_all(&def, "default");
	}
	if (strcmp(locks, "default")) {
		make_objs(&off, 1);
		run_all(&off, "off");
	}
	return 0;
}
