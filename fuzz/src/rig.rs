//! A device model in this process with host memory mapped at fixed IOVAs,
//! driven the way a driver drives it (config space, the mapped BAR, DMA
//! buffers): the bench for the targets that feed the model commands and
//! work requests. Made on first use in each process (after the fuzzer's
//! fork: the model's worker thread is the child's) and reset by FLR before
//! every input, so each input starts from power-on.

use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use mlx5_emu::initseg::{self, rd, wr};
use mlx5_emu::{emulated_with, Device, DeviceConfig};
use vfio::emulated::EmulatedFunction;
use vfio::{DmaBuffer, Iova, PciFunction};

/// IOVA of the command queue page.
pub const CMDQ_IOVA: u64 = 0x10_0000;
/// IOVA of the mailbox area: [`MBOX_BLOCKS`] blocks 1 KiB apart.
pub const MBOX_IOVA: u64 = 0x20_0000;
/// Mailbox blocks in the mailbox area (inputs use the first half, outputs
/// the second).
pub const MBOX_BLOCKS: usize = 32;
/// IOVA of the memory that commands may hand to firmware (pages, queues,
/// doorbell records): [`MEM_LEN`] bytes.
pub const MEM_IOVA: u64 = 0x100_0000;
/// Size of that memory.
pub const MEM_LEN: usize = 1 << 20;
/// IOVA of the pages handed to firmware at bring-up ([`PAGES_LEN`]
/// bytes; a memfd, so pages never touched cost nothing).
pub const PAGES_IOVA: u64 = 0x1000_0000;
/// Size of that memory: the boot and init pages of every profile.
pub const PAGES_LEN: usize = 64 << 20;
/// How long one command may take before the model counts as hung.
pub const CMD_DEADLINE: Duration = Duration::from_secs(10);

/// The function and its mapped memory.
#[derive(Debug)]
pub struct Rig {
    /// The function (the model behind the in-process backend).
    pub f: Arc<EmulatedFunction<Device>>,
    /// The command queue page.
    pub cmdq: Arc<DmaBuffer>,
    /// The mailbox area.
    pub mbox: Arc<DmaBuffer>,
    /// Memory for firmware pages and queues.
    pub mem: Arc<DmaBuffer>,
    /// The pages handed to firmware at bring-up (at [`PAGES_IOVA`]).
    pub pages: Arc<DmaBuffer>,
}

fn mapped(f: &EmulatedFunction<Device>, iova: u64, len: usize) -> Arc<DmaBuffer> {
    let b = DmaBuffer::new(len).unwrap_or_else(|e| panic!("DMA buffer of {len} bytes: {e}"));
    f.dma_map(Iova(iova), &b)
        .unwrap_or_else(|e| panic!("dma_map {iova:#x}: {e}"));
    b
}

/// This process's rig.
pub fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let cfg = DeviceConfig {
            fw_start: Duration::ZERO,
            ..DeviceConfig::default()
        };
        let f = Arc::new(emulated_with(cfg));
        let cmdq = mapped(&f, CMDQ_IOVA, 4096);
        let mbox = mapped(&f, MBOX_IOVA, MBOX_BLOCKS * 1024);
        let mem = mapped(&f, MEM_IOVA, MEM_LEN);
        let pages = mapped(&f, PAGES_IOVA, PAGES_LEN);
        Rig {
            f,
            cmdq,
            mbox,
            mem,
            pages,
        }
    })
}

impl Rig {
    /// BAR0 as the driver maps it.
    pub fn bar(&self) -> &DmaBuffer {
        self.f.model().bar0()
    }

    /// Function-level reset, host memory zeroed, then bus master on, the
    /// command queue address written and firmware ready.
    pub fn power_on(&self) {
        let _ = self.f.reset();
        for b in [&self.cmdq, &self.mbox, &self.mem] {
            let _ = b.write(0, &vec![0u8; b.len()]);
        }
        let _ = self.f.config_write(4, &0x0006u16.to_le_bytes());
        let t = Instant::now();
        while rd(self.bar(), initseg::INITIALIZING) & initseg::INITIALIZING_BIT != 0 {
            assert!(t.elapsed() < CMD_DEADLINE, "initializing never cleared");
            std::thread::yield_now();
        }
        wr(self.bar(), initseg::CMDQ_ADDR_H, (CMDQ_IOVA >> 32) as u32);
        wr(self.bar(), initseg::CMDQ_ADDR_L_SZ, CMDQ_IOVA as u32);
    }

    /// Writes `entry` into `slot` (ownership set), rings `doorbell` (which
    /// should include the slot's bit) and waits for ownership to come
    /// back; the completed entry.
    pub fn exec_entry(&self, slot: u8, entry: &[u8; 64], doorbell: u32) -> [u8; 64] {
        let at = usize::from(slot % (1 << initseg::LOG_CMDQ_SIZE)) * 64;
        // Every field, then `status_own` alone (release), as a driver must:
        // one copy of all 64 bytes may store the ownership byte twice, and
        // the model's lost-doorbell scan could run the command in between.
        let _ = self.cmdq.write(at, &entry[..0x3f]);
        let _ = self.cmdq.store_u8_release(at + 0x3f, entry[0x3f]);
        wr(self.bar(), initseg::CMD_DBELL, doorbell | 1 << (at / 64));
        let t = Instant::now();
        while self.cmdq.load_u8_acquire(at + 0x3f).unwrap_or(0) & 1 != 0 {
            assert!(
                t.elapsed() < CMD_DEADLINE,
                "command in slot {} (opcode {:#x}) never completed",
                at / 64,
                u16::from_be_bytes([entry[0x10], entry[0x11]])
            );
            std::thread::yield_now();
        }
        let mut e = [0u8; 64];
        let _ = self.cmdq.read(at, &mut e);
        e
    }
}
