/*
 * Bad use of the verbs through the mlx5-userspace libibverbs.so.1: every
 * case must get verbs' answer (NULL or an error, errno set), never a
 * crash. Prints one line per check; exits with the number that failed.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "mlx5_userspace.h"
#include <infiniband/mlx5dv.h>

static int failed;

#define CHECK(cond, what)                                                  \
	do {                                                               \
		if (cond) {                                                \
			printf("ok: %s\n", what);                          \
		} else {                                                   \
			printf("FAIL: %s (errno %d)\n", what, errno);      \
			failed++;                                          \
		}                                                          \
	} while (0)

/* DevX: raw commands, objects, UMEMs and UARs refused or failed as
 * libmlx5 over the kernel answers, the outbox holding a failed command's
 * status; destroyed objects are EINVAL afterwards. */
static void devx_bad_use(struct ibv_device *cx4lx, struct ibv_device *dev, char *buf)
{
	struct mlx5dv_context_attr attr = { .flags = MLX5DV_CONTEXT_FLAGS_DEVX };
	uint32_t in[4] = { 0 }, out[4] = { 0 };
	uint32_t eqn;

	errno = 0;
	CHECK(!mlx5dv_open_device(cx4lx, &attr) && errno == EOPNOTSUPP,
	      "mlx5dv_open_device with DEVX on a ConnectX-4 Lx (no user contexts): EOPNOTSUPP");
	struct ibv_context *ctx = mlx5dv_open_device(dev, &attr);
	CHECK(ctx != NULL, "mlx5dv_open_device with DEVX on a ConnectX-7");
	if (!ctx)
		return;
	errno = 0;
	in[0] = htobe32(0x7ffeu << 16); /* no such opcode */
	CHECK(mlx5dv_devx_general_cmd(ctx, in, sizeof(in), out, sizeof(out)) != 0 &&
		      (be32toh(out[0]) >> 24) != 0,
	      "mlx5dv_devx_general_cmd of an unknown opcode: an error, the status in the outbox");
	CHECK(mlx5dv_devx_general_cmd(ctx, NULL, 16, out, sizeof(out)) == EINVAL,
	      "mlx5dv_devx_general_cmd(NULL inbox): EINVAL");
	in[0] = htobe32(0x800u << 16); /* ALLOC_PD */
	struct mlx5dv_devx_obj *o = mlx5dv_devx_obj_create(ctx, in, sizeof(in), out, sizeof(out));
	CHECK(o != NULL, "mlx5dv_devx_obj_create of ALLOC_PD");
	CHECK(o && mlx5dv_devx_obj_destroy(o) == 0, "mlx5dv_devx_obj_destroy");
	CHECK(mlx5dv_devx_obj_destroy(o) == EINVAL, "mlx5dv_devx_obj_destroy twice: EINVAL");
	CHECK(mlx5dv_devx_obj_query(o, in, sizeof(in), out, sizeof(out)) == EINVAL,
	      "mlx5dv_devx_obj_query of a destroyed object: EINVAL");
	errno = 0;
	CHECK(!mlx5dv_devx_umem_reg(ctx, NULL, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "mlx5dv_devx_umem_reg(NULL): EINVAL");
	errno = 0;
	CHECK(!mlx5dv_devx_umem_reg(ctx, buf, 4096, IBV_ACCESS_ON_DEMAND) && errno == EINVAL,
	      "mlx5dv_devx_umem_reg with ON_DEMAND access: EINVAL");
	struct mlx5dv_devx_umem_in uin = {
		.addr = buf, .size = 4096, .access = IBV_ACCESS_LOCAL_WRITE,
		.pgsz_bitmap = 1u << 21,
	};
	errno = 0;
	CHECK(!mlx5dv_devx_umem_reg_ex(ctx, &uin) && errno == EINVAL,
	      "mlx5dv_devx_umem_reg_ex allowing 2 MiB pages only: EINVAL");
	struct mlx5dv_devx_umem *u = mlx5dv_devx_umem_reg(ctx, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(u && u->umem_id != 0, "mlx5dv_devx_umem_reg");
	CHECK(u && mlx5dv_devx_umem_dereg(u) == 0, "mlx5dv_devx_umem_dereg");
	CHECK(mlx5dv_devx_umem_dereg(u) == EINVAL, "mlx5dv_devx_umem_dereg twice: EINVAL");
	errno = 0;
	CHECK(!mlx5dv_devx_alloc_uar(ctx, 9) && errno == EOPNOTSUPP,
	      "mlx5dv_devx_alloc_uar of an unknown type: EOPNOTSUPP");
	struct mlx5dv_devx_uar *uar = mlx5dv_devx_alloc_uar(ctx, MLX5DV_UAR_ALLOC_TYPE_NC);
	CHECK(uar && uar->page_id != 0 &&
		      (char *)uar->reg_addr == (char *)uar->base_addr + 0x800,
	      "mlx5dv_devx_alloc_uar: its page and doorbell register");
	mlx5dv_devx_free_uar(uar);
	mlx5dv_devx_free_uar(uar); /* a freed UAR: ignored */
	CHECK(mlx5dv_devx_query_eqn(ctx, 100000, &eqn) == EINVAL,
	      "mlx5dv_devx_query_eqn of a vector the context lacks: EINVAL");
	CHECK(mlx5dv_devx_query_eqn(ctx, 0, &eqn) == 0, "mlx5dv_devx_query_eqn of vector 0");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct mlx5dv_pd dvpd;
	struct mlx5dv_obj obj = { .pd = { .in = pd, .out = &dvpd } };
	CHECK(pd && mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD) == 0 && dvpd.pdn != 0,
	      "mlx5dv_init_obj of a PD: its number");
	CHECK(mlx5dv_init_obj(&obj, MLX5DV_OBJ_QP) == EOPNOTSUPP,
	      "mlx5dv_init_obj of a QP (the driver's rings): EOPNOTSUPP");
	CHECK(pd && ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd of the DevX context's PD");
	CHECK(mlx5dv_init_obj(&obj, MLX5DV_OBJ_PD) == EINVAL,
	      "mlx5dv_init_obj of a deallocated PD: EINVAL");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device of the DevX context");
}

/* Raw packet QPs and flow rules: what verbs refuses. */
static void raw_bad_use(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_mr *mr, char *buf,
			struct ibv_qp *rc)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RAW_PACKET,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 17, .max_recv_sge = 1 },
	};
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL,
	      "a raw packet QP of 17 send SGEs: EINVAL");
	ia.cap.max_send_sge = 1;
	struct ibv_qp *raw = ibv_create_qp(pd, &ia);
	CHECK(raw && raw->qp_type == IBV_QPT_RAW_PACKET, "ibv_create_qp (RAW_PACKET)");
	if (!raw)
		return;
	struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *bad = NULL;
	CHECK(ibv_post_send(raw, &wr, &bad) == EINVAL && bad == &wr,
	      "a raw send in RESET: EINVAL, bad_wr the WR");
	struct ibv_recv_wr rw = { .wr_id = 2, .sg_list = &sge, .num_sge = 1 }, *rbad = NULL;
	CHECK(ibv_post_recv(raw, &rw, &rbad) == EINVAL && rbad == &rw,
	      "a raw receive in RESET: EINVAL, bad_wr the WR");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTR };
	CHECK(ibv_modify_qp(raw, &a, IBV_QP_STATE) == EINVAL, "raw RESET -> RTR: EINVAL");
	a = (struct ibv_qp_attr){ .qp_state = IBV_QPS_INIT, .port_num = 1 };
	int ok = !ibv_modify_qp(raw, &a, IBV_QP_STATE | IBV_QP_PORT);
	a.qp_state = IBV_QPS_RTR;
	ok = ok && !ibv_modify_qp(raw, &a, IBV_QP_STATE);
	a.qp_state = IBV_QPS_RTS;
	ok = ok && !ibv_modify_qp(raw, &a, IBV_QP_STATE);
	CHECK(ok && raw->state == IBV_QPS_RTS, "raw RESET -> INIT -> RTR -> RTS");
	wr.opcode = IBV_WR_RDMA_WRITE;
	CHECK(ibv_post_send(raw, &wr, &bad) == EINVAL && bad == &wr,
	      "an RDMA WRITE on a raw packet QP: EINVAL");
	struct ibv_sge two[2] = { sge, sge };
	rw.sg_list = two;
	rw.num_sge = 2;
	CHECK(ibv_post_recv(raw, &rw, &rbad) == EINVAL && rbad == &rw,
	      "a raw receive of more SGEs than the QP takes: EINVAL");
	struct {
		struct ibv_flow_attr attr;
		struct ibv_flow_spec_tcp_udp udp;
	} fa = {
		.attr = { .type = IBV_FLOW_ATTR_NORMAL, .size = sizeof(fa), .num_of_specs = 1,
			  .port = 1 },
		.udp = { .type = IBV_FLOW_SPEC_UDP, .size = sizeof(struct ibv_flow_spec_tcp_udp),
			 .val = { .dst_port = htons(4791) }, .mask = { .dst_port = htons(0xff00) } },
	};
	errno = 0;
	CHECK(!ibv_create_flow(raw, &fa.attr) && errno == EOPNOTSUPP,
	      "a flow rule of a partial port mask: EOPNOTSUPP");
	fa.udp.mask.dst_port = 0xffff;
	errno = 0;
	CHECK(!ibv_create_flow(rc, &fa.attr) && errno == EOPNOTSUPP,
	      "a flow rule toward an RC QP: EOPNOTSUPP");
	fa.attr.port = 2;
	errno = 0;
	CHECK(!ibv_create_flow(raw, &fa.attr) && errno == EOPNOTSUPP,
	      "a flow rule on port 2: EOPNOTSUPP");
	fa.attr.port = 1;
	struct ibv_flow *f = ibv_create_flow(raw, &fa.attr);
	CHECK(f != NULL, "ibv_create_flow (a UDP port)");
	CHECK(ibv_destroy_qp(raw) == EBUSY, "ibv_destroy_qp of a raw packet QP with a flow: EBUSY");
	CHECK(f && ibv_destroy_flow(f) == 0, "ibv_destroy_flow");
	/* mlx5dv matchers and flows (the device's match format). */
	struct {
		struct mlx5dv_flow_match_parameters p;
		uint8_t b[8];
	} mm = { .p = { .match_sz = 6 }, .b = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff } };
	struct mlx5dv_flow_matcher_attr ma = {
		.type = IBV_FLOW_ATTR_NORMAL, .match_criteria_enable = 1,
		.match_mask = &mm.p, .comp_mask = MLX5DV_FLOW_MATCHER_MASK_FT_TYPE,
		.ft_type = MLX5DV_FLOW_TABLE_TYPE_NIC_TX,
	};
	errno = 0;
	CHECK(!mlx5dv_create_flow_matcher(pd->context, &ma) && errno == EOPNOTSUPP,
	      "an mlx5dv matcher of the NIC TX table: EOPNOTSUPP");
	ma.ft_type = MLX5DV_FLOW_TABLE_TYPE_NIC_RX;
	struct mlx5dv_flow_matcher *mt = mlx5dv_create_flow_matcher(pd->context, &ma);
	CHECK(mt != NULL, "mlx5dv_create_flow_matcher (source MAC)");
	struct mlx5dv_flow_action_attr acts[2] = {
		{ .type = MLX5DV_FLOW_ACTION_DEST_IBV_QP, .qp = raw },
		{ .type = MLX5DV_FLOW_ACTION_TAG, .tag_value = 5 },
	};
	errno = 0;
	CHECK(mt && !mlx5dv_create_flow(mt, &mm.p, 2, acts) && errno == EOPNOTSUPP,
	      "an mlx5dv flow of two actions: EOPNOTSUPP");
	errno = 0;
	CHECK(mt && !mlx5dv_create_flow(mt, &mm.p, 1, &acts[1]) && errno == EOPNOTSUPP,
	      "an mlx5dv flow tagging: EOPNOTSUPP");
	struct ibv_flow *df = mt ? mlx5dv_create_flow(mt, &mm.p, 1, acts) : NULL;
	CHECK(df != NULL, "mlx5dv_create_flow toward the raw packet QP");
	CHECK(ibv_destroy_qp(raw) == EBUSY, "ibv_destroy_qp of a raw packet QP with an mlx5dv flow: EBUSY");
	CHECK(df && ibv_destroy_flow(df) == 0, "ibv_destroy_flow of an mlx5dv flow");
	CHECK(mlx5dv_destroy_flow_matcher(mt) == 0, "mlx5dv_destroy_flow_matcher");
	CHECK(mlx5dv_destroy_flow_matcher(mt) == EINVAL, "mlx5dv_destroy_flow_matcher twice: EINVAL");
	CHECK(ibv_destroy_qp(raw) == 0, "ibv_destroy_qp of the raw packet QP");

	/* RSS: work queues, an indirection table, an RSS QP. */
	struct ibv_wq_init_attr wa = { .wq_type = IBV_WQT_RQ, .max_wr = 8, .max_sge = 1,
				       .pd = pd, .cq = cq };
	struct ibv_wq *wqs[2] = { ibv_create_wq(pd->context, &wa), ibv_create_wq(pd->context, &wa) };
	CHECK(wqs[0] && wqs[1] && wqs[0]->state == IBV_WQS_RESET, "ibv_create_wq (RESET)");
	if (!wqs[0] || !wqs[1])
		return;
	struct ibv_recv_wr wr0 = { .wr_id = 3, .sg_list = &sge, .num_sge = 1 }, *wbad = NULL;
	CHECK(ibv_post_wq_recv(wqs[0], &wr0, &wbad) == EINVAL && wbad == &wr0,
	      "ibv_post_wq_recv in RESET: EINVAL, bad_wr the WR");
	struct ibv_wq_attr wmod = { .attr_mask = IBV_WQ_ATTR_STATE, .wq_state = IBV_WQS_RDY };
	CHECK(ibv_modify_wq(wqs[0], &wmod) == 0 && wqs[0]->state == IBV_WQS_RDY,
	      "ibv_modify_wq to RDY");
	CHECK(ibv_post_wq_recv(wqs[0], &wr0, &wbad) == 0, "ibv_post_wq_recv in RDY");
	struct ibv_rwq_ind_table_init_attr ta = { .log_ind_tbl_size = 1, .ind_tbl = wqs };
	struct ibv_rwq_ind_table *tbl = ibv_create_rwq_ind_table(pd->context, &ta);
	CHECK(tbl != NULL, "ibv_create_rwq_ind_table of two WQs");
	CHECK(ibv_destroy_wq(wqs[1]) == EBUSY, "ibv_destroy_wq of a WQ in a table: EBUSY");
	uint8_t key[40] = { 1 };
	struct ibv_qp_init_attr_ex rx = {
		.qp_type = IBV_QPT_RAW_PACKET, .pd = pd, .rwq_ind_tbl = tbl,
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_IND_TABLE |
			     IBV_QP_INIT_ATTR_RX_HASH,
		.rx_hash_conf = { .rx_hash_function = IBV_RX_HASH_FUNC_TOEPLITZ,
				  .rx_hash_key_len = 16, .rx_hash_key = key,
				  .rx_hash_fields_mask = IBV_RX_HASH_SRC_IPV4 | IBV_RX_HASH_DST_IPV4 },
	};
	errno = 0;
	CHECK(!ibv_create_qp_ex(pd->context, &rx) && errno == EINVAL,
	      "an RSS QP of a 16-byte key: EINVAL");
	rx.rx_hash_conf.rx_hash_key_len = 40;
	struct ibv_qp *rss = tbl ? ibv_create_qp_ex(pd->context, &rx) : NULL;
	CHECK(rss && rss->qp_type == IBV_QPT_RAW_PACKET, "ibv_create_qp_ex (RSS)");
	struct ibv_send_wr sw = { .wr_id = 4, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND }, *sbad = NULL;
	CHECK(rss && ibv_post_send(rss, &sw, &sbad) == EINVAL, "ibv_post_send on an RSS QP: EINVAL");
	CHECK(ibv_destroy_rwq_ind_table(tbl) == EBUSY,
	      "ibv_destroy_rwq_ind_table under an RSS QP: EBUSY");
	struct ibv_flow *rf = rss ? ibv_create_flow(rss, &fa.attr) : NULL;
	CHECK(rf != NULL, "ibv_create_flow toward the RSS QP");
	CHECK(ibv_destroy_qp(rss) == EBUSY, "ibv_destroy_qp of an RSS QP with a flow: EBUSY");
	CHECK(rf && ibv_destroy_flow(rf) == 0 && ibv_destroy_qp(rss) == 0 &&
		      ibv_destroy_rwq_ind_table(tbl) == 0 && ibv_destroy_wq(wqs[0]) == 0 &&
		      ibv_destroy_wq(wqs[1]) == 0,
	      "the flow, the RSS QP, the table and the WQs destroyed in turn");
}

int main(void)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq, *cq2;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	struct ibv_port_attr port;
	union ibv_gid gid;
	struct ibv_wc wc;
	char *buf = malloc(4096);
	int n;

	list = ibv_get_device_list(&n);
	CHECK(list && n == 2, "two devices from MLX5_DEVICES=emu,emu:cx7");
	errno = 0;
	CHECK(!ibv_open_device(NULL) && errno == EINVAL, "ibv_open_device(NULL): EINVAL");
	CHECK(!ibv_get_device_name(NULL) && errno == EINVAL, "ibv_get_device_name(NULL): EINVAL");
	ctx = ibv_open_device(list[0]);
	CHECK(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return 99;
	errno = 0;
	CHECK(!ibv_alloc_pd(NULL) && errno == EINVAL, "ibv_alloc_pd(NULL): EINVAL");
	CHECK(ibv_query_port(ctx, 7, &port) != 0, "ibv_query_port of port 7 fails");
	CHECK(ibv_query_gid(ctx, 1, 100000, &gid) == -1 && errno == EINVAL,
	      "ibv_query_gid beyond the table: EINVAL");
	pd = ibv_alloc_pd(ctx);
	CHECK(pd != NULL, "ibv_alloc_pd");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, NULL, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "ibv_reg_mr(NULL address): EINVAL");
	void *hole = mmap(NULL, 8192, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	errno = 0;
	CHECK(!ibv_reg_mr(pd, hole, 4096, IBV_ACCESS_LOCAL_WRITE) && errno == EFAULT,
	      "ibv_reg_mr of inaccessible memory: EFAULT");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_REMOTE_WRITE) && errno == EINVAL,
	      "ibv_reg_mr REMOTE_WRITE without LOCAL_WRITE: EINVAL");
	mr = ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr != NULL, "ibv_reg_mr");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 0, NULL, NULL, 0) && errno == EINVAL, "ibv_create_cq(0 entries): EINVAL");
	errno = 0;
	CHECK(!ibv_create_cq(ctx, 16, NULL, NULL, 9999) && errno == EINVAL,
	      "ibv_create_cq on vector 9999: EINVAL");
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	cq2 = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(cq && cq2, "ibv_create_cq");
	{
		struct ibv_cq_init_attr_ex ca = { .cqe = 16, .wc_flags = IBV_WC_STANDARD_FLAGS };
		struct ibv_poll_cq_attr pa = { 0 };
		struct ibv_cq_ex *cx;

		ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EOPNOTSUPP,
		      "ibv_create_cq_ex with flow tags: EOPNOTSUPP");
		ca.wc_flags = IBV_WC_STANDARD_FLAGS;
		ca.comp_mask = 1u << 7;
		errno = 0;
		CHECK(!ibv_create_cq_ex(ctx, &ca) && errno == EINVAL,
		      "ibv_create_cq_ex with an unknown comp_mask bit: EINVAL");
		ca.comp_mask = IBV_CQ_INIT_ATTR_MASK_FLAGS;
		ca.flags = IBV_CREATE_CQ_ATTR_SINGLE_THREADED;
		cx = ibv_create_cq_ex(ctx, &ca);
		CHECK(cx != NULL, "ibv_create_cq_ex (single-threaded)");
		if (cx) {
			CHECK(ibv_start_poll(cx, &pa) == ENOENT, "ibv_start_poll of an empty CQ: ENOENT");
			pa.comp_mask = 1;
			CHECK(ibv_start_poll(cx, &pa) == EINVAL, "ibv_start_poll with a comp_mask: EINVAL");
			CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cx)) == 0, "ibv_destroy_cq of a cq_ex");
		}
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
	};
	errno = 0;
	ia.qp_type = 77;
	CHECK(!ibv_create_qp(pd, &ia), "ibv_create_qp of an unknown type fails");
	ia.qp_type = IBV_QPT_RC;
	qp = ibv_create_qp(pd, &ia);
	CHECK(qp != NULL, "ibv_create_qp");

	raw_bad_use(pd, cq, mr, buf, qp);

	struct ibv_sge sge = { (uintptr_t)buf, 64, mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_SEND, .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	CHECK(ibv_post_send(qp, &wr, &bad) == EINVAL && bad == &wr,
	      "ibv_post_send in RESET: EINVAL, bad_wr the WR");
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_RTS };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE) == EINVAL, "RESET -> RTS: EINVAL");
	CHECK(ibv_poll_cq(cq, 1, &wc) == 0, "ibv_poll_cq of an empty CQ: 0");
	CHECK(ibv_poll_cq(cq, -1, &wc) < 0, "ibv_poll_cq of -1 entries fails");

	union ibv_gid group = { .raw = { 0xff, 0x0e, [14] = 0x12, [15] = 0x34 } };
	CHECK(ibv_attach_mcast(qp, &group, 0) == EINVAL, "ibv_attach_mcast of an RC QP: EINVAL");
	CHECK(ibv_attach_mcast(qp, NULL, 0) == EINVAL, "ibv_attach_mcast(NULL gid): EINVAL");
	CHECK(ibv_attach_mcast(NULL, &group, 0) == EINVAL, "ibv_attach_mcast(NULL qp): EINVAL");
	ia.qp_type = IBV_QPT_UD;
	struct ibv_qp *ud = ibv_create_qp(pd, &ia);
	ia.qp_type = IBV_QPT_RC;
	CHECK(ud != NULL, "ibv_create_qp (UD)");
	if (ud) {
		union ibv_gid unicast = { .raw = { 0xfe, 0x80, [15] = 1 } };
		CHECK(ibv_attach_mcast(ud, &unicast, 0) == EINVAL, "ibv_attach_mcast of a unicast GID: EINVAL");
		CHECK(ibv_attach_mcast(ud, &group, 0) == 0, "ibv_attach_mcast (UD)");
		CHECK(ibv_detach_mcast(ud, &group, 0) == 0, "ibv_detach_mcast (UD)");
		CHECK(ibv_detach_mcast(ud, &group, 0) != 0, "ibv_detach_mcast of a group it left fails");
		CHECK(ibv_destroy_qp(ud) == 0, "ibv_destroy_qp (UD)");
	}

	CHECK(ibv_destroy_cq(cq) == EBUSY, "ibv_destroy_cq while a QP uses it: EBUSY");
	CHECK(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd while an MR uses it: EBUSY");
	CHECK(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	CHECK(ibv_destroy_qp(qp) == EINVAL, "ibv_destroy_qp of a destroyed QP: EINVAL");
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(qp, &qa, IBV_QP_STATE, &qia) == EINVAL, "ibv_query_qp of a destroyed QP: EINVAL");
	CHECK(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	ia.send_cq = cq;
	ia.recv_cq = cq2;
	errno = 0;
	CHECK(!ibv_create_qp(pd, &ia) && errno == EINVAL, "ibv_create_qp on a destroyed CQ: EINVAL");
	CHECK(ibv_rereg_mr(mr, 0, NULL, NULL, 0, 0) == IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr with no flags: IBV_REREG_MR_ERR_INPUT, EINVAL");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_TRANSLATION, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr of a NULL range: IBV_REREG_MR_ERR_INPUT, EINVAL");
	CHECK(ibv_rereg_mr(NULL, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0, 0) ==
		      IBV_REREG_MR_ERR_INPUT && errno == EINVAL,
	      "ibv_rereg_mr(NULL): IBV_REREG_MR_ERR_INPUT, EINVAL");
	CHECK(ibv_rereg_mr(mr, IBV_REREG_MR_CHANGE_ACCESS, NULL, NULL, 0,
			   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ) == 0,
	      "ibv_rereg_mr of the access");
	/* On demand paging on a device without it (the default model, a
	 * ConnectX-4 Lx: no page requests): refused as mlx5_ib refuses it;
	 * ibv_advise_mr finds no ODP region behind a pinned MR's lkey. */
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.odp_caps.general_caps == 0,
	      "ibv_query_device_ex: no ODP caps on a ConnectX-4 Lx");
	errno = 0;
	CHECK(!ibv_reg_mr(pd, buf, 4096, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_ON_DEMAND) &&
		      errno == EOPNOTSUPP,
	      "ibv_reg_mr ON_DEMAND without ODP: EOPNOTSUPP");
	struct ibv_sge pinned = { (uintptr_t)buf, 64, mr->lkey };
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
			    &pinned, 1) == ENOENT,
	      "ibv_advise_mr of a pinned MR's lkey: ENOENT");
	CHECK(ibv_advise_mr(pd, IBV_ADVISE_MR_ADVICE_PREFETCH, IBV_ADVISE_MR_FLAG_FLUSH,
			    NULL, 0) == EINVAL,
	      "ibv_advise_mr of no SGE: EINVAL");
	CHECK(ibv_advise_mr(pd, 9, 0, &pinned, 1) == EOPNOTSUPP,
	      "ibv_advise_mr with an unknown advice: EOPNOTSUPP");
	/* A child forked with the context shares its command queue: its
	 * commands are refused (EOPNOTSUPP), the parent's device untouched. */
	fflush(stdout);
	pid_t child = fork();
	if (child == 0) {
		struct ibv_pd *cpd = ibv_alloc_pd(ctx);
		_exit(!cpd && errno == EOPNOTSUPP ? 0 : 1);
	}
	int st = -1;
	CHECK(child > 0 && waitpid(child, &st, 0) == child && WIFEXITED(st) &&
	      WEXITSTATUS(st) == 0, "ibv_alloc_pd in a forked child: EOPNOTSUPP");
	struct ibv_pd *pd2 = ibv_alloc_pd(ctx);
	CHECK(pd2 && ibv_dealloc_pd(pd2) == 0, "the parent's device works after the child's try");
	CHECK(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	CHECK(ibv_dereg_mr(mr) == EINVAL, "ibv_dereg_mr twice: EINVAL");
	CHECK(ibv_destroy_cq(cq2) == 0, "ibv_destroy_cq");
	CHECK(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	CHECK(ibv_close_device(ctx) == 0, "ibv_close_device");
	CHECK(ibv_close_device(ctx) == -1 && errno == EINVAL, "ibv_close_device twice: EINVAL");
	CHECK(!ibv_alloc_pd(ctx) && errno == EINVAL, "ibv_alloc_pd on a closed context: EINVAL");
	devx_bad_use(list[0], list[1], buf);
	ibv_free_device_list(list);
	free(buf);
	printf("bad_use: %d failed\n", failed);
	return failed;
}
