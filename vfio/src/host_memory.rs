//! Memory a program owns and registers for DMA itself (verbs'
//! `reg_mr_raw`, the `ibv_reg_mr` of its own buffers), and how a backend
//! finds the file behind it.
//!
//! The kernel backend maps any address of the process (the IOMMU pins the
//! pages). A vfio-user server is another process: it reaches memory only
//! through a file descriptor, so the range must be a shared mapping of a
//! file — a memfd, a hugetlbfs file, `MAP_SHARED` of any file — and
//! [`shared_file_of`] finds that file and the offset of the range in it:
//! first among the live [`HostMemory`] pools (no lookup), then in
//! `/proc/self/maps`, opening the file through an fd this process holds
//! (`/proc/self/fd`), `/proc/self/map_files` (root or
//! `CAP_CHECKPOINT_RESTORE`) or its path. Anonymous private memory (the
//! heap, the stack, `mmap(MAP_PRIVATE | MAP_ANONYMOUS)`) has no file and is
//! refused with [`Error::NotShareable`], which says how to allocate
//! shareable memory instead: a [`HostMemory`].

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::{AsRawFd, FromRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use vm_memory::bitmap::BS;
use vm_memory::mmap::MmapRegion;
use vm_memory::{Bytes, FileOffset, VolatileMemory, VolatileSlice};

use crate::dma::{HugePage, PAGE_SIZE};
use crate::{Error, Result};

/// A buffer pool of the program's own: a memfd (4 KiB or hugetlb pages) or
/// a hugetlbfs file, mapped `MAP_SHARED` and zeroed, that any backend can
/// map for DMA (register it with verbs' `reg_mr_raw`, in whole or in
/// parts). Unlike [`DmaBuffer`](crate::DmaBuffer) it never falls back to
/// smaller pages: asking for huge pages the system lacks is
/// [`Error::NoHugePages`].
///
/// While any part of it is mapped for DMA, the device reads and writes it
/// concurrently: touch it through [`read`](Self::read) /
/// [`write`](Self::write) (volatile copies) or raw pointers, never through
/// Rust references, and keep it alive until every registration over it is
/// gone.
#[derive(Debug)]
pub struct HostMemory {
    region: MmapRegion<()>,
    file: Arc<File>,
    page_size: usize,
}

/// The live pools, by host address: (length, file). Consulted before
/// `/proc/self/maps`.
type Pools = BTreeMap<u64, (u64, Arc<File>)>;

fn pools() -> MutexGuard<'static, Pools> {
    static POOLS: Mutex<Pools> = Mutex::new(BTreeMap::new());
    POOLS.lock().unwrap_or_else(|p| p.into_inner())
}

fn os_err(op: &'static str, source: std::io::Error) -> Error {
    Error::Os { op, source }
}

impl HostMemory {
    /// `len` bytes (rounded up to 4 KiB) of a memfd of ordinary pages.
    pub fn memfd(len: usize) -> Result<Self> {
        let len = len.max(1).next_multiple_of(PAGE_SIZE);
        Self::of_memfd(len, PAGE_SIZE, 0)
    }

    /// `len` bytes (rounded up to the page size) of a memfd of `page` huge
    /// pages (`MFD_HUGETLB`).
    pub fn memfd_huge(len: usize, page: HugePage) -> Result<Self> {
        let size = huge_size(page);
        let len = len.max(1).next_multiple_of(size);
        // MFD_HUGE_2MB / MFD_HUGE_1GB: log2 of the size in the high bits.
        let flags = libc::MFD_HUGETLB | (size.trailing_zeros() << libc::MFD_HUGE_SHIFT);
        Self::of_memfd(len, size, flags)
    }

    /// `len` bytes (rounded up to the page size) of a new file in the
    /// hugetlbfs mount `dir` (`/dev/hugepages`, ...), unlinked at once (it
    /// lives while mapped), of that mount's page size.
    pub fn hugetlbfs(dir: impl AsRef<Path>, len: usize) -> Result<Self> {
        let dir = dir.as_ref();
        let d = File::open(dir).map_err(|e| os_err("open(hugetlbfs mount)", e))?;
        let (magic, bsize) = fs_of(&d)?;
        if magic != u64::from(libc::HUGETLBFS_MAGIC as u32) {
            return Err(Error::Setup {
                device: dir.display().to_string(),
                problem: "not a hugetlbfs mount".into(),
                fix: "mount one: mount -t hugetlbfs none /dev/hugepages".into(),
            });
        }
        let len = len.max(1).next_multiple_of(bsize);
        // O_TMPFILE is not supported by hugetlbfs: a unique name, unlinked.
        static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = dir.join(format!("vfio-host-memory-{}-{n}", std::process::id()));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| os_err("create(hugetlbfs file)", e))?;
        let _ = std::fs::remove_file(&path);
        Self::of_file(file, len, bsize)
    }

    fn of_memfd(len: usize, page_size: usize, extra: libc::c_uint) -> Result<Self> {
        // SAFETY: memfd_create reads the NUL-terminated name and returns a
        // new descriptor or -1; no memory of ours is written.
        let fd =
            unsafe { libc::memfd_create(c"vfio-host-memory".as_ptr(), libc::MFD_CLOEXEC | extra) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(if page_size > PAGE_SIZE {
                no_huge(page_size, len)
            } else {
                os_err("memfd_create", e)
            });
        }
        // SAFETY: `fd` was just returned by memfd_create and nothing else owns it.
        Self::of_file(unsafe { File::from_raw_fd(fd) }, len, page_size)
    }

    fn of_file(file: File, len: usize, page_size: usize) -> Result<Self> {
        file.set_len(len as u64).map_err(|e| {
            if page_size > PAGE_SIZE {
                no_huge(page_size, len)
            } else {
                os_err("ftruncate(host memory)", e)
            }
        })?;
        let file = Arc::new(file);
        // Without MAP_NORESERVE a hugetlb mapping reserves its pages now:
        // too few is ENOMEM here, not a SIGBUS at the first touch.
        let region = MmapRegion::build(
            Some(FileOffset::from_arc(file.clone(), 0)),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .map_err(|e| {
            if page_size > PAGE_SIZE {
                no_huge(page_size, len)
            } else {
                os_err("mmap(host memory)", std::io::Error::other(e.to_string()))
            }
        })?;
        pools().insert(region.as_ptr() as u64, (len as u64, file.clone()));
        Ok(Self {
            region,
            file,
            page_size,
        })
    }

    /// The first byte (what `reg_mr_raw` takes).
    pub fn as_ptr(&self) -> *mut u8 {
        self.region.as_ptr()
    }

    /// The host address of the first byte.
    pub fn addr(&self) -> u64 {
        self.region.as_ptr() as u64
    }

    /// Length in bytes (a multiple of the page size).
    pub fn len(&self) -> usize {
        self.region.size()
    }

    /// Always false: at least one page.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The size of the pages behind it (4 KiB, 2 MiB or 1 GiB).
    pub fn page_size(&self) -> usize {
        self.page_size
    }

    /// The file behind it.
    pub fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// A volatile view of the whole pool.
    pub fn slice(&self) -> VolatileSlice<'_, BS<'_, ()>> {
        self.region.as_volatile_slice()
    }

    fn oob(&self, offset: usize, len: usize) -> Error {
        Error::OutOfBounds {
            what: "host memory",
            offset: offset as u64,
            len: len as u64,
            size: self.len() as u64,
        }
    }

    /// Copies `buf.len()` bytes out of the pool at `offset`.
    pub fn read(&self, offset: usize, buf: &mut [u8]) -> Result<()> {
        self.slice()
            .read_slice(buf, offset)
            .map_err(|_| self.oob(offset, buf.len()))
    }

    /// Copies `data` into the pool at `offset`.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        self.slice()
            .write_slice(data, offset)
            .map_err(|_| self.oob(offset, data.len()))
    }
}

impl Drop for HostMemory {
    fn drop(&mut self) {
        pools().remove(&self.addr());
    }
}

fn huge_size(page: HugePage) -> usize {
    match page {
        HugePage::Size2M => 2 << 20,
        HugePage::Size1G => 1 << 30,
    }
}

fn no_huge(page_size: usize, len: usize) -> Error {
    Error::NoHugePages {
        page_size: page_size as u64,
        len: len as u64,
    }
}

/// The filesystem magic and block size of `f` (`fstatfs`).
fn fs_of(f: &File) -> Result<(u64, usize)> {
    // SAFETY: an all-zero statfs is a valid value of a plain C struct.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: fstatfs writes one statfs into the live local.
    if unsafe { libc::fstatfs(f.as_raw_fd(), &mut s) } != 0 {
        return Err(Error::os("fstatfs"));
    }
    Ok((s.f_type as u64, (s.f_bsize as usize).max(PAGE_SIZE)))
}

/// The page size of the file's filesystem when it is hugetlbfs (a mapping
/// of it must start and end on those pages), else 4 KiB.
pub fn file_page_size(f: &File) -> usize {
    match fs_of(f) {
        Ok((magic, bsize)) if magic == u64::from(libc::HUGETLBFS_MAGIC as u32) => bsize,
        _ => PAGE_SIZE,
    }
}

/// The file behind `addr .. addr + len` of this process and the offset of
/// `addr` in it, opened read-write; [`Error::NotShareable`] when the range
/// is not one shared mapping of a file.
pub fn shared_file_of(addr: u64, len: u64) -> Result<(Arc<File>, u64)> {
    let end = addr.checked_add(len).ok_or(Error::NotShareable {
        addr,
        len,
        why: "the range wraps".into(),
    })?;
    if let Some((&base, (plen, file))) = pools().range(..=addr).next_back() {
        if end <= base + plen {
            return Ok((file.clone(), addr - base));
        }
    }
    let vma = mapping_of(addr, end)?;
    let refuse = |why: String| Error::NotShareable { addr, len, why };
    if !vma.shared {
        return Err(refuse(if vma.inode == 0 {
            "it is anonymous private memory (the heap, the stack, \
             mmap(MAP_PRIVATE|MAP_ANONYMOUS)): no file holds it"
                .into()
        } else {
            format!(
                "it is a private (copy-on-write) mapping of {}: another process would not see its pages",
                vma.path
            )
        }));
    }
    let file = open_mapped(&vma).map_err(|e| {
        refuse(format!(
            "its file {} (inode {}) cannot be reopened: {e}",
            vma.path, vma.inode
        ))
    })?;
    Ok((Arc::new(file), vma.offset + (addr - vma.start)))
}

/// One line of `/proc/self/maps`, merged with the lines that continue it.
#[derive(Debug, Clone)]
struct Vma {
    start: u64,
    end: u64,
    shared: bool,
    offset: u64,
    dev: (u64, u64),
    inode: u64,
    path: String,
}

fn parse_vma(line: &str) -> Option<Vma> {
    let mut f = line.splitn(6, ' ');
    let (range, perms, offset, dev, inode) =
        (f.next()?, f.next()?, f.next()?, f.next()?, f.next()?);
    let (s, e) = range.split_once('-')?;
    let (maj, min) = dev.split_once(':')?;
    Some(Vma {
        start: u64::from_str_radix(s, 16).ok()?,
        end: u64::from_str_radix(e, 16).ok()?,
        shared: perms.as_bytes().get(3) == Some(&b's'),
        offset: u64::from_str_radix(offset, 16).ok()?,
        dev: (
            u64::from_str_radix(maj, 16).ok()?,
            u64::from_str_radix(min, 16).ok()?,
        ),
        inode: inode.parse().ok()?,
        path: f.next().unwrap_or("").trim().to_string(),
    })
}

/// The mapping that holds `addr .. end`: one line of `/proc/self/maps` or
/// several that continue the same file.
fn mapping_of(addr: u64, end: u64) -> Result<Vma> {
    let refuse = |why: &str| Error::NotShareable {
        addr,
        len: end - addr,
        why: why.into(),
    };
    let maps = File::open("/proc/self/maps").map_err(|e| os_err("open(/proc/self/maps)", e))?;
    let mut found: Option<Vma> = None;
    for line in BufReader::new(maps).lines() {
        let line = line.map_err(|e| os_err("read(/proc/self/maps)", e))?;
        let Some(v) = parse_vma(&line) else { continue };
        match &mut found {
            None if v.start <= addr && addr < v.end => found = Some(v),
            None => continue,
            Some(f) => {
                let continues = v.start == f.end
                    && v.shared == f.shared
                    && v.inode == f.inode
                    && v.dev == f.dev
                    && (v.inode == 0 || v.offset == f.offset + (f.end - f.start));
                if !continues {
                    break;
                }
                f.end = v.end;
            }
        }
        if found.as_ref().is_some_and(|f| f.end >= end) {
            break;
        }
    }
    match found {
        None => Err(refuse("it is not mapped")),
        Some(f) if f.end < end => Err(refuse(&format!(
            "it spans several mappings (the one at {:#x} ends at {:#x})",
            f.start, f.end
        ))),
        Some(f) => Ok(f),
    }
}

/// The file of `vma`, opened read-write: through an fd this process holds,
/// `/proc/self/map_files`, or its path; checked to be the same inode.
fn open_mapped(vma: &Vma) -> std::io::Result<File> {
    let same = |f: &File| {
        f.metadata().is_ok_and(|m| {
            let d = m.dev();
            let (maj, min) = (
                ((d >> 8) & 0xfff) | ((d >> 32) & !0xfff),
                (d & 0xff) | ((d >> 12) & !0xff),
            );
            m.ino() == vma.inode && (maj, min) == vma.dev
        })
    };
    let rw = |p: &Path| std::fs::OpenOptions::new().read(true).write(true).open(p);
    if let Ok(dir) = std::fs::read_dir("/proc/self/fd") {
        for e in dir.flatten() {
            let p = e.path();
            let ino = std::fs::metadata(&p).map(|m| m.ino()).unwrap_or(0);
            if ino == vma.inode {
                if let Ok(f) = rw(&p) {
                    if same(&f) {
                        return Ok(f);
                    }
                }
            }
        }
    }
    let by_map = format!("/proc/self/map_files/{:x}-{:x}", vma.start, vma.end);
    let mut last = match rw(Path::new(&by_map)) {
        Ok(f) if same(&f) => return Ok(f),
        Ok(_) => std::io::Error::other("map_files names another file"),
        Err(e) => e,
    };
    if vma.path.starts_with('/') && !vma.path.ends_with(" (deleted)") {
        match rw(Path::new(&vma.path)) {
            Ok(f) if same(&f) => return Ok(f),
            Ok(_) => last = std::io::Error::other("the path now names another file"),
            Err(e) => last = e,
        }
    }
    Err(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_and_shared_mappings_are_found_heap_is_refused() {
        let m = HostMemory::memfd(3 * 4096).unwrap();
        m.write(4096, b"pool").unwrap();
        let (f, off) = shared_file_of(m.addr() + 4096, 4096).unwrap();
        assert_eq!(off, 4096);
        assert_eq!(f.metadata().unwrap().len(), 3 * 4096);
        // Past the end of the pool: the lookup goes to /proc/self/maps.
        assert!(shared_file_of(m.addr(), 4 * 4096).is_err());

        let heap = vec![0u8; 64 << 10];
        let e = shared_file_of(heap.as_ptr() as u64 & !0xfff, 4096).unwrap_err();
        assert!(matches!(e, Error::NotShareable { .. }), "{e}");
        let msg = e.to_string();
        assert!(
            msg.contains("anonymous private") && msg.contains("HostMemory"),
            "{msg}"
        );
    }

    #[test]
    fn a_memfd_mapped_by_hand_is_found_through_proc() {
        // SAFETY: memfd_create with a NUL-terminated name.
        let fd = unsafe { libc::memfd_create(c"by-hand".as_ptr(), libc::MFD_CLOEXEC) };
        assert!(fd >= 0);
        // SAFETY: fd is new and owned here.
        let file = unsafe { File::from_raw_fd(fd) };
        file.set_len(8 * 4096).unwrap();
        let r = MmapRegion::<()>::build(
            Some(FileOffset::new(file, 2 * 4096)),
            4 * 4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
        )
        .unwrap();
        let (f, off) = shared_file_of(r.as_ptr() as u64 + 4096, 2 * 4096).unwrap();
        assert_eq!(off, 3 * 4096);
        assert_eq!(f.metadata().unwrap().len(), 8 * 4096);
    }

    #[test]
    fn maps_lines_parse() {
        let v = parse_vma("7f00-8f00 rw-s 00002000 00:01 1234    /memfd:x (deleted)").unwrap();
        assert_eq!(
            (v.start, v.end, v.offset, v.inode),
            (0x7f00, 0x8f00, 0x2000, 1234)
        );
        assert!(v.shared);
        assert_eq!(v.path, "/memfd:x (deleted)");
        let v = parse_vma("1000-2000 rw-p 00000000 00:00 0").unwrap();
        assert!(!v.shared && v.path.is_empty());
        assert!(parse_vma("garbage").is_none());
    }
}
