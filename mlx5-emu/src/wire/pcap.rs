//! A capture file in the classic pcap format (LINKTYPE_ETHERNET, microsecond
//! timestamps): what Wireshark, tshark and tcpdump read.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

/// pcap's magic (microsecond timestamps), written little-endian.
const MAGIC: u32 = 0xa1b2_c3d4;
/// LINKTYPE_ETHERNET.
const LINKTYPE_ETHERNET: u32 = 1;
/// Bytes of a frame kept, at most.
const SNAPLEN: u32 = 65535;

/// An open capture.
#[derive(Debug)]
pub(crate) struct Pcap {
    out: BufWriter<File>,
}

impl Pcap {
    /// Creates (truncates) `path` and writes the file header.
    pub(crate) fn create(path: &Path) -> io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        let mut h = Vec::with_capacity(24);
        h.extend_from_slice(&MAGIC.to_le_bytes());
        h.extend_from_slice(&2u16.to_le_bytes());
        h.extend_from_slice(&4u16.to_le_bytes());
        h.extend_from_slice(&0i32.to_le_bytes());
        h.extend_from_slice(&0u32.to_le_bytes());
        h.extend_from_slice(&SNAPLEN.to_le_bytes());
        h.extend_from_slice(&LINKTYPE_ETHERNET.to_le_bytes());
        out.write_all(&h)?;
        out.flush()?;
        Ok(Self { out })
    }

    /// Appends one frame, stamped with the time of day.
    pub(crate) fn frame(&mut self, f: &[u8]) -> io::Result<()> {
        let t = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        let kept = f.len().min(SNAPLEN as usize);
        let mut h = [0u8; 16];
        h[0..4].copy_from_slice(&(t.as_secs() as u32).to_le_bytes());
        h[4..8].copy_from_slice(&t.subsec_micros().to_le_bytes());
        h[8..12].copy_from_slice(&(kept as u32).to_le_bytes());
        h[12..16].copy_from_slice(&(f.len() as u32).to_le_bytes());
        self.out.write_all(&h)?;
        self.out.write_all(&f[..kept])
    }

    /// Writes what is buffered to the file.
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}
