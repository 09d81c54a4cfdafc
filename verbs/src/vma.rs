//! The process's own memory as the kernel maps it: which mappings hold a
//! range, whether they are readable and writable, and the size of their
//! pages (`/proc/self/maps`, and `KernelPageSize` of `/proc/self/smaps`
//! for file-backed mappings: hugetlbfs files, `MFD_HUGETLB` memfds and
//! `MAP_HUGETLB` anonymous memory are file-backed to the kernel).
//!
//! [`Pd::reg_mr_raw`](crate::pd::Pd::reg_mr_raw) uses it to map whole pages
//! of the memory (a hugetlb page cannot be mapped by file descriptor in
//! part) and to choose the MTT page size. Anonymous memory counts as 4 KiB
//! pages even where transparent huge pages back it: the kernel may split
//! those at any time, and smaps says 4 kB for them too.

use std::io::{BufRead, BufReader};

use crate::{Error, Result};

/// One line of `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vma {
    /// First address.
    pub start: u64,
    /// One past the last address.
    pub end: u64,
    /// Readable.
    pub read: bool,
    /// Writable.
    pub write: bool,
    /// The backing path (empty for anonymous memory; `[heap]`, `[stack]`
    /// and the like for the kernel's own names).
    pub path: String,
}

impl Vma {
    /// Parses a line of `/proc/*/maps` (or a mapping's header line in
    /// `smaps`): `start-end perms offset dev inode [path]`.
    pub fn parse(line: &str) -> Option<Vma> {
        let mut f = line.splitn(6, ' ');
        let (start, end) = f.next()?.split_once('-')?;
        let perms = f.next()?.as_bytes();
        // offset, dev, inode, then the path after the padding.
        let (_, _, _) = (f.next()?, f.next()?, f.next()?);
        Some(Vma {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            read: *perms.first()? == b'r',
            write: *perms.get(1)? == b'w',
            path: f.next().map_or("", str::trim_start).to_string(),
        })
    }

    /// Whether the kernel may back it with pages other than 4 KiB ones
    /// (file-backed: hugetlbfs and hugetlb memfds are; anonymous and the
    /// kernel's `[...]` mappings are not).
    fn maybe_huge(&self) -> bool {
        !self.path.is_empty() && !self.path.starts_with('[')
    }
}

fn efault(what: &'static str) -> Error {
    Error::Os {
        op: what,
        source: std::io::Error::from_raw_os_error(libc::EFAULT),
    }
}

/// The mappings that cover `addr .. addr + len` in `maps` (the text of
/// `/proc/self/maps`, read only as far as the range: the kernel writes
/// the file as it is read, a cost that grows with the mappings), in
/// order; refused with `EFAULT` when a byte is not
/// mapped or a mapping is not readable and writable (the device writes
/// registered memory, as `ibv_reg_mr` pins it writable).
pub fn covering(maps: impl BufRead, addr: u64, len: u64) -> Result<Vec<Vma>> {
    let end = addr.checked_add(len).ok_or(efault("memory range wraps"))?;
    let mut at = addr;
    let mut out = Vec::new();
    for line in maps.lines() {
        if at >= end {
            break;
        }
        let line = line.map_err(|e| Error::Os {
            op: "read /proc/self/maps",
            source: e,
        })?;
        let Some(v) = Vma::parse(&line) else {
            continue;
        };
        if v.end <= at {
            continue;
        }
        if v.start > at {
            return Err(efault(
                "memory range not mapped in the process (/proc/self/maps)",
            ));
        }
        if !(v.read && v.write) {
            return Err(efault(
                "memory range not readable and writable (/proc/self/maps)",
            ));
        }
        at = v.end;
        out.push(v);
    }
    if at < end {
        return Err(efault(
            "memory range not mapped in the process (/proc/self/maps)",
        ));
    }
    Ok(out)
}

/// `KernelPageSize` of each of `vmas` (in order, by start address) as
/// `smaps` (its text, read lazily line by line) says, in bytes.
pub fn kernel_page_sizes(smaps: impl BufRead, vmas: &[Vma]) -> Result<Vec<u64>> {
    let mut sizes = Vec::with_capacity(vmas.len());
    let mut current: Option<u64> = None;
    for line in smaps.lines() {
        let line = line.map_err(|e| Error::Os {
            op: "read /proc/self/smaps",
            source: e,
        })?;
        if let Some(kb) = line.strip_prefix("KernelPageSize:") {
            let Some(start) = current.take() else {
                continue;
            };
            let kb: u64 = kb
                .trim()
                .trim_end_matches("kB")
                .trim()
                .parse()
                .map_err(|_| efault("unreadable KernelPageSize in /proc/self/smaps"))?;
            if vmas.get(sizes.len()).is_some_and(|v| v.start == start) {
                sizes.push(kb * 1024);
                if sizes.len() == vmas.len() {
                    return Ok(sizes);
                }
            }
        } else if let Some(v) = Vma::parse(&line).filter(|v| line.contains('-') && v.end > v.start)
        {
            current = Some(v.start);
        }
    }
    Err(efault("mapping gone from /proc/self/smaps"))
}

/// The page size of the memory at `addr .. addr + len` (the smallest of
/// its mappings' pages), checking that all of it is mapped readable and
/// writable.
pub fn page_size_of(addr: u64, len: u64) -> Result<u64> {
    let maps = std::fs::File::open("/proc/self/maps").map_err(|e| Error::Os {
        op: "open /proc/self/maps",
        source: e,
    })?;
    let vmas = covering(BufReader::new(maps), addr, len)?;
    let huge: Vec<Vma> = vmas.into_iter().filter(Vma::maybe_huge).collect();
    let base = vfio::dma::PAGE_SIZE as u64;
    if huge.is_empty() {
        return Ok(base);
    }
    let smaps = std::fs::File::open("/proc/self/smaps").map_err(|e| Error::Os {
        op: "open /proc/self/smaps",
        source: e,
    })?;
    let sizes = kernel_page_sizes(BufReader::new(smaps), &huge)?;
    Ok(sizes.into_iter().min().unwrap_or(base).max(base))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0000400000 rw-s 00000000 00:10 1234                       /memfd:pool (deleted)
7f0000400000-7f0000600000 rw-p 00000000 00:00 0 
7f0000600000-7f0000601000 r--p 00000000 08:01 99                         /usr/lib/libc.so.6
";

    #[test]
    fn maps_lines_parse() {
        let v = Vma::parse(MAPS.lines().nth(1).unwrap()).unwrap();
        assert_eq!(
            v,
            Vma {
                start: 0x7f00_0000_0000,
                end: 0x7f00_0040_0000,
                read: true,
                write: true,
                path: "/memfd:pool (deleted)".into()
            }
        );
        assert!(v.maybe_huge());
        let anon = Vma::parse(MAPS.lines().nth(2).unwrap()).unwrap();
        assert_eq!(anon.path, "");
        assert!(!anon.maybe_huge());
        assert!(!Vma::parse(MAPS.lines().next().unwrap())
            .unwrap()
            .maybe_huge());
        assert_eq!(Vma::parse("KernelPageSize:     2048 kB"), None);
    }

    #[test]
    fn ranges_are_covered_or_refused_with_efault() {
        // Across the memfd and the anonymous mapping after it.
        let v = covering(MAPS.as_bytes(), 0x7f00_003f_f000, 0x2000).unwrap();
        assert_eq!(v.len(), 2);
        for (addr, len) in [
            (0x7f00_0060_0000u64, 1u64), // read-only
            (0x7f00_005f_f000, 0x2000),  // runs into the read-only one
            (0x1000, 1),                 // unmapped
            (0x55d0_c0a2_0000, 0x2000),  // past the heap's end
            (u64::MAX, 2),               // wraps
        ] {
            let e = covering(MAPS.as_bytes(), addr, len).unwrap_err();
            assert_eq!(e.errno(), libc::EFAULT, "{addr:#x}+{len:#x}: {e}");
        }
    }

    #[test]
    fn smaps_page_sizes_of_the_asked_mappings() {
        let smaps = "\
7f0000000000-7f0000400000 rw-s 00000000 00:10 1234                       /memfd:pool (deleted)
Size:               4096 kB
KernelPageSize:     2048 kB
MMUPageSize:        2048 kB
VmFlags: rd wr sh mr mw me ms de ht sd
7f0000600000-7f0000601000 r--p 00000000 08:01 99                         /usr/lib/libc.so.6
Size:                  4 kB
KernelPageSize:        4 kB
";
        let vmas: Vec<Vma> = MAPS.lines().filter_map(Vma::parse).collect();
        let want = [vmas[1].clone(), vmas[3].clone()];
        assert_eq!(
            kernel_page_sizes(smaps.as_bytes(), &want).unwrap(),
            vec![2 << 20, 4096]
        );
        // A mapping that is not there (unmapped meanwhile): EFAULT.
        let gone = kernel_page_sizes(smaps.as_bytes(), &[vmas[2].clone()]).unwrap_err();
        assert_eq!(gone.errno(), libc::EFAULT);
    }

    #[test]
    fn heap_memory_has_4k_pages() {
        let v = vec![0u8; 3 << 20];
        assert_eq!(
            page_size_of(v.as_ptr() as u64, v.len() as u64).unwrap(),
            4096
        );
        let e = page_size_of(8, 4096).unwrap_err();
        assert_eq!(e.errno(), libc::EFAULT);
    }
}
