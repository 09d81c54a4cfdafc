//! Large send offload: an Ethernet send WQE of the LSO opcode (mlx5e's
//! TSO, DPDK's `RTE_MBUF_F_TX_TCP_SEG`) carries one TCP segment larger
//! than the wire takes and the MSS in its Ethernet segment (`mss`); the
//! device cuts it into frames of at most MSS payload bytes, each with a
//! copy of the L2-L4 headers: IPv4 total length and identification (+1
//! per frame), IPv6 payload length, TCP sequence number (+ the bytes
//! before it), FIN and PSH only on the last frame, CWR only on the first,
//! and the checksums filled in as `cs_flags` asks ([`super::steer::offload_checksums`]).
//!
//! What is not TCP over IPv4 or IPv6 (extension headers included), an MSS
//! of 0, or a frame whose headers do not parse is refused: the WQE
//! completes with a length error.

use super::packet::{IPV6_HLEN, TCP_HLEN, VLAN_HLEN};
use super::steer::{ETH_HLEN, ETH_P_8021Q, ETH_P_IP, ETH_P_IPV6, IPPROTO_TCP};
/// TCP flags cleared on all but the last frame (FIN, PSH) and on all but
/// the first (CWR).
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the headers of a TCP frame are.
struct Headers {
    /// The IP header's offset, and whether it is IPv6.
    l3: usize,
    ipv6: bool,
    /// The TCP header's offset.
    l4: usize,
    /// Bytes of all the headers (where the payload starts).
    len: usize,
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

/// Finds the headers of a TCP frame (Ethernet, optional C-VLAN tag, IPv4
/// with options or IPv6 without extension headers, TCP with options).
fn headers(f: &[u8]) -> Option<Headers> {
    let mut l3 = ETH_HLEN;
    let mut ty = be16(f.get(..ETH_HLEN)?, 12);
    if ty == ETH_P_8021Q {
        ty = be16(f.get(..ETH_HLEN + VLAN_HLEN)?, 16);
        l3 += VLAN_HLEN;
    }
    let (ipv6, l4) = match ty {
        ETH_P_IP => {
            let h = f.get(l3..l3 + 20)?;
            let ihl = usize::from(h[0] & 0xf) * 4;
            (h[9] == IPPROTO_TCP && ihl >= 20).then_some((false, l3 + ihl))?
        }
        ETH_P_IPV6 => {
            let h = f.get(l3..l3 + IPV6_HLEN)?;
            (h[6] == IPPROTO_TCP).then_some((true, l3 + IPV6_HLEN))?
        }
        _ => return None,
    };
    let doff = usize::from(f.get(l4 + 12)? >> 4) * 4;
    let len = l4 + doff;
    (doff >= TCP_HLEN && len <= f.len()).then_some(Headers { l3, ipv6, l4, len })
}

/// Cuts `frame` (its headers and a payload of any length) into frames of
/// at most `mss` payload bytes; `None` when it cannot be cut (see the
/// module docs).
pub(crate) fn segment(frame: &[u8], mss: usize) -> Option<Vec<Vec<u8>>> {
    let h = headers(frame)?;
    if mss == 0 {
        return None;
    }
    let payload = &frame[h.len..];
    let n = payload.len().div_ceil(mss).max(1);
    let id = if h.ipv6 { 0 } else { be16(frame, h.l3 + 4) };
    let seq = u32::from_be_bytes(frame[h.l4 + 4..h.l4 + 8].try_into().ok()?);
    let flags = frame[h.l4 + 13];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let chunk = payload.get(i * mss..((i + 1) * mss).min(payload.len()))?;
        let mut f = Vec::with_capacity(h.len + chunk.len());
        f.extend_from_slice(&frame[..h.len]);
        f.extend_from_slice(chunk);
        if h.ipv6 {
            put16(&mut f, h.l3 + 4, (h.len - h.l4 + chunk.len()) as u16);
        } else {
            put16(&mut f, h.l3 + 2, (h.len - h.l3 + chunk.len()) as u16);
            put16(&mut f, h.l3 + 4, id.wrapping_add(i as u16));
        }
        let s = seq.wrapping_add((i * mss) as u32);
        f[h.l4 + 4..h.l4 + 8].copy_from_slice(&s.to_be_bytes());
        let mut fl = flags;
        if i + 1 < n {
            fl &= !(TCP_FIN | TCP_PSH);
        }
        if i > 0 {
            fl &= !TCP_CWR;
        }
        f[h.l4 + 13] = fl;
        out.push(f);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ethernet + IPv4 (id 7) + TCP (seq 1000, PSH|FIN|CWR|ACK) and `n`
    /// payload bytes.
    fn tcp4(n: usize) -> Vec<u8> {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        put16(&mut f, 16, (40 + n) as u16);
        put16(&mut f, 18, 7);
        f[23] = IPPROTO_TCP;
        f[38..42].copy_from_slice(&1000u32.to_be_bytes());
        f[46] = 5 << 4;
        f[47] = TCP_FIN | TCP_PSH | TCP_CWR | 0x10;
        f.extend((0..n).map(|i| i as u8));
        f
    }

    #[test]
    fn tcp_over_ipv4_is_cut_at_the_mss_with_its_headers_fixed() {
        let f = tcp4(2500);
        let s = segment(&f, 1000).unwrap();
        assert_eq!(s.len(), 3);
        for (i, g) in s.iter().enumerate() {
            let n = [1000, 1000, 500][i];
            assert_eq!(g.len(), 54 + n);
            assert_eq!(be16(g, 16) as usize, 40 + n, "total length");
            assert_eq!(be16(g, 18), 7 + i as u16, "identification");
            let seq = u32::from_be_bytes(g[38..42].try_into().unwrap());
            assert_eq!(seq, 1000 + 1000 * i as u32);
            let fl = g[47];
            assert_eq!(fl & (TCP_FIN | TCP_PSH) != 0, i == 2, "frame {i}");
            assert_eq!(fl & TCP_CWR != 0, i == 0, "frame {i}");
            assert_eq!(fl & 0x10, 0x10, "ACK everywhere");
            assert_eq!(&g[54..], &f[54 + 1000 * i..54 + 1000 * i + n]);
        }
    }

    #[test]
    fn ipv6_and_a_vlan_tag_are_followed_and_non_tcp_is_refused() {
        let mut f = vec![0u8; 18 + 40 + 20];
        f[12..14].copy_from_slice(&ETH_P_8021Q.to_be_bytes());
        f[16..18].copy_from_slice(&ETH_P_IPV6.to_be_bytes());
        f[18] = 0x60;
        f[24] = IPPROTO_TCP;
        f[58 + 12] = 5 << 4;
        f.extend([0u8; 300]);
        let s = segment(&f, 128).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(be16(&s[2], 22), 20 + 44, "payload length");
        // UDP, an MSS of 0, a truncated header: refused.
        let mut u = tcp4(100);
        u[23] = 17;
        assert!(segment(&u, 50).is_none());
        assert!(segment(&tcp4(100), 0).is_none());
        assert!(segment(&tcp4(0)[..40], 10).is_none());
        // No payload: the frame as it is.
        assert_eq!(segment(&tcp4(0), 10).unwrap(), vec![tcp4(0)]);
    }
}
