//! The in-process fabric: functions whose ports are cabled together (two
//! ports: a cable; more: a switch), and the transmission of one packet.
//!
//! A packet is its addressing ([`RoceAddr`]: MACs, GIDs, traffic class,
//! UDP source port), its transport headers ([`Headers`], exactly what
//! [`Headers::parse`] reads back from the bytes [`Headers::emit`] writes),
//! and its payload ([`Payload`]): bytes, or extents of the sender's IOVA
//! space that the receiver copies straight into its own memory.
//! [`transmit`] hands it to the receiving function on the sender's thread,
//! and the receiver's responses come back through a callback, so an RC
//! exchange costs no thread hop. When the sender has nothing more queued
//! for a QP, [`drained`] tells the receiver, whose QP then sends the ACK
//! it was holding back (ACK coalescing). A fabric made with `wire_check`
//! instead sends each packet, responses included, through the complete
//! RoCEv2 frame encoding (Ethernet, IP, UDP, BTH and extension headers,
//! payload, pad, ICRC) and decodes it on the other side, the way a real
//! wire would carry it.
//!
//! Every function also reaches its own GIDs without a fabric (loopback).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};

use vfio::emulated::EmulatedFunction;
use vfio::IovaMemory;
use vm_memory::VolatileSlice;

use crate::transport::mem::{self, Extent, Hinted};
use crate::transport::packet::{self, Headers, RoceAddr};
use crate::transport::qp::Tally;
use crate::transport::{rlock, wlock, Qp, Rdma};
use crate::wire::{Link, LinkOptions, LinkSpec};
use crate::{Device, DeviceConfig, Profile};

/// What a packet carries after its headers.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// Nothing.
    None,
    /// Bytes (inline data, a decoded frame).
    Bytes(&'a [u8]),
    /// The sender's memory, one contiguous piece looked up once per
    /// message.
    Slice(VolatileSlice<'a>),
    /// `len` bytes of `ext` in the sender's memory `mem`, from `skip`.
    Mem {
        mem: &'a IovaMemory,
        ext: &'a [Extent],
        skip: u64,
        len: u64,
    },
}

impl Payload<'_> {
    /// Bytes carried.
    pub(crate) fn len(&self) -> u64 {
        match self {
            Payload::None => 0,
            Payload::Bytes(b) => b.len() as u64,
            Payload::Slice(s) => s.len() as u64,
            Payload::Mem { len, .. } => *len,
        }
    }

    /// Copies the payload into `dst` extents of `dmem`, `dskip` bytes in.
    pub(crate) fn copy_to(
        &self,
        dmem: &IovaMemory,
        dst: &[Extent],
        dskip: u64,
    ) -> Result<(), mem::Fault> {
        self.copy_to_hinted(&Hinted::new(dmem), dst, dskip)
    }

    /// [`Payload::copy_to`] with the destination's region hint.
    pub(crate) fn copy_to_hinted(
        &self,
        dmem: &Hinted<'_>,
        dst: &[Extent],
        dskip: u64,
    ) -> Result<(), mem::Fault> {
        match self {
            Payload::None => Ok(()),
            Payload::Bytes(b) => mem::write_bytes_hinted(dmem, dst, dskip, b),
            Payload::Slice(s) => mem::write_slice(dmem, dst, dskip, s),
            Payload::Mem {
                mem: smem,
                ext,
                skip,
                len,
            } => mem::copy(smem, ext, *skip, dmem.mem, dst, dskip, *len),
        }
    }

    /// Copies the first `out.len()` bytes of the payload out.
    pub(crate) fn read(&self, out: &mut [u8]) -> Result<(), mem::Fault> {
        match self {
            Payload::None => Ok(()),
            Payload::Bytes(b) => {
                let n = out.len().min(b.len());
                out[..n].copy_from_slice(&b[..n]);
                Ok(())
            }
            Payload::Slice(s) => {
                s.copy_to(out);
                Ok(())
            }
            Payload::Mem {
                mem: smem,
                ext,
                skip,
                ..
            } => mem::read_bytes(smem, ext, *skip, out),
        }
    }
}

/// One packet on the fabric.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Packet<'a> {
    /// The addressing, borrowed: a packet is built per send, its
    /// addressing once per connection.
    pub addr: &'a RoceAddr,
    pub hdr: &'a Headers,
    pub payload: Payload<'a>,
}

/// The medium between ports.
#[derive(Debug, Default)]
pub(crate) struct Wire {
    ports: RwLock<Vec<Weak<Rdma>>>,
    wire_check: AtomicBool,
    drop_next: AtomicU64,
    /// Responses (ACKs, NAKs, read responses, atomic acknowledgements)
    /// still to lose.
    drop_responses: AtomicU64,
    /// The link to another process ([`crate::wire`]): packets for a GID
    /// no port here answers to go out on it.
    link: RwLock<Option<Arc<Link>>>,
}

impl Wire {
    /// Takes one from `n` if it is not 0: true when this packet is lost.
    fn lose(n: &AtomicU64) -> bool {
        n.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |d| d.checked_sub(1))
            .is_ok()
    }
}

/// `reply` unless `wire` is to lose the response (counted dropped by the
/// responder, `dst`).
fn lossy_reply(
    wire: Option<&Wire>,
    dst: &Rdma,
    r: &Packet<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    if wire.is_some_and(|w| Wire::lose(&w.drop_responses)) {
        dst.counters.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    reply(r);
}

impl Wire {
    /// Every port on this fabric but `me`'s (where a raw frame goes).
    pub(crate) fn peers(&self, me: &Rdma) -> Vec<Arc<Rdma>> {
        let mut p = self.ports();
        p.retain(|r| !std::ptr::eq(Arc::as_ptr(r), me));
        p
    }

    /// The link to another process, if one is connected.
    pub(crate) fn link(&self) -> Option<Arc<Link>> {
        rlock(&self.link).clone()
    }

    /// Every port on this fabric (where a raw frame from a link goes).
    pub(crate) fn ports(&self) -> Vec<Arc<Rdma>> {
        rlock(&self.ports)
            .iter()
            .filter_map(Weak::upgrade)
            .collect()
    }

    /// The port that answers to `gid`.
    pub(crate) fn find(&self, gid: &[u8; 16]) -> Option<Arc<Rdma>> {
        rlock(&self.ports)
            .iter()
            .filter_map(Weak::upgrade)
            .find(|r| r.has_gid(gid))
    }
}

/// Where a packet goes: the receiving function and its memory (with the
/// sender's burst's region hint for it, if any), the fabric between
/// (`None`: looped back, or not cabled), and the destination QP as the
/// sender last found it (a hint, checked).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dest<'a, 'b> {
    pub rdma: &'a Rdma,
    pub mem: &'a IovaMemory,
    pub hint: Option<&'a Hinted<'b>>,
    pub wire: Option<&'a Wire>,
    pub qp: Option<&'a Arc<Qp>>,
    /// The sender counts packets here (and adds them to both functions'
    /// counters later) rather than in the counters.
    pub tally: Option<&'a Tally>,
    /// The sender found `rdma` by this packet's destination GID since the
    /// last change to any table: the receiver need not look it up again.
    pub routed: bool,
    /// The destination is across this link, in another process (`rdma`
    /// is then the sender's own function and is not used).
    pub link: Option<&'a Link>,
    /// The sending QP (its responses from across a link come back to it).
    pub src_qpn: u32,
}

/// The link to another process of the fabric `rdma` is cabled to.
pub(crate) fn link_of(rdma: &Rdma) -> Option<Arc<Link>> {
    wire_of(rdma).and_then(|w| w.link())
}

/// The fabric `rdma` is cabled to.
pub(crate) fn wire_of(rdma: &Rdma) -> Option<Arc<Wire>> {
    rlock(&rdma.fabric).as_ref().and_then(Weak::upgrade)
}

/// Sends `pkt` from `src` to `dst`; `dst`'s responses reach `reply`.
pub(crate) fn transmit(
    src: &Rdma,
    dst: &Dest<'_, '_>,
    pkt: &Packet<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    match dst.tally {
        Some(t) => {
            t.packets.set(t.packets.get() + 1);
            t.bytes.set(t.bytes.get() + pkt.payload.len());
        }
        None => {
            src.counters.packets_sent.fetch_add(1, Ordering::Relaxed);
            src.counters
                .bytes_sent
                .fetch_add(pkt.payload.len(), Ordering::Relaxed);
        }
    }
    // What the receiver parses from the emitted bytes is what it is given.
    debug_assert_eq!(
        {
            let mut b = [0u8; packet::MAX_HDR_LEN];
            let n = pkt.hdr.emit(&mut b);
            Headers::parse(&b[..n]).map(|(h, _)| h)
        },
        Ok(*pkt.hdr),
        "headers not in wire form"
    );
    if let Some(l) = dst.link {
        l.transmit(src, dst.src_qpn, pkt, reply);
        return;
    }
    let wire = dst.wire;
    if let Some(w) = wire {
        // Fault injection: lose packets.
        if Wire::lose(&w.drop_next) {
            src.counters.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
    }
    // Fault injection: lose responses.
    let mut lossy;
    let reply: &mut dyn FnMut(&Packet<'_>) =
        match wire.filter(|w| w.drop_responses.load(Ordering::Relaxed) != 0) {
            Some(w) => {
                let rdma = dst.rdma;
                lossy = move |r: &Packet<'_>| lossy_reply(Some(w), rdma, r, reply);
                &mut lossy
            }
            None => reply,
        };
    let check = wire.is_some_and(|w| w.wire_check.load(Ordering::Relaxed));
    let (qp, dmem, dhint, routed, tally, dst) =
        (dst.qp, dst.mem, dst.hint, dst.routed, dst.tally, dst.rdma);
    if tally.is_none() {
        dst.counters
            .packets_received
            .fetch_add(1, Ordering::Relaxed);
        dst.counters
            .bytes_received
            .fetch_add(pkt.payload.len(), Ordering::Relaxed);
    }
    if !check {
        crate::transport::responder::receive(dst, dmem, dhint, routed, qp, pkt, reply);
        return;
    }
    // The whole frame, as a real wire carries it.
    let mut frame = Vec::new();
    if encode(pkt, &mut frame).is_err() {
        src.counters.dropped.fetch_add(1, Ordering::Relaxed);
        return;
    }
    match packet::decode_frame(&frame) {
        Ok(f) => {
            let p = Packet {
                addr: &f.addr,
                hdr: &f.hdrs,
                payload: if f.payload.is_empty() {
                    Payload::None
                } else {
                    Payload::Bytes(&frame[f.payload.clone()])
                },
            };
            crate::transport::responder::receive(dst, dmem, dhint, false, None, &p, &mut |r| {
                framed(r, reply)
            });
        }
        Err(e) => {
            tracing::warn!(error = %e, "frame failed its own decoding");
            dst.counters.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The packets of one RC RDMA WRITE, back to back: `npkts` of `mtu` bytes
/// (the last one the rest) from PSN `psn`, the first with the RETH, the
/// last asking for an ACK; the payload is `src`.
#[derive(Debug)]
pub(crate) struct Train<'a> {
    pub addr: RoceAddr,
    pub dest_qp: u32,
    pub psn: u32,
    pub npkts: u32,
    pub mtu: u64,
    pub va: u64,
    pub rkey: u32,
    pub src: VolatileSlice<'a>,
}

/// Sends a WRITE's packets as one train when the fabric would deliver
/// each as it is (no wire check, no loss pending) and the receiver takes
/// them all in sequence; false (nothing sent) otherwise, and the sender
/// sends them one by one. Counted as the packets they are.
pub(crate) fn write_train(
    dst: &Dest<'_, '_>,
    t: &Train<'_>,
    reply: &mut dyn FnMut(&Packet<'_>),
) -> bool {
    let Some(tally) = dst.tally else {
        return false;
    };
    if !delivers_as_is(dst.wire) || !dst.routed || dst.link.is_some() {
        return false;
    }
    let done = match dst.hint {
        Some(h) => crate::transport::responder::write_train(dst.rdma, h, dst.qp, t, reply),
        None => crate::transport::responder::write_train(
            dst.rdma,
            &Hinted::new(dst.mem),
            dst.qp,
            t,
            reply,
        ),
    };
    if done {
        tally.packets.set(tally.packets.get() + u64::from(t.npkts));
        tally.bytes.set(tally.bytes.get() + t.src.len() as u64);
    }
    done
}

/// Whether the fabric `wire` (none: looped back) would deliver every
/// packet, and every response, as it is: no wire check, no loss pending.
/// A train or a run of packets needs it.
pub(crate) fn delivers_as_is(wire: Option<&Wire>) -> bool {
    !wire.is_some_and(|w| {
        w.wire_check.load(Ordering::Relaxed)
            || w.drop_next.load(Ordering::Relaxed) != 0
            || w.drop_responses.load(Ordering::Relaxed) != 0
    })
}

/// One single-packet RC RDMA WRITE of a run ([`write_run`]): its
/// WRITE_ONLY packet, AckReq set, at `psn`, the RETH's address and key
/// (its length the payload's), the payload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OneWrite<'a> {
    pub psn: u32,
    pub va: u64,
    pub rkey: u32,
    pub payload: Payload<'a>,
}

/// Sends a run of single-packet WRITEs to QP `dest_qp` of `dst`
/// (addressed as `addr`) when the fabric would deliver each packet as it
/// is; the receiver takes them in order while each is what its packet
/// alone would be, accepted with nothing more than an ACK owed, and stops
/// after one that made it send its ACK. How many it took (0 where the
/// fabric would not deliver them as they are: the sender then sends them
/// one by one). Counted as the packets they are.
pub(crate) fn write_run(
    dst: &Dest<'_, '_>,
    addr: &RoceAddr,
    dest_qp: u32,
    writes: &[OneWrite<'_>],
    reply: &mut dyn FnMut(&Packet<'_>),
) -> usize {
    let Some(tally) = dst.tally else {
        return 0;
    };
    if !delivers_as_is(dst.wire) || !dst.routed || dst.link.is_some() {
        return 0;
    }
    let r = crate::transport::responder::write_run;
    let n = match dst.hint {
        Some(h) => r(dst.rdma, h, dst.qp, addr, dest_qp, writes, reply),
        None => r(
            dst.rdma,
            &Hinted::new(dst.mem),
            dst.qp,
            addr,
            dest_qp,
            writes,
            reply,
        ),
    };
    let bytes: u64 = writes[..n].iter().map(|w| w.payload.len()).sum();
    tally.packets.set(tally.packets.get() + n as u64);
    tally.bytes.set(tally.bytes.get() + bytes);
    n
}

/// Tells `dst` that `src` has nothing more queued for its QP `qpn` (the
/// requester's burst ended): the responder sends the ACK it holds back, if
/// any, to `reply`. `addr` is the addressing of the requests.
pub(crate) fn drained(
    src: &Rdma,
    dst: &Rdma,
    addr: &RoceAddr,
    qpn: u32,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let wire = wire_of(src);
    let w = wire.as_deref();
    let check = w.is_some_and(|w| w.wire_check.load(Ordering::Relaxed));
    let reply = &mut |r: &Packet<'_>| lossy_reply(w, dst, r, reply);
    if check {
        crate::transport::responder::drained(dst, addr, qpn, &mut |r| framed(r, reply));
    } else {
        crate::transport::responder::drained(dst, addr, qpn, reply);
    }
}

/// [`drained`] for DCI `dci`'s connection to DCT `dctn`; `close`: the DCI
/// disconnects (idle, or its next WQE names another target).
pub(crate) fn dc_drained(
    src: &Rdma,
    dst: &Rdma,
    addr: &RoceAddr,
    (dctn, dci): (u32, u32),
    close: bool,
    reply: &mut dyn FnMut(&Packet<'_>),
) {
    let wire = wire_of(src);
    let w = wire.as_deref();
    let check = w.is_some_and(|w| w.wire_check.load(Ordering::Relaxed));
    let reply = &mut |r: &Packet<'_>| lossy_reply(w, dst, r, reply);
    if check {
        crate::transport::dc::drained(dst, addr, dctn, dci, close, &mut |r| framed(r, reply));
    } else {
        crate::transport::dc::drained(dst, addr, dctn, dci, close, reply);
    }
}

/// A response sent through the full frame encoding and decoding.
fn framed(r: &Packet<'_>, reply: &mut dyn FnMut(&Packet<'_>)) {
    let mut rf = Vec::new();
    if encode(r, &mut rf).is_err() {
        return;
    }
    match packet::decode_frame(&rf) {
        Ok(f) => reply(&Packet {
            addr: &f.addr,
            hdr: &f.hdrs,
            payload: if f.payload.is_empty() {
                Payload::None
            } else {
                Payload::Bytes(&rf[f.payload.clone()])
            },
        }),
        Err(e) => tracing::warn!(error = %e, "response frame failed its own decoding"),
    }
}

/// The frame of one packet ([`packet::encode_frame`]): what the wire
/// check and the links to other processes carry.
pub(crate) fn encode(pkt: &Packet<'_>, out: &mut Vec<u8>) -> Result<(), mem::Fault> {
    let mut payload = vec![0u8; pkt.payload.len() as usize];
    pkt.payload.read(&mut payload)?;
    packet::encode_frame(pkt.addr, pkt.hdr, &payload, out);
    Ok(())
}

/// Device-model functions with their ports cabled together.
#[derive(Debug)]
pub struct Fabric {
    wire: Arc<Wire>,
    functions: Mutex<Vec<Arc<EmulatedFunction<Device>>>>,
}

impl Fabric {
    /// An empty fabric.
    pub fn new() -> Self {
        Self {
            wire: Arc::new(Wire::default()),
            functions: Mutex::new(Vec::new()),
        }
    }

    /// `n` functions of `profile` (MACs `..:01`, `..:02`, ...) cabled
    /// together: two are a cable, more a switch.
    pub fn cabled(n: usize, profile: Profile) -> Self {
        Self::cabled_as(n, &DeviceConfig::for_profile(profile))
    }

    /// `n` functions built as `cfg` says but for their MACs (`..:01`,
    /// `..:02`, ... as [`Fabric::cabled`]), cabled together; one clock, if
    /// `cfg` hands a manual one, moves them all.
    pub fn cabled_as(n: usize, cfg: &DeviceConfig) -> Self {
        let f = Self::new();
        for i in 0..n {
            let mut cfg = cfg.clone();
            cfg.mac = crate::DEFAULT_MAC + i as u64;
            f.add(cfg);
        }
        f
    }

    /// One function whose port is looped back to itself.
    pub fn loopback(profile: Profile) -> Self {
        Self::cabled(1, profile)
    }

    /// Makes a function built as `cfg` says and cables its port in.
    pub fn add(&self, cfg: DeviceConfig) -> Arc<EmulatedFunction<Device>> {
        let f = Arc::new(crate::emulated_with(cfg));
        self.attach(f.model());
        crate::lock(&self.functions).push(f.clone());
        f
    }

    /// Cables an existing function's port in.
    pub fn attach(&self, dev: &Device) {
        let rdma = dev.rdma();
        *wlock(&rdma.fabric) = Some(Arc::downgrade(&self.wire));
        wlock(&self.wire.ports).push(Arc::downgrade(rdma));
    }

    /// Function `i`.
    pub fn function(&self, i: usize) -> Option<Arc<EmulatedFunction<Device>>> {
        crate::lock(&self.functions).get(i).cloned()
    }

    /// How many functions the fabric made.
    pub fn len(&self) -> usize {
        crate::lock(&self.functions).len()
    }

    /// Whether the fabric made no function.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Send every packet through the full RoCEv2 frame encoding and
    /// decoding (ICRC included) instead of passing payload by reference.
    pub fn set_wire_check(&self, on: bool) {
        self.wire.wire_check.store(on, Ordering::Relaxed);
    }

    /// Lose the next `n` packets sent on the fabric (fault injection).
    pub fn drop_packets(&self, n: u64) {
        self.wire.drop_next.store(n, Ordering::Relaxed);
    }

    /// Lose the next `n` responses sent on the fabric: ACKs, NAKs, read
    /// responses, atomic acknowledgements (fault injection).
    pub fn drop_responses(&self, n: u64) {
        self.wire.drop_responses.store(n, Ordering::Relaxed);
    }

    /// Connects the fabric to another process over a socket
    /// ([`crate::wire`]): packets for GIDs no function here answers to go
    /// out as RoCEv2 frames, and frames coming in reach the function
    /// their destination GID names. One link per fabric; a second
    /// replaces the first.
    pub fn connect(&self, spec: &LinkSpec, opts: &LinkOptions) -> std::io::Result<Arc<Link>> {
        let l = Link::open(spec, opts, &self.wire)?;
        if let Some(old) = wlock(&self.wire.link).replace(l.clone()) {
            old.close();
        }
        Ok(l)
    }

    /// The link to another process, if connected.
    pub fn link(&self) -> Option<Arc<Link>> {
        rlock(&self.wire.link).clone()
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if let Some(l) = wlock(&self.wire.link).take() {
            l.close();
        }
    }
}

impl Default for Fabric {
    fn default() -> Self {
        Self::new()
    }
}
