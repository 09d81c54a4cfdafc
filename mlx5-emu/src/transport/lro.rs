//! Large receive offload (LRO) on striding RQs: a TIR with
//! `lro_enable_mask` (`PACKET_MERGE_MASK`) lets the device merge the TCP
//! segments of one flow that arrive in order into one packet in the
//! strides of one WQE, completed by one CQE, as mlx5e asks with `ethtool -K
//! lro on` once its RQs stride.
//!
//! A session opens on a segment that may be merged ([`segment`]: IPv4
//! without options or fragments, or IPv6 without extension headers, as the
//! TIR's mask allows; TCP with ACK, none of SYN/FIN/RST/URG/ECE/CWR, no
//! option but the timestamp; a payload; good checksums; no VLAN tag left
//! in the frame). The first segment lands whole; each next one of the same
//! flow whose sequence number follows on lands its payload right after,
//! while the merged IP payload stays within `lro_max_ip_payload_size` (256
//! byte units) and the WQE's strides hold it. A segment with PSH ends the
//! session after it; anything else for the RQ ends it before itself; the
//! TIR's `lro_timeout_period_usecs` ends it once it has been open that
//! long (on the function's clock, looked at each pass of its data path);
//! and the end of the sending SQ's burst ends it (a frame from another
//! process's port, over the wire, has no such burst: the RQ's function
//! ends its session idle for one pass of its data path), which the
//! device's timer would do only later. `lro_min_mss_size` is not applied
//! (no driver reads it; DPDK only logs it). The CQE of a session of two or more segments carries, as
//! mlx5e's `mlx5e_lro_update_hdr` reads them: the segment count in the top
//! byte of `srqn`, PSH (`tcppsh_abort_dupack` bit 6), the least TTL or hop
//! limit, the last segment's window and acknowledgement number, and
//! `check_sum` the one's-complement sum of the merged TCP payload only;
//! the headers in the buffer stay the first segment's. A session of one
//! segment completes as any frame does.

use std::time::{Duration, Instant};

use mlx5_hw::cqe::CQE_LRO_TCPPSH_SHIFT;

use super::cq::Completion;
use super::steer::{Parsed, ETH_HLEN, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP};

/// The function whose SQ's burst fed a session (its `Rdma`'s address:
/// an identity, never dereferenced), so that the burst's end closes
/// exactly those sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sender(usize);

impl Sender {
    pub(crate) fn of(rdma: &super::Rdma) -> Self {
        Self(rdma as *const super::Rdma as usize)
    }
}

/// Idle passes after which even a held session closes.
pub(crate) const HELD_IDLE_PASSES: u32 = 100_000;

/// A TIR's LRO configuration, as steering hands it to the RQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lro {
    /// Merge TCP over IPv4 (`lro_enable_mask` bit 0).
    pub ipv4: bool,
    /// Merge TCP over IPv6 (bit 1).
    pub ipv6: bool,
    /// The largest merged IP payload, in bytes.
    pub max_payload: u32,
    /// `lro_timeout_period_usecs`: a session closes once open this long
    /// (0: no timer).
    pub timeout: Duration,
}

impl Lro {
    /// The TIR context's LRO fields; none when its mask is clear.
    pub(crate) fn of(tirc: &[u8]) -> Option<Self> {
        use mlx5_hw::eth::{
            TIRC_PACKET_MERGE_MASK_IPV4_LRO as V4, TIRC_PACKET_MERGE_MASK_IPV6_LRO as V6,
        };
        use mlx5_hw::ifc::tirc;
        let mask = tirc::PACKET_MERGE_MASK.get(tirc);
        (mask & (V4 | V6) != 0).then(|| Self {
            ipv4: mask & V4 != 0,
            ipv6: mask & V6 != 0,
            max_payload: (tirc::LRO_MAX_IP_PAYLOAD_SIZE.get(tirc) as u32) << 8,
            timeout: Duration::from_micros(tirc::LRO_TIMEOUT_PERIOD_USECS.get(tirc)),
        })
    }
}

/// TCP flags.
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_ECE: u8 = 0x40;
const TCP_CWR: u8 = 0x80;
/// The TCP timestamp option as Linux aligns it: NOP, NOP, kind 8, length 10.
const TCP_TIMESTAMP: [u8; 4] = [1, 1, 8, 10];

/// A TCP segment the device may merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Addresses and ports, in the frame's order (IPv4's 12 bytes, zeroes
    /// after them).
    key: [u8; 36],
    ipv6: bool,
    seq: u32,
    ack: u32,
    win: u16,
    ttl: u8,
    /// PSH set: the session ends with it.
    pub psh: bool,
    /// Bytes before the payload: Ethernet, IP and TCP headers.
    hdr_len: usize,
    /// Payload bytes (up to the IP packet's end: tail padding is not).
    payload: usize,
}

impl Segment {
    /// Where its payload lies in the frame.
    pub(crate) fn payload(&self) -> std::ops::Range<usize> {
        self.hdr_len..self.hdr_len + self.payload
    }

    /// The frame's bytes up to the IP packet's end.
    pub(crate) fn end(&self) -> usize {
        self.hdr_len + self.payload
    }
}

fn be16(f: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([f[at], f[at + 1]])
}

fn be32(f: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([f[at], f[at + 1], f[at + 2], f[at + 3]])
}

/// `frame` (as it lands, after any VLAN strip) as a segment `cfg` lets
/// the device merge; none otherwise (module docs).
pub(crate) fn segment(frame: &[u8], p: &Parsed, cfg: Lro) -> Option<Segment> {
    if !(p.l3_ok && p.l4_ok) {
        return None;
    }
    let ip = ETH_HLEN;
    let mut key = [0u8; 36];
    let (ipv6, l4, ip_end, ttl) = match be16(frame.get(..ip)?, 12) {
        ETH_P_IP if cfg.ipv4 => {
            let h = frame.get(ip..ip + 20)?;
            // No options, no fragment (DF may be set), TCP.
            if h[0] != 0x45 || be16(h, 6) & 0x3fff != 0 || h[9] != IPPROTO_TCP {
                return None;
            }
            key[..8].copy_from_slice(&h[12..20]);
            (false, ip + 20, ip + usize::from(be16(h, 2)), h[8])
        }
        ETH_P_IPV6 if cfg.ipv6 => {
            let h = frame.get(ip..ip + 40)?;
            if h[0] >> 4 != 6 || h[6] != IPPROTO_TCP {
                return None;
            }
            key[..32].copy_from_slice(&h[8..40]);
            (true, ip + 40, ip + 40 + usize::from(be16(h, 4)), h[7])
        }
        _ => return None,
    };
    let t = frame.get(l4..l4 + 20)?;
    let doff = usize::from(t[12] >> 4) * 4;
    let flags = t[13];
    let refused = TCP_FIN | TCP_SYN | TCP_RST | TCP_URG | TCP_ECE | TCP_CWR;
    if flags & TCP_ACK == 0 || flags & refused != 0 {
        return None;
    }
    match doff {
        20 => {}
        32 if frame.get(l4 + 20..l4 + 24)? == TCP_TIMESTAMP => {}
        _ => return None,
    }
    let hdr_len = l4 + doff;
    if ip_end > frame.len() || ip_end <= hdr_len {
        return None;
    }
    let at = if ipv6 { 32 } else { 8 };
    key[at..at + 4].copy_from_slice(&t[..4]);
    Some(Segment {
        key,
        ipv6,
        seq: be32(t, 4),
        ack: be32(t, 8),
        win: be16(t, 14),
        ttl,
        psh: flags & TCP_PSH != 0,
        hdr_len,
        payload: ip_end - hdr_len,
    })
}

/// An open session: where its packet lies and what its CQE will say.
#[derive(Debug)]
pub(crate) struct Session {
    /// The WQE and its first stride.
    pub at: u16,
    pub first: u32,
    /// Bytes of the merged packet (the first segment's headers included).
    pub bytes: u32,
    /// The CQE the first segment would have had alone.
    cqe: Completion,
    key: [u8; 36],
    ipv6: bool,
    hdr_len: usize,
    next_seq: u32,
    /// Merged IP payload (TCP header and data).
    ip_payload: u32,
    max_payload: u32,
    segs: u32,
    ack: u32,
    win: u16,
    min_ttl: u8,
    psh: bool,
    /// One's-complement sum of the TCP payload so far (unfolded).
    sum: u64,
    /// Payload bytes so far (an odd count shifts the next one's sum).
    data: u64,
    /// A segment joined since the function's data path last looked.
    pub touched: bool,
    /// A local SQ's burst last fed it: that burst's end closes it
    /// ([`super::eth_rx::end_burst`]), not the receiver's idle pass.
    pub held: Option<Sender>,
    /// Passes of the receiver's data path since a segment joined; a held
    /// session still open after [`HELD_IDLE_PASSES`] closes anyway (a
    /// safety net: its burst ends in the same call that fed it).
    pub idle: u32,
    /// When the session's timer runs out (`lro_timeout_period_usecs` from
    /// its first segment, on the function's clock); none without one.
    pub expires: Option<Instant>,
}

/// The one's-complement sum of `b` as 16-bit big-endian words, unfolded.
fn sum16(b: &[u8]) -> u64 {
    b.chunks(2)
        .map(|w| u64::from(w[0]) << 8 | u64::from(*w.get(1).unwrap_or(&0)))
        .sum()
}

fn fold(mut s: u64) -> u16 {
    while s >> 16 != 0 {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

impl Session {
    /// A session of segment `s` of `frame`, placed at stride `first` of
    /// WQE `at`; `cqe`: the completion it would have had alone.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn start(
        s: &Segment,
        frame: &[u8],
        cfg: Lro,
        at: u16,
        first: u32,
        cqe: Completion,
        held: Option<Sender>,
        now: Instant,
    ) -> Self {
        let data = &frame[s.payload()];
        Self {
            at,
            first,
            bytes: s.end() as u32,
            cqe,
            key: s.key,
            ipv6: s.ipv6,
            hdr_len: s.hdr_len,
            next_seq: s.seq.wrapping_add(s.payload as u32),
            ip_payload: (s.end() - ETH_HLEN - if s.ipv6 { 40 } else { 20 }) as u32,
            max_payload: cfg.max_payload,
            segs: 1,
            ack: s.ack,
            win: s.win,
            min_ttl: s.ttl,
            psh: s.psh,
            sum: sum16(data),
            data: data.len() as u64,
            touched: true,
            held,
            idle: 0,
            expires: (!cfg.timeout.is_zero()).then(|| vfio::clock::later(now, cfg.timeout)),
        }
    }

    /// Whether the session closes now: at a pass of the function's data
    /// path (`burst_end` none) once its timer has run out (`now`: the
    /// clock), or once it was idle for a pass (held by a burst: for
    /// [`HELD_IDLE_PASSES`]); at the end of the burst that holds it.
    pub(crate) fn closes(
        &mut self,
        burst_end: Option<Sender>,
        now: impl FnOnce() -> Instant,
    ) -> bool {
        match burst_end {
            Some(b) => self.held == Some(b),
            None if self.expires.is_some_and(|t| now() >= t) => true,
            None if self.held.is_some() => {
                self.idle += 1;
                self.idle >= HELD_IDLE_PASSES
            }
            None => !std::mem::take(&mut self.touched),
        }
    }

    /// Whether `s` continues this session's flow in order, within its
    /// payload limit, and fits in `room` more bytes of the WQE.
    pub(crate) fn takes(&self, s: &Segment, room: u64) -> bool {
        !self.psh
            && s.key == self.key
            && s.ipv6 == self.ipv6
            && s.hdr_len == self.hdr_len
            && s.seq == self.next_seq
            && self.ip_payload + s.payload as u32 <= self.max_payload
            && s.payload as u64 <= room
    }

    /// Segment `s` of `frame` joined (its payload already placed);
    /// `held`: the function whose SQ's burst sent it, if local.
    pub(crate) fn join(&mut self, s: &Segment, frame: &[u8], held: Option<Sender>) {
        self.held = held.or(self.held);
        self.idle = 0;
        let data = &frame[s.payload()];
        let sum = sum16(data);
        // A payload starting at an odd offset of the whole sums byte-swapped.
        self.sum += if self.data % 2 == 1 {
            u64::from(fold(sum).swap_bytes())
        } else {
            sum
        };
        self.data += data.len() as u64;
        self.bytes += s.payload as u32;
        self.ip_payload += s.payload as u32;
        self.next_seq = self.next_seq.wrapping_add(s.payload as u32);
        self.segs += 1;
        self.ack = s.ack;
        self.win = s.win;
        self.min_ttl = self.min_ttl.min(s.ttl);
        self.psh |= s.psh;
        self.touched = true;
    }

    /// Whether no segment may join any more (PSH seen).
    pub(crate) fn ended(&self) -> bool {
        self.psh
    }

    /// The session's CQE, `strides` of `log_size` consumed.
    pub(crate) fn completion(&self, strides: u32) -> Completion {
        use mlx5_hw::eth::MPWRQ_CQE_STRIDES_SHIFT;
        let mut c = self.cqe;
        c.byte_cnt = strides << MPWRQ_CQE_STRIDES_SHIFT | self.bytes;
        if self.segs > 1 {
            c.lro = Some(LroCqe {
                num_seg: self.segs.min(0xff) as u8,
                tcppsh_abort_dupack: u8::from(self.psh) << CQE_LRO_TCPPSH_SHIFT,
                min_ttl: self.min_ttl,
                tcp_win: self.win,
                ack_seq_num: self.ack,
            });
            if let Some(e) = c.eth.as_mut() {
                e.check_sum = fold(self.sum);
            }
        }
        c
    }
}

/// The LRO fields of a merged packet's CQE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LroCqe {
    /// Segments merged (the top byte of `srqn`).
    pub num_seg: u8,
    pub tcppsh_abort_dupack: u8,
    pub min_ttl: u8,
    pub tcp_win: u16,
    pub ack_seq_num: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A session of one 100-byte segment, its TIR's timer `timeout`,
    /// started at `now`, held by `held`.
    fn session(timeout: Duration, now: Instant, held: Option<Sender>) -> Session {
        let s = Segment {
            key: [1; 36],
            ipv6: false,
            seq: 1,
            ack: 2,
            win: 3,
            ttl: 64,
            psh: false,
            hdr_len: 66,
            payload: 100,
        };
        let cfg = Lro {
            ipv4: true,
            ipv6: false,
            max_payload: 64 << 10,
            timeout,
        };
        Session::start(&s, &[0; 166], cfg, 0, 0, Completion::default(), held, now)
    }

    /// The TIR's `lro_timeout_period_usecs` closes a session at the first
    /// pass after it ran out, however busy (touched) or held it is; before
    /// that a touched session stays, and one idle for a pass closes; a
    /// timer of 0 is none.
    #[test]
    fn the_timer_closes_a_session_once_it_ran_out() {
        let t0 = Instant::now();
        let us = Duration::from_micros;
        let mut s = session(us(32), t0, None);
        assert!(!s.closes(None, || t0 + us(31)), "touched, 31 us");
        s.touched = true;
        assert!(s.closes(None, || t0 + us(32)), "touched, 32 us: the timer");
        let mut s = session(us(32), t0, None);
        assert!(!s.closes(None, || t0), "touched");
        assert!(s.closes(None, || t0), "idle for a pass");
        let held = Some(Sender(1));
        let mut s = session(us(32), t0, held);
        assert!(!s.closes(None, || t0 + us(1)), "held");
        assert!(!s.closes(Some(Sender(2)), || t0), "another burst's end");
        assert!(s.closes(None, || t0 + us(40)), "held, the timer ran out");
        let mut s = session(us(32), t0, held);
        assert!(s.closes(held, || t0), "its burst's end");
        let mut s = session(Duration::ZERO, t0, None);
        assert!(!s.closes(None, || t0 + Duration::from_secs(9)), "no timer");
    }
}
