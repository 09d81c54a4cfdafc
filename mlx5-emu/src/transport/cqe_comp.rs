//! CQE compression (`cqc.cqe_comp_en`, the basic layout): receive CQEs of
//! one RQ that differ only in what a mini CQE carries are written as one
//! session: a title CQE in the first slot (the first CQE's fields, format
//! `MLX5_COMPRESSED` in `op_own`, and the session's CQE count in
//! `byte_cnt`), then arrays of eight 8-byte mini CQEs, the first in the
//! next slot and each next one eight slots after the one before (slots
//! 1, 8, 16, ...). The session takes as many slots of the ring as it has
//! CQEs, before the ring's end; the slots between its arrays are left as
//! they were. The owner bit
//! is the title's, written last. This is the layout mlx5e
//! (`mlx5e_decompress_cqes_start`) and DPDK's mlx5 PMD (`mlx5_rx_poll_len`,
//! `rxq_cq_decompress_v`) read.
//!
//! A mini CQE carries the byte count and, by the CQ's
//! `mini_cqe_res_format`, the RSS hash result (`HASH`) or the checksum
//! (`CSUM`, with the stride index in `CSUM_STRIDX`); the reader takes
//! every other field from the title, and works the WQE counter out: the
//! title's plus one per CQE on a cyclic RQ, the title's stride plus the
//! strides each CQE consumed on a striding RQ (same WQE, `wqe_id`). So a
//! CQE joins the session only if it is the same as the title but for those
//! fields (its timestamp becomes the title's) and its WQE counter is the
//! one the reader will work out; error, filler, LRO and inline-scatter
//! CQEs never do. A session holds at most `cqe_compression_max_num` CQEs
//! and ends at the ring's last slot: it never wraps (DPDK's vectorized
//! receive walks a session's slots and its buffers without wrapping, and
//! writes past both ends where one does).
//!
//! When: the device compresses CQEs it has ready together. In the model,
//! those of one burst of a local send queue (frames delivered on the
//! sender's thread): a session stays open while the burst lasts
//! (`Session::held`) and is written at the burst's end
//! ([`super::eth_rx::end_burst`]), when a CQE that cannot join comes to
//! the CQ, or when it is full; a session a burst's end missed closes after
//! [`HELD_IDLE_PASSES`] passes of the function's data path. Frames from
//! another process's port (the wire) complete one by one.

use mlx5_hw::cqe::{
    MINI_CQE_ARRAY_SIZE, MINI_CQE_RES_FORMAT_CSUM, MINI_CQE_RES_FORMAT_CSUM_STRIDX,
    MINI_CQE_RES_FORMAT_HASH,
};
use mlx5_hw::eth::{MPWRQ_CQE_FILLER, MPWRQ_CQE_STRIDES_SHIFT};
use mlx5_hw::ifc::{Cqe64, MiniCqe8};
use zerocopy::{FromZeros, IntoBytes};

use super::cq::Completion;
use super::lro::Sender;

/// Idle passes after which a session a burst's end missed is written.
pub(crate) const HELD_IDLE_PASSES: u32 = super::lro::HELD_IDLE_PASSES;

/// What a mini CQE carries beside the byte count (`mini_cqe_res_format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MiniFormat {
    /// The RSS hash result (`MLX5_CQE_RES_FORMAT_HASH`).
    Hash,
    /// The checksum (`MLX5_CQE_FORMAT_CSUM`).
    Csum,
    /// The checksum and the stride index (`MLX5_CQE_FORMAT_CSUM_STRIDX`).
    CsumStridx,
}

impl MiniFormat {
    /// The CQ context's `mini_cqe_res_format`; none for a value the model
    /// does not write (the flow tag format, whose cap no profile offers).
    pub(crate) fn from_raw(v: u8) -> Option<Self> {
        match v {
            MINI_CQE_RES_FORMAT_HASH => Some(Self::Hash),
            MINI_CQE_RES_FORMAT_CSUM => Some(Self::Csum),
            MINI_CQE_RES_FORMAT_CSUM_STRIDX => Some(Self::CsumStridx),
            _ => None,
        }
    }

    /// Back to the CQ context's value (QUERY_CQ).
    pub(crate) fn to_raw(self) -> u8 {
        match self {
            Self::Hash => MINI_CQE_RES_FORMAT_HASH,
            Self::Csum => MINI_CQE_RES_FORMAT_CSUM,
            Self::CsumStridx => MINI_CQE_RES_FORMAT_CSUM_STRIDX,
        }
    }
}

/// A CQ's compression, fixed at CREATE_CQ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Compression {
    pub format: MiniFormat,
    /// CQEs in a session at most (`cqe_compression_max_num`, at least 2).
    pub max: u32,
}

/// How the reader works out the WQE counter of each CQE after the title.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sequel {
    /// A cyclic RQ: one WQE each, in order.
    Cyclic,
    /// A striding RQ: strides of one WQE, each CQE's after the last.
    Striding,
}

/// A session being gathered: the CQEs as they will be read, each with
/// the title's timestamp.
#[derive(Debug)]
pub(crate) struct Session {
    pub cqes: Vec<Cqe64>,
    sequel: Sequel,
    /// The WQE counter the next CQE must carry.
    next: u16,
    /// The burst that feeds it (`None`: none, it closes at the next CQE
    /// or pass).
    pub held: Option<Sender>,
    /// Passes of the data path since it was opened or joined.
    pub idle: u32,
}

/// Whether a CQE may be compressed at all: a successful Ethernet receive
/// CQE that is not a filler, not merged by LRO, with no data in it.
pub(crate) fn compressible(c: &Completion) -> bool {
    c.error.is_none()
        && c.eth.is_some()
        && c.lro.is_none()
        && c.inline.is_none()
        && c.byte_cnt & MPWRQ_CQE_FILLER == 0
}

/// The WQE counter a reader works out for the CQE after `e`.
fn next_counter(e: &Cqe64, sequel: Sequel) -> u16 {
    let counter = e.wqe_counter.get();
    match sequel {
        Sequel::Cyclic => counter.wrapping_add(1),
        Sequel::Striding => {
            let strides = (e.byte_cnt.get() & !MPWRQ_CQE_FILLER) >> MPWRQ_CQE_STRIDES_SHIFT;
            counter.wrapping_add(strides as u16)
        }
    }
}

impl Session {
    /// A session opened by `first`.
    pub(crate) fn start(first: Cqe64, sequel: Sequel, held: Option<Sender>) -> Self {
        let next = next_counter(&first, sequel);
        let mut cqes = Vec::with_capacity(MINI_CQE_ARRAY_SIZE);
        cqes.push(first);
        Self {
            cqes,
            sequel,
            next,
            held,
            idle: 0,
        }
    }

    /// Adds `e` if a reader would rebuild it from the title and a mini
    /// CQE; whether it was added.
    pub(crate) fn join(&mut self, e: &Cqe64, sequel: Sequel, held: Option<Sender>) -> bool {
        if sequel != self.sequel || held != self.held || e.wqe_counter.get() != self.next {
            return false;
        }
        let title = &self.cqes[0];
        // `e` with the title's values where a mini CQE or the reader
        // supplies them: the rest must be the title's.
        let mut same = *e;
        same.byte_cnt = title.byte_cnt;
        same.wqe_counter = title.wqe_counter;
        same.timestamp_h = title.timestamp_h;
        same.timestamp_l = title.timestamp_l;
        // The mini CQE carries one of the hash and the checksum; the
        // other is lost (mlx5e's `mlx5e_decompress_cqe_no_hash` clears the
        // hash, DPDK reads no checksum): either may differ.
        same.check_sum = title.check_sum;
        same.rss_hash_result = title.rss_hash_result;
        if same.as_bytes() != title.as_bytes() {
            return false;
        }
        let mut e = *e;
        e.timestamp_h = title.timestamp_h;
        e.timestamp_l = title.timestamp_l;
        self.next = next_counter(&e, sequel);
        self.cqes.push(e);
        self.idle = 0;
        true
    }
}

/// The title of a session of `n` CQEs whose first is `first`: its fields,
/// the count in `byte_cnt` (`op_own`, with the format, is written apart).
pub(crate) fn title(first: &Cqe64, n: u32) -> Cqe64 {
    let mut t = *first;
    t.byte_cnt.set(n);
    t
}

/// The mini CQE array for CQEs `8k..8k+8` of `cqes` (zeros past the end).
pub(crate) fn mini_array(cqes: &[Cqe64], k: usize, format: MiniFormat) -> [u8; 64] {
    let mut arr = [MiniCqe8::new_zeroed(); MINI_CQE_ARRAY_SIZE];
    let from = k * MINI_CQE_ARRAY_SIZE;
    for (m, e) in arr.iter_mut().zip(cqes.iter().skip(from)) {
        m.byte_cnt = e.byte_cnt;
        match format {
            MiniFormat::Hash => m.rx_hash_result = e.rss_hash_result,
            // checksum (16) then stride index (16): the word's halves.
            MiniFormat::Csum | MiniFormat::CsumStridx => {
                let stridx = if format == MiniFormat::CsumStridx {
                    u32::from(e.wqe_counter.get())
                } else {
                    0
                };
                m.rx_hash_result
                    .set(u32::from(e.check_sum.get()) << 16 | stridx);
            }
        }
    }
    let mut out = [0u8; 64];
    out.copy_from_slice(arr.as_bytes());
    out
}

/// The ring slot (counted from the title) of mini CQE array `k`.
pub(crate) fn array_slot(k: usize) -> u32 {
    if k == 0 {
        1
    } else {
        (k * MINI_CQE_ARRAY_SIZE) as u32
    }
}
