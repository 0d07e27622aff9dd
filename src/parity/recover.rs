//! RAID6 reconstruction of one or two missing blocks, as md's lib/raid6/recov.c
//! does it: recompute the syndromes with the missing data blocks taken as
//! zero, then solve for them with multiplications by constants.

use std::cell::RefCell;

use super::gf;
use super::kernel::Ops;

thread_local! {
    /// Zeros standing in for missing data blocks; grown, never written.
    static ZEROS: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// Where a P nobody asked for goes when Q is regenerated.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `len` zero bytes and `len` bytes of scratch, reusing this
/// thread's buffers (a fresh allocation per stripe would cost page faults).
fn with_buffers<R>(len: usize, f: impl FnOnce(&[u8], &mut [u8]) -> R) -> R {
    ZEROS.with(|zeros| {
        SCRATCH.with(|scratch| {
            let mut zeros = zeros.borrow_mut();
            let mut scratch = scratch.borrow_mut();
            if zeros.len() < len {
                zeros.resize(len, 0);
                scratch.resize(len, 0);
            }
            f(&zeros[..len], &mut scratch[..len])
        })
    })
}

/// The kernels recovery runs on: `gen` for XOR and syndromes, `mul` for the
/// multiplications by constants.
pub(crate) struct Engines {
    pub gen: Ops,
    pub mul: Ops,
}

/// Lends out the blocks named in `failed` (ascending) mutably and every block
/// shared, with the failed ones replaced by `zero` in the shared list.
fn take<'a>(
    blocks: &'a mut [&mut [u8]],
    failed: &[usize],
    zero: &'a [u8],
) -> (Vec<&'a mut [u8]>, Vec<&'a [u8]>) {
    let mut taken = Vec::with_capacity(failed.len());
    let mut all = Vec::with_capacity(blocks.len());
    for (i, block) in blocks.iter_mut().enumerate() {
        if failed.contains(&i) {
            taken.push(&mut **block);
            all.push(zero);
        } else {
            all.push(&**block);
        }
    }
    (taken, all)
}

/// See `Parity::raid6_recover`.
pub(crate) fn raid6_recover(engines: &Engines, blocks: &mut [&mut [u8]], failed: &[usize]) {
    assert!(
        blocks.len() >= 3,
        "RAID6 needs at least one data block plus P and Q"
    );
    let k = blocks.len() - 2;
    let len = blocks[0].len();
    assert!(
        blocks.iter().all(|b| b.len() == len),
        "blocks differ in length"
    );
    let mut failed: Vec<usize> = failed.to_vec();
    failed.sort_unstable();
    failed.dedup();
    assert!(
        failed.len() <= 2,
        "RAID6 recovers at most two blocks, asked for {failed:?}"
    );
    assert!(
        failed.iter().all(|&f| f < k + 2),
        "failed index out of range: {failed:?}"
    );
    with_buffers(len, |zero, p_scratch| {
        solve(engines, blocks, &failed, k, zero, p_scratch)
    });
}

fn solve(
    engines: &Engines,
    blocks: &mut [&mut [u8]],
    failed: &[usize],
    k: usize,
    zero: &[u8],
    p_scratch: &mut [u8],
) {
    let (p_index, q_index) = (k, k + 1);
    let (g, m) = (&engines.gen, &engines.mul);

    // SAFETY (all calls below): `Engines` only holds operations of kernels the
    // CPU supports, and every slice has length `len`.
    unsafe {
        match *failed {
            [] => {}
            [x] if x < k => {
                let (mut taken, all) = take(blocks, failed, zero);
                let sources: Vec<&[u8]> =
                    (0..=p_index).filter(|&i| i != x).map(|i| all[i]).collect();
                (g.xor_gen)(&sources, taken[0]);
            }
            [x] if x == p_index => {
                let (mut taken, all) = take(blocks, failed, zero);
                (g.xor_gen)(&all[..k], taken[0]);
            }
            [_] => {
                let (mut taken, all) = take(blocks, failed, zero);
                (g.pq_gen)(&all[..k], p_scratch, taken[0]);
            }
            [x, y] if x == p_index && y == q_index => {
                let (mut taken, all) = take(blocks, failed, zero);
                let (p, q) = taken.split_at_mut(1);
                (g.pq_gen)(&all[..k], p[0], q[0]);
            }
            [x, y] if y == p_index => {
                // Data x and P: Q' without x lands in x, P's block is scratch.
                let (mut taken, all) = take(blocks, failed, zero);
                let (dx, p) = taken.split_at_mut(1);
                (g.pq_gen)(&all[..k], p[0], dx[0]);
                // Q ^ Q' = g^x * D_x.
                (m.mul_of_xor)(gf::pow_g(-(x as i64)), all[q_index], dx[0]);
                let data: Vec<&[u8]> = (0..k)
                    .map(|i| if i == x { &*dx[0] } else { all[i] })
                    .collect();
                (g.xor_gen)(&data, p[0]);
            }
            [x, _] if x < k && failed[1] == q_index => {
                let (mut taken, all) = take(blocks, failed, zero);
                let (dx, q) = taken.split_at_mut(1);
                let sources: Vec<&[u8]> =
                    (0..=p_index).filter(|&i| i != x).map(|i| all[i]).collect();
                (g.xor_gen)(&sources, dx[0]);
                let data: Vec<&[u8]> = (0..k)
                    .map(|i| if i == x { &*dx[0] } else { all[i] })
                    .collect();
                (g.pq_gen)(&data, p_scratch, q[0]);
            }
            [x, y] => {
                // Two data blocks: with both taken as zero the syndromes land in
                // their blocks as P' and Q'; then
                //   D_x = A (P^P') ^ B (Q^Q'),  D_y = (P^P') ^ D_x
                // with A = g^y / (g^x ^ g^y) and B = 1 / (g^x ^ g^y).
                let (mut taken, all) = take(blocks, failed, zero);
                let (dx, dy) = taken.split_at_mut(1);
                (g.pq_gen)(&all[..k], dx[0], dy[0]);
                let (gx, gy) = (gf::pow_g(x as i64), gf::pow_g(y as i64));
                let denominator = gf::inv(gx ^ gy);
                let a = gf::mul(gy, denominator);
                (m.recov_2data)(a, denominator, all[p_index], all[q_index], dx[0], dy[0]);
            }
            _ => unreachable!("failed has at most two entries"),
        }
    }
}
