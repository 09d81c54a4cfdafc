//! InfiniBand transport headers in RoCEv2 form (IBTA vol. 1 ch. 9 and the
//! RoCEv2 annex A17): BTH, RETH, AETH, AtomicETH, AtomicAckETH, ImmDt,
//! IETH, DETH, and the frame around them (Ethernet, IPv4 or IPv6, UDP
//! destination port 4791) with its invariant CRC (ICRC).
//!
//! [`Headers`] is the typed form of the transport headers of one packet;
//! [`Headers::emit`] writes their wire bytes and [`Headers::parse`] reads
//! them back, refusing anything short or inconsistent with the opcode.
//! [`encode_frame`] / [`decode_frame`] add and check the Ethernet, IP and
//! UDP headers, the pad bytes and the ICRC. The in-process cable
//! ([`crate::fabric`]) carries the emitted transport headers with the
//! payload passed by reference; a fabric built with `wire_check` sends
//! every packet through the full frame encoding and decoding instead.

/// UDP destination port of RoCEv2.
pub const ROCE_V2_UDP_PORT: u16 = 4791;
/// Default partition key.
pub const DEFAULT_PKEY: u16 = 0xffff;
/// Ethertype of IPv4 / IPv6.
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86dd;
/// Bytes of the Ethernet header (no VLAN tag).
pub const ETH_HLEN: usize = 14;
pub use mlx5_hw::eth::ETH_ZLEN;
pub use mlx5_hw::eth::{ETH_ADDRS_LEN, VLAN_HLEN};
/// Bytes of a TCP header without options.
pub const TCP_HLEN: usize = 20;
/// Bytes of an IPv6 header; of an IPv4 header without options; of UDP.
pub const IPV6_HLEN: usize = 40;
const IPV4_HLEN: usize = 20;
/// Bytes of a UDP header.
pub const UDP_HLEN: usize = 8;
/// Bytes of a VXLAN header (RFC 7348: flags, reserved, VNI, reserved).
pub const VXLAN_HLEN: usize = 8;
/// Bytes of each transport header.
pub const BTH_LEN: usize = 12;
/// RDMA extended transport header.
pub const RETH_LEN: usize = 16;
/// ACK extended transport header.
pub const AETH_LEN: usize = 4;
/// Atomic extended transport header.
pub const ATOMIC_ETH_LEN: usize = 28;
/// Atomic acknowledge extended transport header.
pub const ATOMIC_ACK_ETH_LEN: usize = 8;
/// Immediate data.
pub const IMMDT_LEN: usize = 4;
/// Invalidate extended transport header.
pub const IETH_LEN: usize = 4;
/// Datagram extended transport header.
pub const DETH_LEN: usize = 8;
/// XRC extended transport header (the XRC SRQ number).
pub const XRCETH_LEN: usize = 4;
/// Dynamically Connected extended transport header (the model's DCETH).
pub const DCETH_LEN: usize = 16;
/// Invariant CRC.
pub const ICRC_LEN: usize = 4;
/// Longest transport header stack (BTH + DCETH + AtomicETH).
pub const MAX_HDR_LEN: usize = BTH_LEN + DCETH_LEN + ATOMIC_ETH_LEN + IETH_LEN;

/// Transport service of a BTH opcode (bits 7:5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Reliable connection.
    Rc,
    /// Unreliable connection.
    Uc,
    /// Reliable datagram (not modelled).
    Rd,
    /// Unreliable datagram.
    Ud,
    /// Extended reliable connection (XRC: RC requests naming an XRC SRQ).
    Xrc,
    /// CNP and vendor ranges.
    Other,
}

/// BTH opcodes (IBTA table 38), the operation part (bits 4:0).
pub mod op {
    /// SEND First.
    pub const SEND_FIRST: u8 = 0x00;
    /// SEND Middle.
    pub const SEND_MIDDLE: u8 = 0x01;
    /// SEND Last.
    pub const SEND_LAST: u8 = 0x02;
    /// SEND Last with Immediate.
    pub const SEND_LAST_IMM: u8 = 0x03;
    /// SEND Only.
    pub const SEND_ONLY: u8 = 0x04;
    /// SEND Only with Immediate.
    pub const SEND_ONLY_IMM: u8 = 0x05;
    /// RDMA WRITE First.
    pub const WRITE_FIRST: u8 = 0x06;
    /// RDMA WRITE Middle.
    pub const WRITE_MIDDLE: u8 = 0x07;
    /// RDMA WRITE Last.
    pub const WRITE_LAST: u8 = 0x08;
    /// RDMA WRITE Last with Immediate.
    pub const WRITE_LAST_IMM: u8 = 0x09;
    /// RDMA WRITE Only.
    pub const WRITE_ONLY: u8 = 0x0a;
    /// RDMA WRITE Only with Immediate.
    pub const WRITE_ONLY_IMM: u8 = 0x0b;
    /// RDMA READ Request.
    pub const READ_REQUEST: u8 = 0x0c;
    /// RDMA READ response First.
    pub const READ_RESPONSE_FIRST: u8 = 0x0d;
    /// RDMA READ response Middle.
    pub const READ_RESPONSE_MIDDLE: u8 = 0x0e;
    /// RDMA READ response Last.
    pub const READ_RESPONSE_LAST: u8 = 0x0f;
    /// RDMA READ response Only.
    pub const READ_RESPONSE_ONLY: u8 = 0x10;
    /// Acknowledge.
    pub const ACKNOWLEDGE: u8 = 0x11;
    /// ATOMIC Acknowledge.
    pub const ATOMIC_ACKNOWLEDGE: u8 = 0x12;
    /// CmpSwap.
    pub const COMPARE_SWAP: u8 = 0x13;
    /// FetchAdd.
    pub const FETCH_ADD: u8 = 0x14;
    /// SEND Last with Invalidate.
    pub const SEND_LAST_INV: u8 = 0x16;
    /// SEND Only with Invalidate.
    pub const SEND_ONLY_INV: u8 = 0x17;
}

pub use mlx5_hw::qp::{is_multicast_gid, MULTICAST_QPN};

/// Service prefixes of the BTH opcode.
pub mod svc {
    /// RC opcodes.
    pub const RC: u8 = 0x00;
    /// UC opcodes.
    pub const UC: u8 = 0x20;
    /// RD opcodes.
    pub const RD: u8 = 0x40;
    /// UD opcodes.
    pub const UD: u8 = 0x60;
    /// XRC opcodes (IBA table 38, 101xxxxx): RC's operations; requests
    /// carry an XRCETH after the BTH, responses do not.
    pub const XRC: u8 = 0xa0;
    /// DC requests (DCI to DCT): the RC request opcodes in the first
    /// manufacturer-specific range (IBA table 38, 110xxxxx), each with a
    /// DCETH after the BTH. ConnectX's DC wire format is not public; this
    /// is the model's. Responses to a DCI are plain RC responses.
    pub const DC: u8 = 0xc0;
}

/// Which extension headers follow the BTH for `opcode`, in wire order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Layout {
    /// DETH (UD).
    pub deth: bool,
    /// RETH.
    pub reth: bool,
    /// AtomicETH.
    pub atomic: bool,
    /// AETH.
    pub aeth: bool,
    /// AtomicAckETH.
    pub atomic_ack: bool,
    /// ImmDt.
    pub imm: bool,
    /// IETH.
    pub ieth: bool,
    /// DCETH (DC requests).
    pub dceth: bool,
    /// XRCETH (XRC requests).
    pub xrceth: bool,
    /// The packet may carry payload.
    pub payload: bool,
}

/// [`Layout::of`] of every opcode, computed at compile time (every packet
/// looks its opcode up at least twice).
static LAYOUTS: [Option<Layout>; 256] = {
    let mut t = [None; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = Layout::compute(i as u8);
        i += 1;
    }
    t
};

impl Layout {
    /// The headers of `opcode`, or `None` for an opcode the model does not
    /// speak (RD, CNP, vendor, reserved).
    #[inline]
    pub fn of(opcode: u8) -> Option<Self> {
        LAYOUTS[usize::from(opcode)]
    }

    const fn compute(opcode: u8) -> Option<Self> {
        let service = opcode & 0xe0;
        let o = opcode & 0x1f;
        let mut l = Layout {
            deth: false,
            reth: false,
            atomic: false,
            aeth: false,
            atomic_ack: false,
            imm: false,
            ieth: false,
            dceth: false,
            xrceth: false,
            payload: false,
        };
        match service {
            svc::RC => {}
            // Requests carry the XRCETH; responses (0x0d-0x12) are RC's.
            svc::XRC => l.xrceth = !matches!(o, op::READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE),
            svc::DC => l.dceth = true,
            svc::UC => {
                if !matches!(o, 0x00..=0x0b) {
                    return None;
                }
            }
            svc::UD => {
                if !matches!(o, op::SEND_ONLY | op::SEND_ONLY_IMM) {
                    return None;
                }
                l.deth = true;
            }
            _ => return None,
        }
        match o {
            op::SEND_FIRST | op::SEND_MIDDLE | op::SEND_LAST | op::SEND_ONLY => l.payload = true,
            op::SEND_LAST_IMM | op::SEND_ONLY_IMM => {
                l.payload = true;
                l.imm = true;
            }
            op::WRITE_FIRST | op::WRITE_ONLY => {
                l.reth = true;
                l.payload = true;
            }
            op::WRITE_MIDDLE | op::WRITE_LAST => l.payload = true,
            op::WRITE_LAST_IMM => {
                l.payload = true;
                l.imm = true;
            }
            op::WRITE_ONLY_IMM => {
                l.reth = true;
                l.payload = true;
                l.imm = true;
            }
            op::READ_REQUEST => l.reth = true,
            op::READ_RESPONSE_FIRST | op::READ_RESPONSE_LAST | op::READ_RESPONSE_ONLY => {
                l.aeth = true;
                l.payload = true;
            }
            op::READ_RESPONSE_MIDDLE => l.payload = true,
            op::ACKNOWLEDGE => l.aeth = true,
            op::ATOMIC_ACKNOWLEDGE => {
                l.aeth = true;
                l.atomic_ack = true;
            }
            op::COMPARE_SWAP | op::FETCH_ADD => l.atomic = true,
            op::SEND_LAST_INV | op::SEND_ONLY_INV => {
                l.payload = true;
                l.ieth = true;
            }
            _ => return None,
        }
        // Responses exist on RC and XRC only; atomics, READs and
        // invalidation on RC, XRC and DC.
        let reliable = service == svc::RC || service == svc::DC || service == svc::XRC;
        if (service != svc::RC && service != svc::XRC && l.aeth)
            || (!reliable && (l.atomic || o == op::READ_REQUEST || l.ieth))
        {
            return None;
        }
        Some(l)
    }

    /// Bytes of the transport headers (BTH included).
    #[allow(clippy::len_without_is_empty)] // never empty: the BTH is always there
    pub fn len(&self) -> usize {
        BTH_LEN
            + usize::from(self.deth) * DETH_LEN
            + usize::from(self.reth) * RETH_LEN
            + usize::from(self.atomic) * ATOMIC_ETH_LEN
            + usize::from(self.aeth) * AETH_LEN
            + usize::from(self.atomic_ack) * ATOMIC_ACK_ETH_LEN
            + usize::from(self.imm) * IMMDT_LEN
            + usize::from(self.ieth) * IETH_LEN
            + usize::from(self.dceth) * DCETH_LEN
            + usize::from(self.xrceth) * XRCETH_LEN
    }
}

/// Base transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bth {
    /// Opcode (service | operation).
    pub opcode: u8,
    /// Solicited event.
    pub se: bool,
    /// Migration request.
    pub mig: bool,
    /// Pad count: bytes added to align the payload to 4.
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN.
    pub fecn: bool,
    /// Backward ECN.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

/// RDMA extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reth {
    /// Virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message, in bytes.
    pub dma_len: u32,
}

/// AETH syndrome classes (bits 6:5 of the syndrome).
pub mod aeth {
    /// ACK; bits 4:0 carry the credit count.
    pub const ACK: u8 = 0x00;
    /// RNR NAK; bits 4:0 carry the RNR timer.
    pub const RNR_NAK: u8 = 0x20;
    /// NAK; bits 4:0 carry the NAK code.
    pub const NAK: u8 = 0x60;
    /// NAK code: PSN sequence error.
    pub const NAK_PSN_SEQ: u8 = 0;
    /// NAK code: invalid request.
    pub const NAK_INVALID_REQUEST: u8 = 1;
    /// NAK code: remote access error.
    pub const NAK_REMOTE_ACCESS: u8 = 2;
    /// NAK code: remote operational error.
    pub const NAK_REMOTE_OP: u8 = 3;
    /// NAK code: invalid RD request.
    pub const NAK_INVALID_RD: u8 = 4;
    /// Credit count meaning "no end-to-end flow control".
    pub const CREDITS_INVALID: u8 = 0x1f;
}

/// ACK extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Aeth {
    /// Syndrome: class in bits 6:5, value in 4:0.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

/// Atomic extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AtomicEth {
    /// Virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap (CmpSwap) or add (FetchAdd) data.
    pub swap_add: u64,
    /// Compare data (CmpSwap).
    pub compare: u64,
}

/// Datagram extended transport header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Deth {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

/// DC extended transport header (the model's, after the BTH of a DC
/// request): the DC access key the DCT checks, the DCI's QP number (the
/// destination of the responses) and whether this packet opens the
/// connection (its PSN is then the connection's first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Dceth {
    /// DC access key.
    pub dc_key: u64,
    /// The DCI (24 bits).
    pub src_qp: u32,
    /// The first packet of a connection (DC connect).
    pub connect: bool,
}

/// The transport headers of one packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Headers {
    /// BTH.
    pub bth: Bth,
    /// DETH, for UD.
    pub deth: Option<Deth>,
    /// RETH.
    pub reth: Option<Reth>,
    /// AtomicETH.
    pub atomic: Option<AtomicEth>,
    /// AETH.
    pub aeth: Option<Aeth>,
    /// AtomicAckETH: the original remote data.
    pub atomic_ack: Option<u64>,
    /// ImmDt (big-endian on the wire; kept as the 32 wire bits).
    pub imm: Option<u32>,
    /// IETH: the rkey to invalidate.
    pub ieth: Option<u32>,
    /// DCETH, for DC requests.
    pub dceth: Option<Dceth>,
    /// XRCETH, for XRC requests: the XRC SRQ (24 bits).
    pub xrceth: Option<u32>,
}

/// A packet that cannot be parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than its headers.
    #[error("packet truncated: {have} bytes, {need} needed")]
    Truncated {
        /// Bytes present.
        have: usize,
        /// Bytes the headers need.
        need: usize,
    },
    /// Opcode not spoken (RD, CNP, reserved).
    #[error("unsupported BTH opcode {0:#04x}")]
    Opcode(u8),
    /// The headers present do not match the opcode.
    #[error("extension headers do not match BTH opcode {0:#04x}")]
    Mismatch(u8),
    /// Not Ethernet/IP/UDP 4791.
    #[error("not a RoCEv2 frame: {0}")]
    NotRoce(&'static str),
    /// ICRC mismatch.
    #[error("ICRC mismatch: frame carries {carried:#010x}, computed {computed:#010x}")]
    Icrc {
        /// ICRC in the frame.
        carried: u32,
        /// ICRC computed.
        computed: u32,
    },
    /// Transport header version not 0.
    #[error("BTH TVer {0} not supported")]
    Version(u8),
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
fn get16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn get32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn get64(b: &[u8], at: usize) -> u64 {
    u64::from(get32(b, at)) << 32 | u64::from(get32(b, at + 4))
}

impl Headers {
    /// The layout its opcode calls for.
    pub fn layout(&self) -> Option<Layout> {
        Layout::of(self.bth.opcode)
    }

    /// Writes the headers into `out` (at least [`MAX_HDR_LEN`] bytes);
    /// returns their length. Headers the opcode does not call for are not
    /// written; one it calls for but that is `None` is written as zeros.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let l = Layout::of(self.bth.opcode).unwrap_or_default();
        let b = &self.bth;
        out[0] = b.opcode;
        out[1] = u8::from(b.se) << 7 | u8::from(b.mig) << 6 | (b.pad & 3) << 4 | (b.tver & 0xf);
        put16(out, 2, b.pkey);
        put32(
            out,
            4,
            u32::from(b.fecn) << 31 | u32::from(b.becn) << 30 | (b.dest_qp & 0xff_ffff),
        );
        put32(out, 8, u32::from(b.ack_req) << 31 | (b.psn & 0xff_ffff));
        let mut at = BTH_LEN;
        if l.xrceth {
            put32(out, at, self.xrceth.unwrap_or_default() & 0xff_ffff);
            at += XRCETH_LEN;
        }
        if l.dceth {
            let d = self.dceth.unwrap_or_default();
            put64(out, at, d.dc_key);
            put32(
                out,
                at + 8,
                u32::from(d.connect) << 31 | (d.src_qp & 0xff_ffff),
            );
            put32(out, at + 12, 0);
            at += DCETH_LEN;
        }
        if l.deth {
            let d = self.deth.unwrap_or_default();
            put32(out, at, d.qkey);
            put32(out, at + 4, d.src_qp & 0xff_ffff);
            at += DETH_LEN;
        }
        if l.reth {
            let r = self.reth.unwrap_or_default();
            put64(out, at, r.va);
            put32(out, at + 8, r.rkey);
            put32(out, at + 12, r.dma_len);
            at += RETH_LEN;
        }
        if l.atomic {
            let a = self.atomic.unwrap_or_default();
            put64(out, at, a.va);
            put32(out, at + 8, a.rkey);
            put64(out, at + 12, a.swap_add);
            put64(out, at + 20, a.compare);
            at += ATOMIC_ETH_LEN;
        }
        if l.aeth {
            let a = self.aeth.unwrap_or_default();
            put32(out, at, u32::from(a.syndrome) << 24 | (a.msn & 0xff_ffff));
            at += AETH_LEN;
        }
        if l.atomic_ack {
            put64(out, at, self.atomic_ack.unwrap_or_default());
            at += ATOMIC_ACK_ETH_LEN;
        }
        if l.imm {
            put32(out, at, self.imm.unwrap_or_default());
            at += IMMDT_LEN;
        }
        if l.ieth {
            put32(out, at, self.ieth.unwrap_or_default());
            at += IETH_LEN;
        }
        at
    }

    /// Parses the transport headers at the start of `buf`; returns them
    /// and their length (the payload follows).
    pub fn parse(buf: &[u8]) -> Result<(Self, usize), PacketError> {
        if buf.len() < BTH_LEN {
            return Err(PacketError::Truncated {
                have: buf.len(),
                need: BTH_LEN,
            });
        }
        let opcode = buf[0];
        let l = Layout::of(opcode).ok_or(PacketError::Opcode(opcode))?;
        let need = l.len();
        if buf.len() < need {
            return Err(PacketError::Truncated {
                have: buf.len(),
                need,
            });
        }
        let tver = buf[1] & 0xf;
        if tver != 0 {
            return Err(PacketError::Version(tver));
        }
        let w1 = get32(buf, 4);
        let w2 = get32(buf, 8);
        let mut h = Headers {
            bth: Bth {
                opcode,
                se: buf[1] & 0x80 != 0,
                mig: buf[1] & 0x40 != 0,
                pad: buf[1] >> 4 & 3,
                tver,
                pkey: get16(buf, 2),
                fecn: w1 & 1 << 31 != 0,
                becn: w1 & 1 << 30 != 0,
                dest_qp: w1 & 0xff_ffff,
                ack_req: w2 & 1 << 31 != 0,
                psn: w2 & 0xff_ffff,
            },
            ..Headers::default()
        };
        let mut at = BTH_LEN;
        if l.xrceth {
            h.xrceth = Some(get32(buf, at) & 0xff_ffff);
            at += XRCETH_LEN;
        }
        if l.dceth {
            let w = get32(buf, at + 8);
            h.dceth = Some(Dceth {
                dc_key: get64(buf, at),
                src_qp: w & 0xff_ffff,
                connect: w & 1 << 31 != 0,
            });
            at += DCETH_LEN;
        }
        if l.deth {
            h.deth = Some(Deth {
                qkey: get32(buf, at),
                src_qp: get32(buf, at + 4) & 0xff_ffff,
            });
            at += DETH_LEN;
        }
        if l.reth {
            h.reth = Some(Reth {
                va: get64(buf, at),
                rkey: get32(buf, at + 8),
                dma_len: get32(buf, at + 12),
            });
            at += RETH_LEN;
        }
        if l.atomic {
            h.atomic = Some(AtomicEth {
                va: get64(buf, at),
                rkey: get32(buf, at + 8),
                swap_add: get64(buf, at + 12),
                compare: get64(buf, at + 20),
            });
            at += ATOMIC_ETH_LEN;
        }
        if l.aeth {
            let w = get32(buf, at);
            h.aeth = Some(Aeth {
                syndrome: (w >> 24) as u8,
                msn: w & 0xff_ffff,
            });
            at += AETH_LEN;
        }
        if l.atomic_ack {
            h.atomic_ack = Some(get64(buf, at));
            at += ATOMIC_ACK_ETH_LEN;
        }
        if l.imm {
            h.imm = Some(get32(buf, at));
            at += IMMDT_LEN;
        }
        if l.ieth {
            h.ieth = Some(get32(buf, at));
            at += IETH_LEN;
        }
        Ok((h, at))
    }
}

/// Whether `opcode` is of a reliable connection with responses on the
/// wire: RC, or XRC (RC's operations and responses, requests naming an
/// XRC SRQ).
pub fn rc_like(opcode: u8) -> bool {
    matches!(opcode & 0xe0, svc::RC | svc::XRC)
}

/// The service of an opcode.
pub fn service(opcode: u8) -> Service {
    match opcode & 0xe0 {
        svc::RC => Service::Rc,
        svc::UC => Service::Uc,
        svc::RD => Service::Rd,
        svc::UD => Service::Ud,
        svc::XRC => Service::Xrc,
        _ => Service::Other,
    }
}

/// Layer 2 and 3 addressing of a RoCEv2 frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RoceAddr {
    /// Destination MAC.
    pub dst_mac: [u8; 6],
    /// Source MAC.
    pub src_mac: [u8; 6],
    /// Source GID (an IPv4-mapped GID, `::ffff:a.b.c.d`, means IPv4).
    pub src_gid: [u8; 16],
    /// Destination GID.
    pub dst_gid: [u8; 16],
    /// Traffic class (IPv6) / TOS (IPv4).
    pub tclass: u8,
    /// Flow label (IPv6, 20 bits).
    pub flow_label: u32,
    /// Hop limit / TTL.
    pub hop_limit: u8,
    /// UDP source port.
    pub udp_sport: u16,
}

/// Whether `gid` is an IPv4-mapped address.
pub fn gid_is_ipv4(gid: &[u8; 16]) -> bool {
    gid[..10].iter().all(|&b| b == 0) && gid[10] == 0xff && gid[11] == 0xff
}

/// The 40-byte GRH a UD receive scatters before the payload: the IPv6
/// header of the frame, or for IPv4 20 zero bytes then the IPv4 header.
pub fn grh(addr: &RoceAddr, payload_len: usize) -> [u8; 40] {
    let mut g = [0u8; 40];
    let l4 = UDP_HLEN + payload_len;
    if gid_is_ipv4(&addr.src_gid) {
        ipv4_header(addr, l4, &mut g[20..40]);
    } else {
        ipv6_header(addr, l4, &mut g);
    }
    g
}

fn ipv6_header(a: &RoceAddr, l4_len: usize, out: &mut [u8]) {
    put32(
        out,
        0,
        6 << 28 | u32::from(a.tclass) << 20 | (a.flow_label & 0xf_ffff),
    );
    put16(out, 4, l4_len as u16);
    out[6] = 17;
    out[7] = a.hop_limit;
    out[8..24].copy_from_slice(&a.src_gid);
    out[24..40].copy_from_slice(&a.dst_gid);
}

fn ipv4_header(a: &RoceAddr, l4_len: usize, out: &mut [u8]) {
    out[0] = 0x45;
    out[1] = a.tclass;
    put16(out, 2, (IPV4_HLEN + l4_len) as u16);
    put16(out, 4, 0);
    put16(out, 6, 0x4000); // don't fragment
    out[8] = a.hop_limit;
    out[9] = 17;
    put16(out, 10, 0);
    out[12..16].copy_from_slice(&a.src_gid[12..16]);
    out[16..20].copy_from_slice(&a.dst_gid[12..16]);
    let mut sum = 0u32;
    for i in 0..10 {
        sum += u32::from(get16(out, i * 2));
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    put16(out, 10, !(sum as u16));
}

/// CRC-32 (IEEE 802.3, reflected polynomial 0xEDB88320) without the final
/// inversion, continuing from `crc`.
pub fn crc32_update(mut crc: u32, data: &[u8]) -> u32 {
    const T: [u32; 256] = {
        let mut t = [0u32; 256];
        let mut i = 0;
        while i < 256 {
            let mut c = i as u32;
            let mut k = 0;
            while k < 8 {
                c = if c & 1 != 0 {
                    0xedb8_8320 ^ (c >> 1)
                } else {
                    c >> 1
                };
                k += 1;
            }
            t[i] = c;
            i += 1;
        }
        t
    };
    for &b in data {
        crc = T[((crc ^ u32::from(b)) & 0xff) as usize] ^ (crc >> 8);
    }
    crc
}

/// The ICRC of a RoCEv2 packet: `l3` is the IP header, `l4` the UDP
/// header, `rest` the transport headers, payload and pad. Variant fields
/// are masked to ones as the annex says (IPv6 traffic class, flow label,
/// hop limit; IPv4 TOS, TTL, checksum; UDP checksum; BTH resv8a), after
/// eight bytes of ones standing for the LRH. The value is the inverted
/// CRC, sent least significant byte first.
pub fn icrc(l3: &[u8], udp: &[u8], rest: &[u8]) -> u32 {
    let mut crc = crc32_update(0xffff_ffff, &[0xff; 8]);
    let mut ip = [0u8; IPV6_HLEN];
    let ip = &mut ip[..l3.len().min(IPV6_HLEN)];
    ip.copy_from_slice(&l3[..ip.len()]);
    if ip.len() == IPV6_HLEN {
        ip[0] |= 0x0f;
        ip[1] = 0xff;
        ip[2] = 0xff;
        ip[3] = 0xff;
        ip[7] = 0xff;
    } else if ip.len() >= IPV4_HLEN {
        ip[1] = 0xff;
        ip[8] = 0xff;
        ip[10] = 0xff;
        ip[11] = 0xff;
    }
    crc = crc32_update(crc, ip);
    let mut u = [0u8; UDP_HLEN];
    u.copy_from_slice(&udp[..UDP_HLEN]);
    u[6] = 0xff;
    u[7] = 0xff;
    crc = crc32_update(crc, &u);
    if rest.len() >= BTH_LEN {
        let mut bth = [0u8; BTH_LEN];
        bth.copy_from_slice(&rest[..BTH_LEN]);
        bth[4] = 0xff;
        crc = crc32_update(crc, &bth);
        crc = crc32_update(crc, &rest[BTH_LEN..]);
    } else {
        crc = crc32_update(crc, rest);
    }
    !crc
}

/// Appends the whole frame of one packet to `out`: Ethernet, IP, UDP,
/// transport headers, payload, pad (the BTH pad count is set here) and
/// ICRC.
pub fn encode_frame(addr: &RoceAddr, hdrs: &Headers, payload: &[u8], out: &mut Vec<u8>) {
    let mut h = *hdrs;
    let pad = (4 - payload.len() % 4) % 4;
    h.bth.pad = pad as u8;
    let mut th = [0u8; MAX_HDR_LEN];
    let thl = h.emit(&mut th);
    let v4 = gid_is_ipv4(&addr.src_gid);
    let l3len = if v4 { IPV4_HLEN } else { IPV6_HLEN };
    let l4len = UDP_HLEN + thl + payload.len() + pad + ICRC_LEN;
    let start = out.len();
    out.resize(start + ETH_HLEN + l3len + l4len, 0);
    let f = &mut out[start..];
    f[0..6].copy_from_slice(&addr.dst_mac);
    f[6..12].copy_from_slice(&addr.src_mac);
    put16(f, 12, if v4 { ETH_P_IP } else { ETH_P_IPV6 });
    let (l3, rest) = f[ETH_HLEN..].split_at_mut(l3len);
    if v4 {
        ipv4_header(addr, l4len, l3);
    } else {
        ipv6_header(addr, l4len, l3);
    }
    put16(rest, 0, addr.udp_sport);
    put16(rest, 2, ROCE_V2_UDP_PORT);
    put16(rest, 4, l4len as u16);
    put16(rest, 6, 0); // UDP checksum: zero (none), as RoCEv2 NICs send
    rest[UDP_HLEN..UDP_HLEN + thl].copy_from_slice(&th[..thl]);
    let p = UDP_HLEN + thl;
    rest[p..p + payload.len()].copy_from_slice(payload);
    let end = l4len - ICRC_LEN;
    let c = icrc(l3, &rest[..UDP_HLEN], &rest[UDP_HLEN..end]);
    rest[end..end + ICRC_LEN].copy_from_slice(&c.to_le_bytes());
}

/// A decoded frame: addressing, transport headers and where the payload
/// lies in the frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Addressing (MACs, GIDs, traffic class, hop limit, UDP source port).
    pub addr: RoceAddr,
    /// Transport headers.
    pub hdrs: Headers,
    /// Payload range in the frame (pad and ICRC excluded).
    pub payload: std::ops::Range<usize>,
}

/// Whether `f` is a RoCEv2 frame by its headers alone (Ethernet, IPv4
/// without options or IPv6, UDP to 4791), without decoding the rest: how
/// the wire tells the raw frames it carries.
pub fn is_roce_v2(f: &[u8]) -> bool {
    let (proto, udp) = match f.get(12..14).map(|t| get16(t, 0)) {
        Some(ETH_P_IP) if f.get(ETH_HLEN) == Some(&0x45) => (ETH_HLEN + 9, ETH_HLEN + IPV4_HLEN),
        Some(ETH_P_IPV6) => (ETH_HLEN + 6, ETH_HLEN + IPV6_HLEN),
        _ => return false,
    };
    f.get(proto) == Some(&17)
        && f.get(udp + 2..udp + 4).map(|p| get16(p, 0)) == Some(ROCE_V2_UDP_PORT)
}

/// Decodes and checks one frame (lengths, UDP port 4791, ICRC).
pub fn decode_frame(f: &[u8]) -> Result<Frame, PacketError> {
    let short = |need| PacketError::Truncated {
        have: f.len(),
        need,
    };
    if f.len() < ETH_HLEN {
        return Err(short(ETH_HLEN));
    }
    let mut a = RoceAddr::default();
    a.dst_mac.copy_from_slice(&f[0..6]);
    a.src_mac.copy_from_slice(&f[6..12]);
    let (l3len, l4len) = match get16(f, 12) {
        ETH_P_IPV6 => {
            if f.len() < ETH_HLEN + IPV6_HLEN {
                return Err(short(ETH_HLEN + IPV6_HLEN));
            }
            let ip = &f[ETH_HLEN..];
            if ip[0] >> 4 != 6 || ip[6] != 17 {
                return Err(PacketError::NotRoce("not IPv6/UDP"));
            }
            let w = get32(ip, 0);
            a.tclass = (w >> 20) as u8;
            a.flow_label = w & 0xf_ffff;
            a.hop_limit = ip[7];
            a.src_gid.copy_from_slice(&ip[8..24]);
            a.dst_gid.copy_from_slice(&ip[24..40]);
            (IPV6_HLEN, usize::from(get16(ip, 4)))
        }
        ETH_P_IP => {
            if f.len() < ETH_HLEN + IPV4_HLEN {
                return Err(short(ETH_HLEN + IPV4_HLEN));
            }
            let ip = &f[ETH_HLEN..];
            if ip[0] != 0x45 || ip[9] != 17 {
                return Err(PacketError::NotRoce("not IPv4/UDP without options"));
            }
            a.tclass = ip[1];
            a.hop_limit = ip[8];
            a.src_gid[10] = 0xff;
            a.src_gid[11] = 0xff;
            a.src_gid[12..].copy_from_slice(&ip[12..16]);
            a.dst_gid[10] = 0xff;
            a.dst_gid[11] = 0xff;
            a.dst_gid[12..].copy_from_slice(&ip[16..20]);
            let total = usize::from(get16(ip, 2));
            (IPV4_HLEN, total.saturating_sub(IPV4_HLEN))
        }
        _ => return Err(PacketError::NotRoce("ethertype")),
    };
    let l4 = ETH_HLEN + l3len;
    // Another UDP port is another protocol's datagram, whatever its size
    // (a one-byte one is shorter than any RoCE packet).
    if let Some(udp) = f.get(l4..l4 + UDP_HLEN) {
        if get16(udp, 2) != ROCE_V2_UDP_PORT {
            return Err(PacketError::NotRoce("UDP destination port is not 4791"));
        }
    }
    if l4len < UDP_HLEN + BTH_LEN + ICRC_LEN || f.len() < l4 + l4len {
        return Err(short(l4 + l4len.max(UDP_HLEN + BTH_LEN + ICRC_LEN)));
    }
    let udp = &f[l4..l4 + UDP_HLEN];
    a.udp_sport = get16(udp, 0);
    let end = l4 + l4len - ICRC_LEN;
    let carried = u32::from_le_bytes([f[end], f[end + 1], f[end + 2], f[end + 3]]);
    let computed = icrc(&f[ETH_HLEN..l4], udp, &f[l4 + UDP_HLEN..end]);
    if carried != computed {
        return Err(PacketError::Icrc { carried, computed });
    }
    let t = l4 + UDP_HLEN;
    let (hdrs, thl) = Headers::parse(&f[t..end])?;
    let pad = usize::from(hdrs.bth.pad);
    let pstart = t + thl;
    if pstart + pad > end {
        return Err(PacketError::Mismatch(hdrs.bth.opcode));
    }
    Ok(Frame {
        addr: a,
        hdrs,
        payload: pstart..end - pad,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rc_write_first() -> Headers {
        Headers {
            bth: Bth {
                opcode: svc::RC | op::WRITE_FIRST,
                pkey: DEFAULT_PKEY,
                dest_qp: 0x12,
                ack_req: false,
                psn: 0x00ab_cdef,
                ..Bth::default()
            },
            reth: Some(Reth {
                va: 0x1122_3344_5566_7788,
                rkey: 0xdead_beef,
                dma_len: 8192,
            }),
            ..Headers::default()
        }
    }

    #[test]
    fn every_opcode_round_trips() {
        for service in [svc::RC, svc::UC, svc::UD, svc::DC, svc::XRC] {
            for o in 0u8..0x20 {
                let opcode = service | o;
                let Some(l) = Layout::of(opcode) else {
                    continue;
                };
                let h = Headers {
                    xrceth: l.xrceth.then_some(0x12_3456),
                    dceth: l.dceth.then_some(Dceth {
                        dc_key: 0xdc00_0000_0000_00dc,
                        src_qp: 0xab_cdef,
                        connect: o % 2 == 0,
                    }),
                    bth: Bth {
                        opcode,
                        se: true,
                        pad: 2,
                        pkey: 0x8001,
                        becn: true,
                        dest_qp: 0xfe_dcba,
                        ack_req: true,
                        psn: 0xff_fffe,
                        ..Bth::default()
                    },
                    deth: l.deth.then_some(Deth {
                        qkey: 0x8001_0000,
                        src_qp: 0x1,
                    }),
                    reth: l.reth.then_some(Reth {
                        va: 0xffee_0000_0000_0001,
                        rkey: 7,
                        dma_len: 0x10_0000,
                    }),
                    atomic: l.atomic.then_some(AtomicEth {
                        va: 0x40,
                        rkey: 9,
                        swap_add: u64::MAX,
                        compare: 3,
                    }),
                    aeth: l.aeth.then_some(Aeth {
                        syndrome: aeth::RNR_NAK | 14,
                        msn: 0x12_3456,
                    }),
                    atomic_ack: l.atomic_ack.then_some(0x0102_0304_0506_0708),
                    imm: l.imm.then_some(0xcafe_f00d),
                    ieth: l.ieth.then_some(0x1234_5600),
                };
                let mut b = [0u8; MAX_HDR_LEN];
                let n = h.emit(&mut b);
                assert_eq!(n, l.len(), "opcode {opcode:#x}");
                let (p, m) = Headers::parse(&b[..n]).unwrap();
                assert_eq!((p, m), (h, n), "opcode {opcode:#x}");
                // One byte short: refused, never a panic.
                assert!(matches!(
                    Headers::parse(&b[..n - 1]),
                    Err(PacketError::Truncated { .. })
                ));
            }
        }
        // RD and UC atomics are not spoken.
        assert_eq!(
            Headers::parse(&[svc::RD; 40]).unwrap_err(),
            PacketError::Opcode(svc::RD)
        );
        assert!(Layout::of(svc::UC | op::FETCH_ADD).is_none());
        // XRC: RC's operations; requests carry the XRCETH, responses not.
        for o in [
            op::SEND_ONLY,
            op::WRITE_FIRST,
            op::READ_REQUEST,
            op::FETCH_ADD,
        ] {
            assert!(Layout::of(svc::XRC | o).is_some_and(|l| l.xrceth), "{o:#x}");
        }
        for o in [
            op::ACKNOWLEDGE,
            op::READ_RESPONSE_MIDDLE,
            op::ATOMIC_ACKNOWLEDGE,
        ] {
            assert!(
                Layout::of(svc::XRC | o).is_some_and(|l| !l.xrceth),
                "{o:#x}"
            );
        }
        assert_eq!(
            Layout::of(svc::XRC | op::SEND_ONLY).map(|l| l.len()),
            Some(BTH_LEN + XRCETH_LEN)
        );
        assert!(Layout::of(svc::UD | op::SEND_FIRST).is_none());
    }

    #[test]
    fn bth_golden_bytes() {
        let mut b = [0u8; MAX_HDR_LEN];
        let n = rc_write_first().emit(&mut b);
        assert_eq!(
            &b[..n],
            &[
                0x06, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x12, 0x00, 0xab, 0xcd, 0xef, // BTH
                0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0xde, 0xad, 0xbe, 0xef, 0x00, 0x00,
                0x20, 0x00, // RETH
            ]
        );
    }

    /// A RoCEv2 IPv6 frame built and checksummed by hand (the ICRC is
    /// zlib's CRC-32 over 8 bytes of ones and the masked headers, payload
    /// and pad, as Linux's rxe_icrc.c computes it), decoded and re-encoded.
    #[test]
    fn icrc_golden_frame() {
        let golden: [u8; 86] = [
            // Ethernet: dst, src, 86dd.
            0x24, 0x8a, 0x07, 0xa0, 0x00, 0x02, 0x24, 0x8a, 0x07, 0xa0, 0x00, 0x01, 0x86, 0xdd,
            // IPv6: tclass 0, flow 0, payload 32, UDP, hop 64.
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x11, 0x40, //
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x26, 0x8a, 0x07, 0xff, 0xfe, 0xa0, 0x00, 0x01, //
            0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x26, 0x8a, 0x07, 0xff, 0xfe, 0xa0, 0x00, 0x02, //
            // UDP: sport 0xc000, dport 4791, len 32, csum 0.
            0xc0, 0x00, 0x12, 0xb7, 0x00, 0x20, 0x00, 0x00, //
            // BTH: RC SEND_ONLY, pad 1, pkey ffff, dqp 0x11, ackreq, psn 0x10.
            0x04, 0x10, 0xff, 0xff, 0x00, 0x00, 0x00, 0x11, 0x80, 0x00, 0x00, 0x10,
            // Payload "hello!!" and one pad byte.
            b'h', b'e', b'l', b'l', b'o', b'!', b'!', 0x00, // 7 bytes + 1 pad
            // ICRC (little endian).
            0xe5, 0x37, 0x15, 0xfa,
        ];
        let f = decode_frame(&golden).unwrap();
        assert_eq!(f.hdrs.bth.opcode, op::SEND_ONLY);
        assert_eq!(f.hdrs.bth.dest_qp, 0x11);
        assert_eq!(f.hdrs.bth.psn, 0x10);
        assert!(f.hdrs.bth.ack_req);
        assert_eq!(&golden[f.payload.clone()], b"hello!!");
        assert_eq!(f.addr.udp_sport, 0xc000);
        let mut out = Vec::new();
        encode_frame(&f.addr, &f.hdrs, &golden[f.payload.clone()], &mut out);
        assert_eq!(out, golden);
        // Any flipped bit outside the masked fields breaks the ICRC.
        for bit in [8 * 55, 8 * 80, 8 * 81 + 3, 8 * 30] {
            let mut bad = golden;
            bad[bit / 8] ^= 1 << (bit % 8);
            assert!(decode_frame(&bad).is_err(), "bit {bit}");
        }
        // Masked fields (hop limit, flow label, UDP checksum) do not.
        let mut v = golden;
        v[ETH_HLEN + 7] = 3;
        v[ETH_HLEN + 3] = 0x77;
        v[ETH_HLEN + IPV6_HLEN + 6] = 0x12;
        assert!(decode_frame(&v).is_ok());
    }

    #[test]
    fn ipv4_frames_round_trip() {
        let mut a = RoceAddr {
            dst_mac: [2, 0, 0, 0, 0, 2],
            src_mac: [2, 0, 0, 0, 0, 1],
            hop_limit: 64,
            udp_sport: 0xd123,
            ..RoceAddr::default()
        };
        a.src_gid[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 1]);
        a.dst_gid[10..].copy_from_slice(&[0xff, 0xff, 10, 0, 0, 2]);
        let h = rc_write_first();
        let payload: Vec<u8> = (0..1024u32).map(|i| i as u8).collect();
        let mut out = Vec::new();
        encode_frame(&a, &h, &payload, &mut out);
        let f = decode_frame(&out).unwrap();
        assert_eq!(f.addr, a);
        assert_eq!(f.hdrs, h);
        assert_eq!(&out[f.payload], &payload[..]);
        // The GRH a UD receive sees: IPv4 header in the last 20 bytes.
        let g = grh(&a, 100);
        assert_eq!(&g[..20], &[0; 20]);
        assert_eq!(g[20], 0x45);
        assert_eq!(&g[32..36], &[10, 0, 0, 1]);
        assert!(is_roce_v2(&out), "a RoCEv2 frame by its headers");
        // The same frame to UDP port 7000, cut to a one-byte datagram:
        // another protocol's, not a short RoCE packet.
        let mut other = out[..ETH_HLEN + IPV4_HLEN + UDP_HLEN + 1].to_vec();
        let udp = ETH_HLEN + IPV4_HLEN;
        other[udp + 2..udp + 4].copy_from_slice(&7000u16.to_be_bytes());
        other[ETH_HLEN + 2..ETH_HLEN + 4].copy_from_slice(&29u16.to_be_bytes());
        assert!(!is_roce_v2(&other));
        assert!(matches!(decode_frame(&other), Err(PacketError::NotRoce(_))));
        assert!(!is_roce_v2(&out[..13]), "shorter than Ethernet");
    }
}
