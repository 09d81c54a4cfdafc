//! Cost of the PRM layout accessors: the generated views over `get_bits`/`set_bits`.

use criterion::{criterion_group, criterion_main, Criterion};
use mlx5_hw::ifc::{create_cq_in, CreateCqIn};
use std::hint::black_box;

fn accessors(c: &mut Criterion) {
    let mut buf = vec![0u8; create_cq_in::SIZE_BYTES + 8 * 16];
    c.bench_function("layout/create_cq_in emit (6 fields + 16 pas)", |b| {
        b.iter(|| {
            let mut v = CreateCqIn::new_unchecked(&mut buf[..]);
            v.set_opcode(black_box(0x400));
            let mut cq = v.cq_context_mut();
            cq.set_log_cq_size(black_box(10))
                .set_uar_page(black_box(7))
                .set_c_eqn_or_apu_element(black_box(3))
                .set_log_page_size(black_box(0))
                .set_dbr_addr(black_box(0x1000));
            for i in 0..16 {
                v.set_pas(i, black_box(0x20_0000 + (i as u64) * 4096));
            }
        })
    });
    c.bench_function("layout/cqc parse (3 fields)", |b| {
        b.iter(|| {
            let v = CreateCqIn::new_checked(black_box(&buf[..])).unwrap();
            let cq = v.cq_context();
            black_box(cq.log_cq_size() as u64 + cq.uar_page() as u64 + cq.dbr_addr())
        })
    });
}

criterion_group!(benches, accessors);
criterion_main!(benches);
