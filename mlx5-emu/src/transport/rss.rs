//! Receive-side scaling: the hash an indirect TIR spreads packets with
//! over its RQ table (`tirc.rx_hash_fn`, the fields its selectors pick,
//! `rx_hash_symmetric`), and the check CREATE/MODIFY_TIR make on the
//! selectors. The outer selector reads the packet's outer headers; the
//! inner one, where it names fields, a tunnelled packet's inner headers
//! when the TIR parses tunnels (`tunneled_offload_en`: mlx5e's inner TTC
//! TIRs, DPDK's and mlx5_ib's `IBV_RX_HASH_INNER`).
//!
//! Toeplitz is Microsoft's RSS hash: for every set bit of the input (most
//! significant first), the 32 key bits starting at that bit position are
//! XORed into the result. The input is what the selector names, in RSS
//! order: source IP, destination IP, source port, destination port (or the
//! IPsec SPI). Symmetric hashing orders each pair (smaller first) so both
//! directions of a flow hash alike. Inverted XOR8 is the complement of the
//! XOR of the input bytes.

use mlx5_hw::eth::{
    HASH_FIELD_SEL_DST_IP, HASH_FIELD_SEL_IPSEC_SPI, HASH_FIELD_SEL_L4_DPORT,
    HASH_FIELD_SEL_L4_SPORT, HASH_FIELD_SEL_SRC_IP, L3_PROT_TYPE_IPV6, L4_PROT_TYPE_UDP,
    RX_HASH_FN_INVERTED_XOR8, RX_HASH_FN_TOEPLITZ, TOEPLITZ_KEY_LEN,
};
use mlx5_hw::ifc::{rx_hash_field_select as sel, tirc};

/// Every field a selector may name.
const KNOWN_FIELDS: u64 = HASH_FIELD_SEL_SRC_IP
    | HASH_FIELD_SEL_DST_IP
    | HASH_FIELD_SEL_L4_SPORT
    | HASH_FIELD_SEL_L4_DPORT
    | HASH_FIELD_SEL_IPSEC_SPI;
/// The L4 ports.
const PORTS: u64 = HASH_FIELD_SEL_L4_SPORT | HASH_FIELD_SEL_L4_DPORT;

/// Whether the TIR context's hash selectors name fields firmware hashes:
/// known bits only, and ports or the SPI, not both.
pub(crate) fn check_fields(c: &[u8]) -> Result<(), ()> {
    for f in [
        tirc::RX_HASH_FIELD_SELECTOR_OUTER,
        tirc::RX_HASH_FIELD_SELECTOR_INNER,
    ] {
        let s = sel::SELECTED_FIELDS.at(f.off).get(c);
        if s & !KNOWN_FIELDS != 0 || (s & PORTS != 0 && s & HASH_FIELD_SEL_IPSEC_SPI != 0) {
            return Err(());
        }
    }
    Ok(())
}

/// What of a packet the hash may read.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Flow {
    /// IPv6 (else IPv4); `None`: not IP.
    pub ipv6: Option<bool>,
    /// UDP (else TCP); `None`: neither.
    pub udp: Option<bool>,
    pub src_ip: [u8; 16],
    pub dst_ip: [u8; 16],
    pub sport: u16,
    pub dport: u16,
}

/// The fields one selector of a TIR hashes (`rx_hash_field_select`).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Selector {
    pub l3_ipv6: bool,
    pub l4_udp: bool,
    pub fields: u64,
}

impl Selector {
    /// The selector at bit `s` of TIR context `c`.
    fn at(c: &[u8], s: usize) -> Self {
        Self {
            l3_ipv6: sel::L3_PROT_TYPE.at(s).get(c) == L3_PROT_TYPE_IPV6,
            l4_udp: sel::L4_PROT_TYPE.at(s).get(c) == L4_PROT_TYPE_UDP,
            fields: sel::SELECTED_FIELDS.at(s).get(c),
        }
    }
}

/// An indirect TIR's hash.
#[derive(Debug, Clone)]
pub(crate) struct Hash {
    pub func: u64,
    pub key: [u8; TOEPLITZ_KEY_LEN],
    pub symmetric: bool,
    pub outer: Selector,
    pub inner: Selector,
}

impl Hash {
    /// The hash of a TIR context.
    pub(crate) fn of(c: &[u8]) -> Self {
        let k = tirc::RX_HASH_TOEPLITZ_KEY.off / 8;
        let mut key = [0u8; TOEPLITZ_KEY_LEN];
        key.copy_from_slice(&c[k..k + TOEPLITZ_KEY_LEN]);
        Self {
            func: tirc::RX_HASH_FN.get(c),
            key,
            symmetric: tirc::RX_HASH_SYMMETRIC.get(c) != 0,
            outer: Selector::at(c, tirc::RX_HASH_FIELD_SELECTOR_OUTER.off),
            inner: Selector::at(c, tirc::RX_HASH_FIELD_SELECTOR_INNER.off),
        }
    }

    /// The hash input for `f` under selector `sel`: empty when the packet
    /// is not of the selector's protocols (it then hashes to 0).
    fn input(&self, sel: &Selector, f: &Flow) -> Vec<u8> {
        let mut v = Vec::with_capacity(36);
        let Some(ipv6) = f.ipv6 else {
            return v;
        };
        if ipv6 != sel.l3_ipv6 {
            return v;
        }
        let ip = |a: &[u8; 16]| if ipv6 { a.to_vec() } else { a[12..].to_vec() };
        let (mut s, mut d) = (ip(&f.src_ip), ip(&f.dst_ip));
        let (mut sp, mut dp) = (f.sport, f.dport);
        if self.symmetric {
            if s > d {
                std::mem::swap(&mut s, &mut d);
            }
            if sp > dp {
                std::mem::swap(&mut sp, &mut dp);
            }
        }
        if sel.fields & HASH_FIELD_SEL_SRC_IP != 0 {
            v.extend_from_slice(&s);
        }
        if sel.fields & HASH_FIELD_SEL_DST_IP != 0 {
            v.extend_from_slice(&d);
        }
        if sel.fields & PORTS != 0 && f.udp != Some(sel.l4_udp) {
            return Vec::new();
        }
        if sel.fields & HASH_FIELD_SEL_L4_SPORT != 0 {
            v.extend_from_slice(&sp.to_be_bytes());
        }
        if sel.fields & HASH_FIELD_SEL_L4_DPORT != 0 {
            v.extend_from_slice(&dp.to_be_bytes());
        }
        v
    }

    /// The packet's hash (0 for none or a packet the selector skips),
    /// and whether it read the inner headers: those of `inner` (a
    /// tunnelled packet's, where its TIR parses tunnels) when the inner
    /// selector names fields, else the outer ones of `f`.
    pub(crate) fn hash(&self, f: &Flow, inner: Option<&Flow>) -> (u32, bool) {
        match inner {
            Some(i) if self.inner.fields != 0 => (self.hash_by(&self.inner, i), true),
            _ => (self.hash_by(&self.outer, f), false),
        }
    }

    /// The hash of flow `f` under selector `sel`.
    fn hash_by(&self, sel: &Selector, f: &Flow) -> u32 {
        let input = self.input(sel, f);
        match self.func {
            RX_HASH_FN_TOEPLITZ => toeplitz(&self.key, &input),
            RX_HASH_FN_INVERTED_XOR8 if !input.is_empty() => {
                u32::from(!input.iter().fold(0u8, |a, b| a ^ b))
            }
            _ => 0,
        }
    }
}

/// The Toeplitz hash of `input` under `key`.
pub(crate) fn toeplitz(key: &[u8; TOEPLITZ_KEY_LEN], input: &[u8]) -> u32 {
    let mut h = 0u32;
    // The 32 key bits at the current bit position, and the bits after them.
    let mut window = u32::from_be_bytes([key[0], key[1], key[2], key[3]]);
    for (next, &b) in (4..).zip(input) {
        for i in (0..8).rev() {
            if b >> i & 1 != 0 {
                h ^= window;
            }
            let k = key.get(next).copied().unwrap_or(0);
            window = window << 1 | u32::from(k >> i & 1);
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Microsoft's verification key.
    const MS_KEY: [u8; 40] = [
        0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f,
        0xb0, 0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30,
        0xf2, 0x0c, 0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
    ];

    #[test]
    fn toeplitz_gives_microsofts_verification_values() {
        // 66.9.149.187:2794 -> 161.142.100.80:1766: IPv4 only 0x323e8fc2,
        // with TCP ports 0x51ccc178.
        let ip = [66, 9, 149, 187, 161, 142, 100, 80];
        assert_eq!(toeplitz(&MS_KEY, &ip), 0x323e_8fc2);
        let mut t = ip.to_vec();
        t.extend_from_slice(&2794u16.to_be_bytes());
        t.extend_from_slice(&1766u16.to_be_bytes());
        assert_eq!(toeplitz(&MS_KEY, &t), 0x51cc_c178);
    }

    #[test]
    fn symmetric_hash_is_the_same_both_ways() {
        let mut h = Hash {
            func: RX_HASH_FN_TOEPLITZ,
            key: MS_KEY,
            symmetric: true,
            outer: Selector {
                l3_ipv6: false,
                l4_udp: true,
                fields: KNOWN_FIELDS & !HASH_FIELD_SEL_IPSEC_SPI,
            },
            inner: Selector::default(),
        };
        let mut a = Flow {
            ipv6: Some(false),
            udp: Some(true),
            sport: 1000,
            dport: 2000,
            ..Flow::default()
        };
        a.src_ip[12..].copy_from_slice(&[10, 0, 0, 1]);
        a.dst_ip[12..].copy_from_slice(&[10, 0, 0, 2]);
        let b = Flow {
            src_ip: a.dst_ip,
            dst_ip: a.src_ip,
            sport: a.dport,
            dport: a.sport,
            ..a
        };
        assert_eq!(h.hash(&a, None), h.hash(&b, None));
        assert_ne!(h.hash(&a, None).0, 0);
        h.symmetric = false;
        assert_ne!(h.hash(&a, None), h.hash(&b, None));
        // A TCP packet under a UDP selector that names ports hashes to 0.
        let tcp = Flow {
            udp: Some(false),
            ..a
        };
        assert_eq!(h.hash(&tcp, None), (0, false));
        // The inner headers of a tunnelled packet are read only where the
        // inner selector names fields; then the outer ones are not.
        assert_eq!(h.hash(&a, Some(&tcp)), h.hash(&a, None));
        h.inner = h.outer;
        assert_eq!(h.hash(&tcp, Some(&a)), (h.hash(&a, None).0, true));
    }
}
