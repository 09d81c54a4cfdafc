//! Large send offload: an Ethernet send WQE of the LSO opcode (mlx5e's
//! TSO, DPDK's `RTE_MBUF_F_TX_TCP_SEG`) carries one TCP segment larger
//! than the wire takes and the MSS in its Ethernet segment (`mss`); the
//! device cuts it into frames of at most MSS payload bytes, each with a
//! copy of the L2-L4 headers: IPv4 total length and identification (+1
//! per frame), IPv6 payload length, TCP sequence number (+ the bytes
//! before it), FIN and PSH only on the last frame, CWR only on the first,
//! and the checksums filled in as `cs_flags` asks ([`super::steer::offload_checksums`]).
//!
//! A tunnelled packet whose inner packet is TCP, VXLAN (UDP to a port the
//! function parses as VXLAN) or GRE (an Ethernet frame, IPv4 or IPv6
//! inside), is cut the same way on its inner headers (mlx5e's tunnel TSO),
//! the outer IP length and identification and a VXLAN packet's outer UDP
//! length fixed per frame too (a GRE header has no length; its checksum,
//! when present, is left as sent).
//!
//! What is not TCP over IPv4 or IPv6 (extension headers included), an MSS
//! of 0, or a frame whose headers do not parse is refused: the WQE
//! completes with a length error.

use super::packet::{IPV6_HLEN, TCP_HLEN};
use super::steer::{
    Gre, ETH_P_IP, ETH_P_IPV6, IPPROTO_GRE, IPPROTO_TCP, IPPROTO_UDP, UDP_HLEN, VXLAN_HLEN,
};
/// TCP flags cleared on all but the last frame (FIN, PSH) and on all but
/// the first (CWR).
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// Where the headers of a TCP frame are.
struct Headers {
    /// A tunnelled packet's outer IP header (offset, IPv6) and a VXLAN
    /// packet's UDP header.
    outer: Option<(usize, bool, Option<usize>)>,
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

/// The IP header of the Ethernet frame at `at` (after an optional C-VLAN
/// tag): its offset, whether IPv6, its protocol, the L4 header's offset.
fn ip(f: &[u8], at: usize) -> Option<(usize, bool, u8, usize)> {
    let (ty, l3, _) = super::steer::l2(f, at)?;
    ip_at(f, ty, l3)
}

/// [`ip`] of the IP packet of ethertype `ty` at `l3`.
fn ip_at(f: &[u8], ty: u16, l3: usize) -> Option<(usize, bool, u8, usize)> {
    match ty {
        ETH_P_IP => {
            let h = f.get(l3..l3 + 20)?;
            let ihl = usize::from(h[0] & 0xf) * 4;
            (ihl >= 20).then_some((l3, false, h[9], l3 + ihl))
        }
        ETH_P_IPV6 => {
            let h = f.get(l3..l3 + IPV6_HLEN)?;
            Some((l3, true, h[6], l3 + IPV6_HLEN))
        }
        _ => None,
    }
}

/// Finds the headers of a TCP frame (Ethernet, optional C-VLAN tag, IPv4
/// with options or IPv6 without extension headers, TCP with options), or
/// of a VXLAN packet (UDP to one of `vxlan_ports`) carrying one.
fn headers(f: &[u8], vxlan_ports: &[u16]) -> Option<Headers> {
    let (mut l3, mut ipv6, mut proto, mut l4) = ip(f, 0)?;
    let mut outer = None;
    if proto == IPPROTO_UDP && vxlan_ports.contains(&be16(f.get(l4..l4 + 4)?, 2)) {
        outer = Some((l3, ipv6, Some(l4)));
        (l3, ipv6, proto, l4) = ip(f, l4 + UDP_HLEN + VXLAN_HLEN)?;
    } else if proto == IPPROTO_GRE {
        let g = Gre::at(f, l4)?;
        outer = Some((l3, ipv6, None));
        (l3, ipv6, proto, l4) = match g.proto {
            ETH_P_IP | ETH_P_IPV6 => ip_at(f, g.proto, g.payload)?,
            _ => ip(f, g.payload)?,
        };
    }
    if proto != IPPROTO_TCP {
        return None;
    }
    let doff = usize::from(f.get(l4 + 12)? >> 4) * 4;
    let len = l4 + doff;
    (doff >= TCP_HLEN && len <= f.len()).then_some(Headers {
        outer,
        l3,
        ipv6,
        l4,
        len,
    })
}

/// Sets the length of the IP packet whose header is at `l3` (IPv4 total
/// length, IPv6 payload length) for a frame of `frame_len` bytes, and an
/// IPv4 packet's identification to `id`.
fn fix_ip(f: &mut [u8], l3: usize, ipv6: bool, frame_len: usize, id: u16) {
    if ipv6 {
        put16(f, l3 + 4, (frame_len - l3 - IPV6_HLEN) as u16);
    } else {
        put16(f, l3 + 2, (frame_len - l3) as u16);
        put16(f, l3 + 4, id);
    }
}

/// Cuts `frame` (its headers and a payload of any length) into frames of
/// at most `mss` payload bytes; `None` when it cannot be cut (see the
/// module docs).
pub(crate) fn segment(frame: &[u8], mss: usize, vxlan_ports: &[u16]) -> Option<Vec<Vec<u8>>> {
    let h = headers(frame, vxlan_ports)?;
    if mss == 0 {
        return None;
    }
    let payload = &frame[h.len..];
    let n = payload.len().div_ceil(mss).max(1);
    let id = |l3: usize, ipv6: bool| if ipv6 { 0 } else { be16(frame, l3 + 4) };
    let inner_id = id(h.l3, h.ipv6);
    let outer_id = h.outer.map_or(0, |(l3, v6, _)| id(l3, v6));
    let seq = u32::from_be_bytes(frame[h.l4 + 4..h.l4 + 8].try_into().ok()?);
    let flags = frame[h.l4 + 13];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let chunk = payload.get(i * mss..((i + 1) * mss).min(payload.len()))?;
        let mut f = Vec::with_capacity(h.len + chunk.len());
        f.extend_from_slice(&frame[..h.len]);
        f.extend_from_slice(chunk);
        let len = f.len();
        fix_ip(&mut f, h.l3, h.ipv6, len, inner_id.wrapping_add(i as u16));
        if let Some((l3, v6, udp)) = h.outer {
            fix_ip(&mut f, l3, v6, len, outer_id.wrapping_add(i as u16));
            if let Some(udp) = udp {
                put16(&mut f, udp + 4, (len - udp) as u16);
            }
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
    use super::super::steer::ETH_P_8021Q;
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
        let s = segment(&f, 1000, &[]).unwrap();
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
        let s = segment(&f, 128, &[]).unwrap();
        assert_eq!(s.len(), 3);
        assert_eq!(be16(&s[2], 22), 20 + 44, "payload length");
        // UDP, an MSS of 0, a truncated header: refused.
        let mut u = tcp4(100);
        u[23] = 17;
        assert!(segment(&u, 50, &[]).is_none());
        assert!(segment(&tcp4(100), 0, &[]).is_none());
        assert!(segment(&tcp4(0)[..40], 10, &[]).is_none());
        // No payload: the frame as it is.
        assert_eq!(segment(&tcp4(0), 10, &[]).unwrap(), vec![tcp4(0)]);
    }

    /// [`tcp4`] of `n` bytes inside a VXLAN packet: Ethernet, IPv4 (id 3,
    /// UDP), UDP to 4789, the VXLAN header (VNI 42), then the TCP frame.
    fn vxlan_tcp4(n: usize) -> Vec<u8> {
        let inner = tcp4(n);
        let mut f = vec![0u8; 50];
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        put16(&mut f, 16, (36 + inner.len()) as u16);
        put16(&mut f, 18, 3);
        f[23] = IPPROTO_UDP;
        put16(&mut f, 34, 40000);
        put16(&mut f, 36, 4789);
        put16(&mut f, 38, (16 + inner.len()) as u16);
        f[42] = 0x08;
        f[46..49].copy_from_slice(&[0, 0, 42]);
        f.extend(inner);
        f
    }

    #[test]
    fn a_vxlan_packet_is_cut_on_its_inner_tcp_headers_outer_lengths_fixed() {
        let f = vxlan_tcp4(2500);
        assert!(segment(&f, 1000, &[]).is_none(), "4789 not VXLAN: UDP");
        let s = segment(&f, 1000, &[4789]).unwrap();
        assert_eq!(s.len(), 3);
        for (i, g) in s.iter().enumerate() {
            let n = [1000, 1000, 500][i];
            assert_eq!(g.len(), 50 + 54 + n);
            assert_eq!(be16(g, 16) as usize, g.len() - 14, "outer total length");
            assert_eq!(be16(g, 18), 3 + i as u16, "outer identification");
            assert_eq!(be16(g, 38) as usize, g.len() - 34, "outer UDP length");
            let inner = &g[50..];
            assert_eq!(be16(inner, 16) as usize, 40 + n, "inner total length");
            assert_eq!(be16(inner, 18), 7 + i as u16, "inner identification");
            let seq = u32::from_be_bytes(inner[38..42].try_into().unwrap());
            assert_eq!(seq, 1000 + 1000 * i as u32);
            assert_eq!(&inner[54..], &f[104 + 1000 * i..104 + 1000 * i + n]);
        }
        // The inner checksums the device fills in (mlx5e asks for inner
        // L3 and L4 and the outer L3 of an encapsulated frame).
        use mlx5_hw::eth::{ETH_WQE_L3_CSUM, ETH_WQE_L3_INNER_CSUM, ETH_WQE_L4_INNER_CSUM};
        let mut g = s[1].clone();
        let flags = ETH_WQE_L3_CSUM | ETH_WQE_L3_INNER_CSUM | ETH_WQE_L4_INNER_CSUM;
        super::super::steer::offload_checksums(&mut g, flags, &[4789]);
        let fold = |b: &[u8], sum: u32| super::super::steer::csum_fold(b, sum);
        assert_eq!(fold(&g[14..34], 0), 0xffff, "outer IPv4 header");
        assert_eq!(fold(&g[64..84], 0), 0xffff, "inner IPv4 header");
        let tcp = &g[84..];
        let pseudo = u32::from(fold(&g[76..84], 0)) + u32::from(IPPROTO_TCP) + tcp.len() as u32;
        assert_eq!(fold(tcp, pseudo), 0xffff, "inner TCP");
        assert_eq!(be16(&g, 40), 0, "outer UDP checksum left as sent");
    }

    /// The IPv4 packet of [`tcp4`] (`n` bytes) inside GRE over IPv4: an
    /// Ethernet frame (`teb`, Linux's gretap) or the IP packet itself
    /// (Linux's gre), with a key: Ethernet, IPv4 (id 5, GRE), GRE (K,
    /// key 9), then the inner packet. The inner packet's offset too.
    fn gre_tcp4(n: usize, teb: bool) -> (Vec<u8>, usize) {
        let mut inner = tcp4(n);
        let proto = if teb { 0x6558 } else { ETH_P_IP };
        if !teb {
            inner.drain(..14);
        }
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12..14].copy_from_slice(&ETH_P_IP.to_be_bytes());
        f[14] = 0x45;
        put16(&mut f, 16, (28 + inner.len()) as u16);
        put16(&mut f, 18, 5);
        f[23] = IPPROTO_GRE;
        put16(&mut f, 34, 0x2000);
        put16(&mut f, 36, proto);
        f[38..42].copy_from_slice(&9u32.to_be_bytes());
        f.extend(inner);
        (f, 42)
    }

    #[test]
    fn a_gre_packet_is_cut_on_its_inner_tcp_headers_outer_length_fixed() {
        use mlx5_hw::eth::{ETH_WQE_L3_CSUM, ETH_WQE_L3_INNER_CSUM, ETH_WQE_L4_INNER_CSUM};
        let fold = |b: &[u8], sum: u32| super::super::steer::csum_fold(b, sum);
        for teb in [true, false] {
            let (f, at) = gre_tcp4(2500, teb);
            // The inner IPv4 header's offset.
            let ip = at + if teb { 14 } else { 0 };
            let hdrs = ip + 40;
            let s = segment(&f, 1000, &[]).unwrap();
            assert_eq!(s.len(), 3, "teb {teb}");
            for (i, g) in s.iter().enumerate() {
                let n = [1000, 1000, 500][i];
                assert_eq!(g.len(), hdrs + n);
                assert_eq!(be16(g, 16) as usize, g.len() - 14, "outer total length");
                assert_eq!(be16(g, 18), 5 + i as u16, "outer identification");
                assert_eq!(&g[34..42], &f[34..42], "the GRE header as sent");
                assert_eq!(be16(g, ip + 2) as usize, 40 + n, "inner total length");
                assert_eq!(be16(g, ip + 4), 7 + i as u16, "inner identification");
                let seq = u32::from_be_bytes(g[ip + 24..ip + 28].try_into().unwrap());
                assert_eq!(seq, 1000 + 1000 * i as u32);
                assert_eq!(&g[hdrs..], &f[hdrs + 1000 * i..hdrs + 1000 * i + n]);
            }
            let mut g = s[1].clone();
            let flags = ETH_WQE_L3_CSUM | ETH_WQE_L3_INNER_CSUM | ETH_WQE_L4_INNER_CSUM;
            super::super::steer::offload_checksums(&mut g, flags, &[]);
            assert_eq!(fold(&g[14..34], 0), 0xffff, "outer IPv4 header");
            assert_eq!(fold(&g[ip..ip + 20], 0), 0xffff, "inner IPv4 header");
            let tcp = &g[ip + 20..];
            let pseudo = u32::from(fold(&g[ip + 12..ip + 20], 0))
                + u32::from(IPPROTO_TCP)
                + tcp.len() as u32;
            assert_eq!(fold(tcp, pseudo), 0xffff, "inner TCP, teb {teb}");
        }
        // A GRE header with routing (RFC 1701) or another version is not
        // parsed: refused.
        let (mut f, _) = gre_tcp4(100, true);
        put16(&mut f, 34, 0x4000);
        assert!(segment(&f, 50, &[]).is_none());
        put16(&mut f, 34, 0x0001);
        assert!(segment(&f, 50, &[]).is_none());
    }
}
