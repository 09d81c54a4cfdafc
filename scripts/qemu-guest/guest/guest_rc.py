"""What the guest's own pyverbs checks (dmabuf.py, odp_srq.py) share: an
RC QP brought to RTS toward a peer on the other function (RoCE v2, PSN 0,
MTU 1024, the retry counts at their most)."""

import pyverbs.enums as e
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.qp import QPAttr


def connect_rc(qp, peer_qpn, peer_gid, gid_index, access, min_rnr_timer=12):
    """RESET to RTS toward `peer_qpn` at `peer_gid`."""
    attr = QPAttr(port_num=1)
    attr.qp_access_flags = access
    attr.path_mtu = e.IBV_MTU_1024
    attr.dest_qp_num = peer_qpn
    attr.rq_psn = 0
    attr.sq_psn = 0
    attr.max_dest_rd_atomic = 4
    attr.max_rd_atomic = 4
    attr.min_rnr_timer = min_rnr_timer
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    gr = GlobalRoute(dgid=peer_gid, sgid_index=gid_index)
    attr.ah_attr = AHAttr(port_num=1, is_global=1, gr=gr, dlid=0)
    qp.to_rts(attr)
