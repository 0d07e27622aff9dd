//! The start-up measurement that picks the kernels, in the spirit of md's
//! raid6_select_algo / calibrate_xor_blocks: every supported kernel runs each
//! operation on in-cache buffers in several short windows, interleaved across
//! kernels, and the best window counts (a frequency ramp, a preemption or a
//! neighbour's burst spoils some windows of a kernel, rarely all of them).
//! The whole pass stays well under 50 ms.
//!
//! The chosen generation kernels are then timed once more against their
//! streaming-store twins on stripes flushed from every cache level, which is
//! what decides the kernel for calls whose sources the probe finds cold.

use std::time::{Duration, Instant};

use super::kernel::{Kernel, Ops};
use super::probe;
use super::recover::{self, Engines};

/// Data blocks per measured stripe (md's gen() figures also use a wide-ish stripe).
const DATA_BLOCKS: usize = 4;
/// Chunk size: 4 x 16 KiB + P + Q stays inside any L2.
const CHUNK: usize = 16 * 1024;
const ROUNDS: usize = 6;
/// Time for all measurements together.
const BUDGET: Duration = Duration::from_millis(20);
const MAX_WINDOW: Duration = Duration::from_millis(2);

/// What a figure measures.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Operation {
    Xor,
    Gen,
    Recover,
    /// XOR on sources and destination flushed to DRAM.
    XorCold,
    /// P+Q on sources and destinations flushed to DRAM.
    GenCold,
}

/// One measured rate, in MB/s of data blocks processed.
#[derive(Clone, Debug)]
pub struct Figure {
    pub kernel: &'static str,
    pub operation: Operation,
    pub mb_per_s: u64,
}

/// Runs `op` repeatedly for `window` and returns MB/s, counting `bytes` per run.
fn rate(window: Duration, bytes: usize, mut op: impl FnMut()) -> u64 {
    op();
    let start = Instant::now();
    let mut runs = 0u64;
    loop {
        op();
        op();
        runs += 2;
        let elapsed = start.elapsed();
        if elapsed >= window {
            let bytes_done = runs as f64 * bytes as f64;
            return (bytes_done / elapsed.as_secs_f64() / 1e6) as u64;
        }
    }
}

/// Measures every kernel in `candidates` (all must be supported) and returns
/// the best figure of each (kernel, operation).
pub fn measure(candidates: &[(&'static Kernel, Ops)]) -> Vec<Figure> {
    let data: Vec<Vec<u8>> = (0..DATA_BLOCKS)
        .map(|i| {
            (0..CHUNK)
                .map(|j| (i * 131 + j * 7 + (j >> 8)) as u8)
                .collect()
        })
        .collect();
    let sources: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
    let mut p = vec![0u8; CHUNK];
    let mut q = vec![0u8; CHUNK];
    let mut stripe: Vec<Vec<u8>> = vec![vec![0u8; CHUNK]; DATA_BLOCKS + 2];
    let bytes = DATA_BLOCKS * CHUNK;
    let window = (BUDGET / (3 * ROUNDS * candidates.len().max(1)) as u32).min(MAX_WINDOW);

    let mut figures: Vec<Figure> = Vec::new();
    for _ in 0..ROUNDS {
        for &(kernel, ops) in candidates {
            let engines = Engines { gen: ops, mul: ops };
            // SAFETY: candidates are supported kernels; all buffers are CHUNK long.
            let xor = rate(window, bytes, || unsafe { (ops.xor_gen)(&sources, &mut p) });
            let gen = rate(window, bytes, || unsafe {
                (ops.pq_gen)(&sources, &mut p, &mut q)
            });
            let recover = rate(window, bytes, || {
                let mut blocks: Vec<&mut [u8]> =
                    stripe.iter_mut().map(|b| b.as_mut_slice()).collect();
                recover::raid6_recover(&engines, &mut blocks, &[0, 1]);
            });
            for (operation, mb_per_s) in [
                (Operation::Xor, xor),
                (Operation::Gen, gen),
                (Operation::Recover, recover),
            ] {
                match figures
                    .iter_mut()
                    .find(|f| f.kernel == kernel.name() && f.operation == operation)
                {
                    Some(f) => f.mb_per_s = f.mb_per_s.max(mb_per_s),
                    None => figures.push(Figure {
                        kernel: kernel.name(),
                        operation,
                        mb_per_s,
                    }),
                }
            }
        }
    }
    figures
}

/// The fastest kernel for `operation` among `figures`.
pub fn fastest(figures: &[Figure], operation: Operation) -> Option<&Figure> {
    figures
        .iter()
        .filter(|f| f.operation == operation)
        .max_by_key(|f| f.mb_per_s)
}

/// Chunk of the cold measurement: the size the goal is set at, and large
/// enough that the probe runs (`probe::MIN_PROBED_LEN`).
const COLD_CHUNK: usize = 64 * 1024;
const COLD_ROUNDS: usize = 4;

/// Times each of `variants` (supported kernels' ops) on `operation`
/// (`XorCold` or `GenCold`) over a 4 x 64 KiB stripe whose every line was
/// flushed to DRAM just before, rounds interleaved; the best round counts.
/// Returns MB/s of data per variant, in order.
pub fn measure_cold(operation: Operation, variants: &[Ops]) -> Vec<u64> {
    // One buffer, 64-byte aligned, so the streaming stores are not refused.
    const ALIGN: usize = 64;
    let mut buffer = vec![0u8; (DATA_BLOCKS + 2) * COLD_CHUNK + ALIGN];
    let skip = buffer.as_ptr().align_offset(ALIGN).min(ALIGN);
    let stripe = &mut buffer[skip..skip + (DATA_BLOCKS + 2) * COLD_CHUNK];
    for (j, byte) in stripe.iter_mut().enumerate() {
        *byte = (j * 7 + (j >> 9)) as u8;
    }
    let (data, outputs) = stripe.split_at_mut(DATA_BLOCKS * COLD_CHUNK);
    let (p, q) = outputs.split_at_mut(COLD_CHUNK);
    let sources: Vec<&[u8]> = data.chunks(COLD_CHUNK).collect();
    let mut best = vec![Duration::MAX; variants.len()];
    for _ in 0..COLD_ROUNDS {
        for (slot, ops) in variants.iter().enumerate() {
            for block in sources.iter().copied().chain([&*p, &*q]) {
                probe::evict(block);
            }
            let start = Instant::now();
            // SAFETY: the variants are supported kernels; all blocks are
            // COLD_CHUNK long.
            unsafe {
                match operation {
                    Operation::GenCold => (ops.pq_gen)(&sources, p, q),
                    _ => (ops.xor_gen)(&sources, p),
                }
            }
            best[slot] = best[slot].min(start.elapsed());
        }
    }
    let bytes = (DATA_BLOCKS * COLD_CHUNK) as f64;
    best.iter()
        .map(|t| (bytes / t.as_secs_f64().max(1e-9) / 1e6) as u64)
        .collect()
}
