//! The wire: a port's link to another process over a socket, carrying
//! byte-exact RoCEv2 frames.
//!
//! A [`Link`] joins a fabric ([`crate::Fabric::connect`]) and carries the
//! frames of every packet whose destination GID no function of the fabric
//! answers to, and every raw Ethernet frame a function sends (its SQs:
//! raw packet QPs, mlx5e); a frame from the wire that is Ethernet but not
//! RoCEv2 goes to every function's NIC receive ([`LinkStats::rx_raw`]). Frames are what [`packet::encode_frame`] writes (the same
//! code path as the fabric's wire check) and what
//! [`packet::decode_frame`] reads, in QEMU's netdev formats ([`sock`]):
//! `dgram`, one frame per datagram, and `stream`, each frame after its
//! 4-byte big-endian length. So the other end may be another
//! `mlx5-emu serve`, a QEMU guest's virtio-net NIC, or a test's socket.
//!
//! What the wire promises:
//! - every frame sent and received goes to the capture, if one is open
//!   ([`pcap`]), after the faults (a lost frame is not in it, a corrupted
//!   one is, corrupted);
//! - a frame the model cannot parse, with a bad ICRC, for a GID no function
//!   answers to, over [`MAX_FRAME`] bytes, or cut short is counted
//!   ([`LinkStats`]) and dropped, with a log line the first time and at
//!   every power of two; nothing a peer sends makes the model allocate
//!   more than [`MAX_FRAME`] a frame and [`MAILBOX_MAX`] responses;
//! - faults ([`WireFaults`]) are decided on egress from a seed;
//! - RC recovery is the transport's, as on any wire: the requester sends,
//!   and its responses come back asynchronously to a mailbox its send
//!   queue collects from; an RC request that needs an answer (a READ, an
//!   atomic) waits for it, a burst of SENDs and WRITEs waits for its last
//!   ACK at its end (or every [`WINDOW`] messages); what has not come
//!   within the link's response wait (real time: the peer is another
//!   process) counts as lost, and the requester's ACK timeout and retry
//!   counter (on the model's clock) take over, going back N;
//! - a frame the faults lose, or one that comes corrupted, is known lost at
//!   once, not after the response wait: a frame that came with a bad ICRC
//!   wakes this end's waiting send queue as its wait running out would; an
//!   RC response it lost (or a bad frame, whose direction is not to be
//!   trusted) sends the peer a loss notice ([`LOSS_NOTICE_ETHERTYPE`], not
//!   a RoCE frame, not captured, not counted as a frame; only from a link
//!   that injects faults), which does the same there; an RC request it
//!   lost sends the peer a loss probe, answered by a loss notice behind the
//!   responses to what the peer did receive, so the messages acknowledged
//!   before the lost one complete rather than go again (and spend a retry)
//!   whatever the peer's speed. So recovery from injected faults does not
//!   depend on how fast the machine runs (the response wait only catches
//!   a peer that stopped answering).
//!
//! A request arriving from the wire is executed on the link's receive
//! thread (the responder side only: no requester lock is taken there), its
//! responses sent back at once, the ACK of a packet that asks for one
//! included (no coalescing across the wire).

pub mod impair;
pub(crate) mod pcap;
pub mod sock;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vfio::clock::SharedClock;

pub use impair::{FaultCounts, WireFaults};
pub use sock::{Addr, LinkSpec};

use crate::fabric::{Packet, Payload, Wire};
use crate::lock;
use crate::transport::packet::{self, aeth, op, Headers, PacketError, RoceAddr};
use crate::transport::Rdma;

/// Largest frame taken from the wire (bigger ones are counted as giants):
/// a 4096-byte MTU packet with every header is about 4.2 KiB; QEMU's
/// netdevs carry up to 64 KiB.
pub const MAX_FRAME: usize = 65536;
/// Responses waiting for their send queue, at most (beyond, the oldest of
/// the queue go).
pub const MAILBOX_MAX: usize = 16384;
/// RC SENDs and WRITEs in flight to a peer across the wire before the
/// send queue waits for their ACK.
pub const WINDOW: usize = 32;
/// Packets in flight across a datagram wire before the send queue waits
/// for their ACK: a datagram socket drops what its receive buffer (about
/// 200 KiB by default) cannot hold, so a burst stays well under it.
pub const DGRAM_WINDOW_PACKETS: u32 = 64;
/// The EtherType of a loss notice (IEEE 802 "local experimental 1"):
/// a frame the faults took from an RC exchange ([`Link::send_frame`]),
/// sent to the peer, which then stops waiting for it. Only links that
/// inject faults or receive bad frames send one; another peer (a QEMU
/// NIC) sees a raw frame it drops.
pub const LOSS_NOTICE_ETHERTYPE: u16 = 0x88b5;
/// A loss notice's payload after its Ethernet header.
const LOSS_NOTICE: &[u8; 4] = b"LOST";
/// A loss probe's payload (same EtherType): the sender lost one of its
/// own RC requests and asks the peer for a loss notice, which the peer
/// sends after the responses to everything it received before the probe.
const LOSS_PROBE: &[u8; 4] = b"LOS?";

/// Default real-time wait for a response before it counts as lost.
pub const RESPONSE_WAIT: Duration = Duration::from_millis(200);
/// Where the transport part (BTH) of a RoCEv2 frame starts (after the
/// Ethernet, IPv6 or IPv4, and UDP headers): corruption lands after it.
pub(crate) fn transport_at(f: &[u8]) -> usize {
    let ipv6 = f.get(12..14) == Some(&[0x86, 0xdd][..]);
    packet::ETH_HLEN + if ipv6 { packet::IPV6_HLEN } else { 20 } + 8
}

/// How a link is set up besides its socket.
#[derive(Debug, Clone)]
pub struct LinkOptions {
    /// Capture every frame to this pcap file.
    pub pcap: Option<PathBuf>,
    /// Faults on the frames this end sends.
    pub faults: WireFaults,
    /// The clock delays are on (the functions' clock).
    pub clock: SharedClock,
    /// How long (real time) a send queue waits for a response from the
    /// other process before it counts as lost.
    pub response_wait: Duration,
}

impl Default for LinkOptions {
    fn default() -> Self {
        Self {
            pcap: None,
            faults: WireFaults::default(),
            clock: vfio::clock::system(),
            response_wait: RESPONSE_WAIT,
        }
    }
}

/// What a link counted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Frames sent on the socket.
    pub tx_frames: u64,
    /// Of `tx_frames`, those that are Ethernet but not RoCEv2 (the raw
    /// frames of functions' SQs).
    pub tx_raw: u64,
    /// Frames the socket refused (no peer connected, peer gone).
    pub tx_errors: u64,
    /// Frames received.
    pub rx_frames: u64,
    /// Frames received that are not RoCEv2 or do not parse.
    pub rx_malformed: u64,
    /// Frames received with a bad ICRC.
    pub rx_bad_icrc: u64,
    /// Frames received for a GID no function on this fabric answers to.
    pub rx_unknown_gid: u64,
    /// Frames received over [`MAX_FRAME`] bytes.
    pub rx_giant: u64,
    /// Frames cut short by the end of the stream.
    pub rx_truncated: u64,
    /// Responses nobody collected in time (the mailbox overflowed) or
    /// that came for no message in flight (late, duplicated).
    pub rx_stale: u64,
    /// Requests and responses handed to the transport.
    pub rx_delivered: u64,
    /// Ethernet frames that are not RoCEv2, handed to every function's NIC
    /// receive (flow steering, raw packet QPs, mlx5e's RQs).
    pub rx_raw: u64,
    /// Responses a send queue gave up waiting for (real time).
    pub response_timeouts: u64,
    /// Waits ended at once by a known loss (this end's, or a notice).
    pub loss_wakeups: u64,
    /// Loss notices sent to the peer (not frames).
    pub tx_loss_notices: u64,
    /// Loss notices taken from the peer (not frames).
    pub rx_loss_notices: u64,
    /// Loss probes sent to the peer for a request this end lost (not
    /// frames).
    pub tx_loss_probes: u64,
    /// Loss probes taken from the peer, each answered by a loss notice.
    pub rx_loss_probes: u64,
    /// What the faults did to this end's frames.
    pub faults: FaultCounts,
}

impl LinkStats {
    /// Frames received and dropped, all causes.
    pub fn rx_dropped(&self) -> u64 {
        self.rx_malformed
            + self.rx_bad_icrc
            + self.rx_unknown_gid
            + self.rx_giant
            + self.rx_truncated
    }
}

#[derive(Debug, Default)]
struct Counts {
    tx_frames: AtomicU64,
    tx_raw: AtomicU64,
    tx_errors: AtomicU64,
    rx_frames: AtomicU64,
    rx_malformed: AtomicU64,
    rx_bad_icrc: AtomicU64,
    rx_unknown_gid: AtomicU64,
    rx_giant: AtomicU64,
    rx_truncated: AtomicU64,
    rx_stale: AtomicU64,
    rx_delivered: AtomicU64,
    rx_raw: AtomicU64,
    response_timeouts: AtomicU64,
    loss_wakeups: AtomicU64,
    tx_loss_notices: AtomicU64,
    rx_loss_notices: AtomicU64,
    tx_loss_probes: AtomicU64,
    rx_loss_probes: AtomicU64,
}

/// A response as it came off the wire, waiting for its send queue.
#[derive(Debug)]
struct Resp {
    addr: RoceAddr,
    hdrs: Headers,
    payload: Vec<u8>,
}

/// Responses by (receiving function, QP).
#[derive(Debug, Default)]
struct Mailbox {
    q: HashMap<(usize, u32), VecDeque<Resp>>,
    total: usize,
    /// Frames of RC exchanges known lost and not yet waited out: the next
    /// wait that finds no response ends at once, one each.
    losses: u64,
}

/// What a send queue waits for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// Nothing: take what has come.
    Nothing,
    /// The answer to a READ or an atomic sent with this PSN.
    Answer(u32),
    /// The ACK of this PSN (the last message in flight).
    Ack(u32),
}

/// `a` is at or before `b` in PSN order.
fn psn_le(a: u32, b: u32) -> bool {
    b.wrapping_sub(a) & 0xff_ffff < 0x80_0000
}

/// Whether a BTH opcode is a response (requester-bound).
fn is_response(opcode: u8) -> bool {
    packet::rc_like(opcode)
        && matches!(
            opcode & 0x1f,
            op::READ_RESPONSE_FIRST..=op::ATOMIC_ACKNOWLEDGE
        )
}

/// A port's link to another process.
#[derive(Debug)]
pub struct Link {
    spec: LinkSpec,
    ep: sock::Endpoint,
    pcap: Option<Mutex<pcap::Pcap>>,
    impair: Mutex<impair::Impair>,
    counts: Counts,
    mailbox: Mutex<Mailbox>,
    arrived: Condvar,
    wire: Weak<Wire>,
    clock: SharedClock,
    wait: Duration,
    stop: AtomicBool,
    rx_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Link {
    /// Opens the socket (and the capture) and starts the receive thread;
    /// frames for `wire`'s functions are delivered to them.
    pub(crate) fn open(
        spec: &LinkSpec,
        opts: &LinkOptions,
        wire: &Arc<Wire>,
    ) -> std::io::Result<Arc<Self>> {
        let ep = sock::Endpoint::open(spec)?;
        let pcap = match &opts.pcap {
            Some(p) => Some(Mutex::new(pcap::Pcap::create(p)?)),
            None => None,
        };
        let link = Arc::new(Self {
            spec: spec.clone(),
            ep,
            pcap,
            impair: Mutex::new(impair::Impair::new(opts.faults)),
            counts: Counts::default(),
            mailbox: Mutex::new(Mailbox::default()),
            arrived: Condvar::new(),
            wire: Arc::downgrade(wire),
            clock: opts.clock.clone(),
            wait: opts.response_wait,
            stop: AtomicBool::new(false),
            rx_thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&link);
        let h = std::thread::Builder::new()
            .name("mlx5-emu-wire".into())
            .spawn(move || rx_loop(&weak))?;
        *lock(&link.rx_thread) = Some(h);
        tracing::info!(wire = %spec, "wire up");
        Ok(link)
    }

    /// The socket spec.
    pub fn spec(&self) -> &LinkSpec {
        &self.spec
    }

    /// How many packets a send queue keeps in flight on this link before
    /// it waits for their ACK (a stream loses nothing: no limit but
    /// [`WINDOW`] messages).
    pub(crate) fn window_packets(&self) -> u32 {
        match self.spec {
            LinkSpec::Dgram { .. } => DGRAM_WINDOW_PACKETS,
            LinkSpec::Stream { .. } => u32::MAX,
        }
    }

    /// The bound local address of a UDP end or a TCP server (to learn the
    /// port the system chose for port 0).
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.ep.local_addr()
    }

    /// What the link counted.
    pub fn stats(&self) -> LinkStats {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let c = &self.counts;
        LinkStats {
            tx_frames: g(&c.tx_frames),
            tx_raw: g(&c.tx_raw),
            tx_errors: g(&c.tx_errors),
            rx_frames: g(&c.rx_frames),
            rx_malformed: g(&c.rx_malformed),
            rx_bad_icrc: g(&c.rx_bad_icrc),
            rx_unknown_gid: g(&c.rx_unknown_gid),
            rx_giant: g(&c.rx_giant),
            rx_truncated: g(&c.rx_truncated),
            rx_stale: g(&c.rx_stale),
            rx_delivered: g(&c.rx_delivered),
            rx_raw: g(&c.rx_raw),
            response_timeouts: g(&c.response_timeouts),
            loss_wakeups: g(&c.loss_wakeups),
            tx_loss_notices: g(&c.tx_loss_notices),
            rx_loss_notices: g(&c.rx_loss_notices),
            tx_loss_probes: g(&c.tx_loss_probes),
            rx_loss_probes: g(&c.rx_loss_probes),
            faults: lock(&self.impair).counts,
        }
    }

    /// Sets the faults of the frames this end sends (the generator starts
    /// again from their seed).
    pub fn set_faults(&self, f: WireFaults) {
        let mut im = lock(&self.impair);
        let counts = im.counts;
        let mut out = Vec::new();
        im.idle(
            vfio::clock::later(self.clock.now(), Duration::from_secs(1 << 20)),
            &mut out,
        );
        *im = impair::Impair::new(f);
        im.counts = counts;
        drop(im);
        for fr in out {
            self.put(&fr);
        }
    }

    /// Stops the receive thread and closes the socket's connection.
    pub fn close(&self) {
        self.stop.store(true, Ordering::Release);
        self.ep.close();
        let h = lock(&self.rx_thread).take();
        if let Some(h) = h {
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
        if let Some(p) = &self.pcap {
            let _ = lock(p).flush();
        }
    }

    /// Sends one frame through the faults to the capture and the socket.
    /// An RC frame the faults lose is known lost at once: a response's
    /// send queue (the peer's) is sent a loss notice; for a request, this
    /// end's send queue stops waiting once the peer answers a loss probe,
    /// that is once the responses to what the peer did receive are here
    /// (as a real requester's ACK timeout finds them): the messages
    /// acknowledged before the lost one complete and are not sent again,
    /// however slowly the peer runs.
    pub(crate) fn send_frame(&self, frame: Vec<u8>) {
        let mut out = Vec::new();
        let lost = lock(&self.impair).frame(frame, self.clock.now(), &mut out);
        for f in out {
            self.put(&f);
        }
        if let Some(f) = lost {
            // Only an RC exchange waits for what was lost.
            let rc_opcode = packet::is_roce_v2(&f)
                .then(|| f.get(transport_at(&f)).copied())
                .flatten()
                .filter(|&o| packet::rc_like(o));
            match rc_opcode {
                Some(o) if is_response(o) => self.send_loss_notice(),
                Some(_) => self.send_loss_probe(),
                None => {}
            }
        }
    }

    /// A frame of an RC exchange of this end's send queues is lost: the
    /// next wait that finds nothing ends at once.
    fn note_loss(&self) {
        lock(&self.mailbox).losses += 1;
        self.arrived.notify_all();
    }

    /// Tells the peer a frame for its send queues is lost (a link that
    /// injects faults: its peer is then a test's or an experiment's).
    fn send_loss_notice(&self) {
        let mut f = vec![0u8; 60];
        f[..6].fill(0xff);
        f[12..14].copy_from_slice(&LOSS_NOTICE_ETHERTYPE.to_be_bytes());
        f[14..18].copy_from_slice(LOSS_NOTICE);
        if self.ep.send(&f).is_ok() {
            self.counts.tx_loss_notices.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Asks the peer for a loss notice after what it received so far
    /// ([`LOSS_PROBE`]); where the probe cannot be sent, the loss is this
    /// end's at once.
    fn send_loss_probe(&self) {
        let mut f = vec![0u8; 60];
        f[..6].fill(0xff);
        f[12..14].copy_from_slice(&LOSS_NOTICE_ETHERTYPE.to_be_bytes());
        f[14..18].copy_from_slice(LOSS_PROBE);
        if self.ep.send(&f).is_ok() {
            self.counts.tx_loss_probes.fetch_add(1, Ordering::Relaxed);
        } else {
            self.note_loss();
        }
    }

    /// One frame onto the socket (and the capture).
    fn put(&self, f: &[u8]) {
        if let Some(p) = &self.pcap {
            let _ = lock(p).frame(f);
        }
        match self.ep.send(f) {
            Ok(()) => {
                self.counts.tx_frames.fetch_add(1, Ordering::Relaxed);
                if !packet::is_roce_v2(f) {
                    self.counts.tx_raw.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(e) => {
                let n = self.counts.tx_errors.fetch_add(1, Ordering::Relaxed) + 1;
                if n.is_power_of_two() {
                    tracing::warn!(wire = %self.spec, error = %e, count = n, "frame not sent");
                }
            }
        }
    }

    /// Encodes and sends one packet.
    pub(crate) fn send_packet(&self, pkt: &Packet<'_>) {
        let mut f = Vec::new();
        if crate::fabric::encode(pkt, &mut f).is_err() {
            return;
        }
        self.send_frame(f);
    }

    /// A requester's packet from `src`'s QP `src_qpn`: sent, then the
    /// responses that came for that QP go to `reply`; for a READ or an
    /// atomic, until its answer comes (or the wait runs out).
    pub(crate) fn transmit(
        &self,
        src: &Rdma,
        src_qpn: u32,
        pkt: &Packet<'_>,
        reply: &mut dyn FnMut(&Packet<'_>),
    ) {
        let b = &pkt.hdr.bth;
        let until = match b.opcode & 0x1f {
            op::READ_REQUEST | op::COMPARE_SWAP | op::FETCH_ADD if packet::rc_like(b.opcode) => {
                Until::Answer(b.psn)
            }
            _ => Until::Nothing,
        };
        if matches!(until, Until::Answer(_)) {
            // The messages before a READ or an atomic were acknowledged
            // before it is sent: what waits for this QP now answers an
            // earlier try of the same PSNs (a READ sent again). Taken for
            // this try, an old READ response would look like a gap and
            // send it again, and again, as each try's stragglers met the
            // next (RETRY_EXC under load).
            self.discard_waiting(src, src_qpn);
        }
        self.send_packet(pkt);
        if packet::rc_like(b.opcode) {
            self.collect(src, src_qpn, until, reply);
        }
    }

    /// Hands the responses that came for `src`'s QP `qpn` to `reply`,
    /// waiting (real time, at most the link's response wait) for what
    /// `until` names. Responses that belong to nothing in flight (a read
    /// response while waiting for an ACK) are dropped as stale.
    pub(crate) fn collect(
        &self,
        src: &Rdma,
        qpn: u32,
        until: Until,
        reply: &mut dyn FnMut(&Packet<'_>),
    ) {
        let key = (std::ptr::from_ref(src) as usize, qpn);
        let deadline = Instant::now() + self.wait;
        let mut got = Vec::new();
        let mut lost = false;
        loop {
            {
                let mut mb = lock(&self.mailbox);
                loop {
                    if let Some(q) = mb.q.get_mut(&key) {
                        got.extend(q.drain(..));
                    }
                    if !got.is_empty() || matches!(until, Until::Nothing) {
                        break;
                    }
                    if mb.losses > 0 {
                        mb.losses -= 1;
                        lost = true;
                        break;
                    }
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    mb = self
                        .arrived
                        .wait_timeout(mb, deadline - now)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                mb.total -= got.len();
                if mb.q.get(&key).is_some_and(VecDeque::is_empty) {
                    mb.q.remove(&key);
                }
            }
            let mut done = matches!(until, Until::Nothing);
            for r in got.drain(..) {
                if !self.wanted(&r, until) {
                    self.counts.rx_stale.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                done |= ends(&r, until);
                tracing::trace!(
                    qpn,
                    opcode = r.hdrs.bth.opcode,
                    psn = r.hdrs.bth.psn,
                    syndrome = r.hdrs.aeth.map(|a| a.syndrome),
                    ?until,
                    "response collected"
                );
                reply(&Packet {
                    addr: &r.addr,
                    hdr: &r.hdrs,
                    payload: if r.payload.is_empty() {
                        Payload::None
                    } else {
                        Payload::Bytes(&r.payload)
                    },
                });
            }
            if done {
                if !matches!(until, Until::Nothing) {
                    // What was waited for came: a loss noted meanwhile
                    // was one the exchange got over (a NAK, a retry).
                    lock(&self.mailbox).losses = 0;
                }
                return;
            }
            if lost {
                tracing::debug!(qpn, ?until, "a frame of the exchange was lost");
                self.counts.loss_wakeups.fetch_add(1, Ordering::Relaxed);
                return;
            }
            if Instant::now() >= deadline {
                tracing::debug!(qpn, ?until, "no response in time");
                self.counts
                    .response_timeouts
                    .fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Drops the responses waiting for `src`'s QP `qpn` (stale).
    fn discard_waiting(&self, src: &Rdma, qpn: u32) {
        let key = (std::ptr::from_ref(src) as usize, qpn);
        let mut mb = lock(&self.mailbox);
        if let Some(q) = mb.q.remove(&key) {
            mb.total -= q.len();
            self.counts
                .rx_stale
                .fetch_add(q.len() as u64, Ordering::Relaxed);
        }
    }

    /// Whether a response belongs to what the send queue waits for:
    /// ACKs and NAKs always; read responses and atomic acknowledgements
    /// only for the READ or atomic in flight (at or after its PSN).
    fn wanted(&self, r: &Resp, until: Until) -> bool {
        let o = r.hdrs.bth.opcode & 0x1f;
        if o == op::ACKNOWLEDGE {
            return true;
        }
        match until {
            Until::Answer(p) => psn_le(p, r.hdrs.bth.psn) || nak(r),
            _ => false,
        }
    }

    /// Takes one frame off the wire.
    fn receive(&self, f: &[u8]) {
        if f.get(12..14) == Some(&LOSS_NOTICE_ETHERTYPE.to_be_bytes()[..])
            && f.get(14..18) == Some(&LOSS_NOTICE[..])
        {
            self.counts.rx_loss_notices.fetch_add(1, Ordering::Relaxed);
            self.note_loss();
            return;
        }
        if f.get(12..14) == Some(&LOSS_NOTICE_ETHERTYPE.to_be_bytes()[..])
            && f.get(14..18) == Some(&LOSS_PROBE[..])
        {
            // Frames are taken in order and each request's responses are
            // sent before the next frame: the notice follows them.
            self.counts.rx_loss_probes.fetch_add(1, Ordering::Relaxed);
            self.send_loss_notice();
            return;
        }
        self.counts.rx_frames.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = &self.pcap {
            let _ = lock(p).frame(f);
        }
        let fr = match packet::decode_frame(f) {
            Ok(fr) => fr,
            // Ethernet, but not RoCEv2: the NICs' business.
            Err(PacketError::NotRoce(_)) => {
                self.receive_raw(f);
                return;
            }
            Err(e) => {
                let icrc = matches!(e, PacketError::Icrc { .. });
                let c = if icrc {
                    &self.counts.rx_bad_icrc
                } else {
                    &self.counts.rx_malformed
                };
                self.dropped(c, "frame dropped", &e);
                if icrc {
                    // Lost for whichever end waits for it: its headers
                    // are not to be trusted to say which. A peer sending
                    // bad frames to a link without faults gets nothing
                    // back for them.
                    self.note_loss();
                    if lock(&self.impair).faults.any() {
                        self.send_loss_notice();
                    }
                }
                return;
            }
        };
        if packet::is_multicast_gid(&fr.addr.dst_gid) {
            self.receive_multicast(&fr.addr, &fr.hdrs, &f[fr.payload.clone()]);
            return;
        }
        let Some(dst) = self.wire.upgrade().and_then(|w| w.find(&fr.addr.dst_gid)) else {
            let gid = std::net::Ipv6Addr::from(fr.addr.dst_gid);
            self.dropped(
                &self.counts.rx_unknown_gid,
                "frame for an unknown GID",
                &gid,
            );
            return;
        };
        self.counts.rx_delivered.fetch_add(1, Ordering::Relaxed);
        dst.counters
            .packets_received
            .fetch_add(1, Ordering::Relaxed);
        let payload = &f[fr.payload.clone()];
        if is_response(fr.hdrs.bth.opcode) {
            self.post(&dst, fr.addr, fr.hdrs, payload);
            return;
        }
        let pkt = Packet {
            addr: &fr.addr,
            hdr: &fr.hdrs,
            payload: if payload.is_empty() {
                Payload::None
            } else {
                Payload::Bytes(payload)
            },
        };
        let mem = dst.dma.memory();
        let send = &mut |r: &Packet<'_>| self.send_packet(r);
        crate::transport::responder::receive(&dst, &mem, None, true, None, &pkt, send);
        if fr.hdrs.bth.ack_req && packet::rc_like(fr.hdrs.bth.opcode) {
            crate::transport::responder::drained(&dst, &fr.addr, fr.hdrs.bth.dest_qp, send);
        }
    }

    /// A UD datagram to a multicast group reaches every function's port,
    /// whose responder hands it to the group's QPs; nothing answers it.
    fn receive_multicast(&self, addr: &RoceAddr, hdrs: &Headers, payload: &[u8]) {
        self.counts.rx_delivered.fetch_add(1, Ordering::Relaxed);
        let pkt = Packet {
            addr,
            hdr: hdrs,
            payload: if payload.is_empty() {
                Payload::None
            } else {
                Payload::Bytes(payload)
            },
        };
        for dst in self.wire.upgrade().map(|w| w.ports()).unwrap_or_default() {
            dst.counters
                .packets_received
                .fetch_add(1, Ordering::Relaxed);
            let mem = dst.dma.memory();
            crate::transport::responder::receive(&dst, &mem, None, true, None, &pkt, &mut |_| {});
        }
    }

    /// An Ethernet frame that is not RoCEv2 reaches every function's port,
    /// as a raw frame sent inside the fabric reaches the others
    /// ([`crate::transport::eth_rx`]).
    fn receive_raw(&self, f: &[u8]) {
        self.counts.rx_raw.fetch_add(1, Ordering::Relaxed);
        for dst in self.wire.upgrade().map(|w| w.ports()).unwrap_or_default() {
            crate::transport::eth_rx::receive(&dst, f);
        }
    }

    /// A response for `dst`'s QP waits in the mailbox.
    fn post(&self, dst: &Arc<Rdma>, addr: RoceAddr, hdrs: Headers, payload: &[u8]) {
        let key = (Arc::as_ptr(dst) as usize, hdrs.bth.dest_qp);
        let mut mb = lock(&self.mailbox);
        if mb.total >= MAILBOX_MAX {
            // The oldest response of the fullest-looking queue: this one's.
            let q = mb.q.entry(key).or_default();
            if q.pop_front().is_some() {
                mb.total -= 1;
            }
            self.counts.rx_stale.fetch_add(1, Ordering::Relaxed);
            if mb.total >= MAILBOX_MAX {
                return;
            }
        }
        mb.q.entry(key).or_default().push_back(Resp {
            addr,
            hdrs,
            payload: payload.to_vec(),
        });
        mb.total += 1;
        drop(mb);
        self.arrived.notify_all();
    }

    /// Counts a dropped frame, logging the first and every power of two.
    fn dropped(&self, c: &AtomicU64, what: &str, why: &dyn std::fmt::Display) {
        let n = c.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(wire = %self.spec, count = n, %why, "{what}");
        }
    }

    /// Frames held by the faults whose time came (and, idle, reordered
    /// ones: nothing more is coming to overtake).
    fn tick(&self, idle: bool) {
        let mut out = Vec::new();
        {
            let mut im = lock(&self.impair);
            if im.held() == 0 {
                return;
            }
            let now = self.clock.now();
            if idle {
                im.idle(now, &mut out);
            } else {
                im.due(now, &mut out);
            }
        }
        for f in out {
            self.put(&f);
        }
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(p) = &self.pcap {
            let _ = lock(p).flush();
        }
    }
}

/// Whether a response is a NAK or an RNR NAK.
fn nak(r: &Resp) -> bool {
    r.hdrs.aeth.is_some_and(|a| a.syndrome & 0x60 != aeth::ACK)
}

/// Whether a response ends the wait `until`.
fn ends(r: &Resp, until: Until) -> bool {
    let psn = r.hdrs.bth.psn;
    let o = r.hdrs.bth.opcode & 0x1f;
    match until {
        Until::Nothing => true,
        Until::Ack(p) => nak(r) || (o == op::ACKNOWLEDGE && psn_le(p, psn)),
        Until::Answer(p) => {
            nak(r)
                || (matches!(
                    o,
                    op::READ_RESPONSE_LAST | op::READ_RESPONSE_ONLY | op::ATOMIC_ACKNOWLEDGE
                ) && psn_le(p, psn))
        }
    }
}

/// The receive thread: frames off the socket until the link is dropped or
/// closed.
fn rx_loop(link: &Weak<Link>) {
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        let Some(l) = link.upgrade() else {
            return;
        };
        if l.stop.load(Ordering::Acquire) {
            return;
        }
        match l.ep.recv(&mut buf) {
            Ok(sock::Rx::Frame(n)) => {
                l.receive(&buf[..n]);
                l.tick(false);
            }
            Ok(sock::Rx::Giant(n)) => {
                l.dropped(&l.counts.rx_giant, "frame over the size limit", &n);
            }
            Ok(sock::Rx::Idle) => l.tick(true),
            Ok(sock::Rx::Closed { truncated }) => {
                if truncated {
                    l.dropped(
                        &l.counts.rx_truncated,
                        "stream ended inside a frame",
                        &"EOF",
                    );
                }
                tracing::info!(wire = %l.spec, "wire peer closed");
            }
            Err(e) => {
                tracing::warn!(wire = %l.spec, error = %e, "wire receive failed");
                std::thread::sleep(sock::TICK);
            }
        }
    }
}
