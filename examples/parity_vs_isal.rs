//! Side-by-side speed of ISA-L's `xor_gen`/`pq_gen` and raidfs's chosen
//! kernels on the same buffers, in the same run: hot (one 4+P(+Q) stripe of
//! 64 KiB chunks, in cache) and cold (cycling through 256 MiB of stripes).
//! Also checks that both produce the same P and Q.
//!
//! Needs Debian's libisal-dev: `cargo run --release --features isal --example parity_vs_isal`.
//! Rates are GB/s (10^9 bytes) of data blocks read, the best of several
//! interleaved rounds, with the median of same-round ratios to ISA-L.
//! Contenders: the measured selection (which switches to a streaming-store
//! twin for calls whose sources are cold), and its kernels forced alone.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

use raidfs::parity::Parity;

#[link(name = "isal")]
extern "C" {
    fn xor_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
    fn pq_gen(vects: c_int, len: c_int, array: *mut *mut c_void) -> c_int;
}

const DATA_BLOCKS: usize = 4;
const CHUNK: usize = 64 * 1024;
const COLD_SET: usize = 256 << 20;
/// Many short rounds rather than a few long ones: the neighbours' load on a
/// shared machine changes within a second, and same-round ratios follow it.
const ROUNDS: usize = 25;
const ROUND_TIME: Duration = Duration::from_millis(40);

/// A page-aligned, zeroed byte buffer (ISA-L wants aligned vectors).
struct Arena {
    ptr: *mut u8,
    layout: Layout,
}

impl Arena {
    fn new(len: usize) -> Arena {
        let layout = match Layout::from_size_align(len, 4096) {
            Ok(layout) => layout,
            Err(e) => panic!("bad layout for {len} bytes: {e}"),
        };
        // SAFETY: non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        assert!(!ptr.is_null(), "out of memory allocating {len} bytes");
        Arena { ptr, layout }
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: allocated with this length, exclusively borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: allocated with this layout.
        unsafe { dealloc(self.ptr, self.layout) }
    }
}

/// Stripes of DATA_BLOCKS data chunks then P then Q, laid out back to back.
struct Stripes {
    arena: Arena,
    count: usize,
}

const STRIPE: usize = (DATA_BLOCKS + 2) * CHUNK;

impl Stripes {
    fn new(count: usize) -> Stripes {
        let mut arena = Arena::new(count * STRIPE);
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for word in arena.bytes().chunks_exact_mut(8) {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            word.copy_from_slice(&seed.to_le_bytes());
        }
        Stripes { arena, count }
    }
    /// Raw pointers of stripe `i`: data, then P, then Q.
    fn pointers(&mut self, i: usize) -> [*mut c_void; DATA_BLOCKS + 2] {
        let base = self.arena.bytes()[i * STRIPE..].as_mut_ptr();
        // SAFETY: every chunk lies inside stripe i.
        std::array::from_fn(|b| unsafe { base.add(b * CHUNK) } as *mut c_void)
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Who {
    Isal,
    Raidfs,
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Xor,
    Pq,
}

fn run_once(parity: &Parity, who: Who, op: Op, ptrs: &mut [*mut c_void; DATA_BLOCKS + 2]) {
    match who {
        Who::Isal => {
            let vects = match op {
                Op::Xor => DATA_BLOCKS + 1,
                Op::Pq => DATA_BLOCKS + 2,
            };
            // SAFETY: the pointers name vects aligned chunks of CHUNK bytes.
            let rc = unsafe {
                match op {
                    Op::Xor => xor_gen(vects as c_int, CHUNK as c_int, ptrs.as_mut_ptr()),
                    Op::Pq => pq_gen(vects as c_int, CHUNK as c_int, ptrs.as_mut_ptr()),
                }
            };
            assert_eq!(rc, 0, "ISA-L refused the buffers");
        }
        Who::Raidfs => {
            // SAFETY: the chunks are disjoint parts of one live arena.
            let chunk =
                |p: *mut c_void| unsafe { std::slice::from_raw_parts_mut(p as *mut u8, CHUNK) };
            let data: Vec<&[u8]> = ptrs[..DATA_BLOCKS].iter().map(|&p| &*chunk(p)).collect();
            match op {
                Op::Xor => parity.xor_gen(&data, chunk(ptrs[DATA_BLOCKS])),
                Op::Pq => parity.pq_gen(
                    &data,
                    chunk(ptrs[DATA_BLOCKS]),
                    chunk(ptrs[DATA_BLOCKS + 1]),
                ),
            }
        }
    }
}

/// GB/s of data processed over one round, cycling through all stripes.
fn round(parity: &Parity, who: Who, op: Op, stripes: &mut Stripes) -> f64 {
    let all: Vec<[*mut c_void; DATA_BLOCKS + 2]> =
        (0..stripes.count).map(|i| stripes.pointers(i)).collect();
    let mut runs = 0usize;
    let start = Instant::now();
    while start.elapsed() < ROUND_TIME {
        for ptrs in &all {
            let mut ptrs = *ptrs;
            run_once(parity, who, op, &mut ptrs);
        }
        runs += all.len();
    }
    (runs * DATA_BLOCKS * CHUNK) as f64 / start.elapsed().as_secs_f64() / 1e9
}

/// ISA-L against each raidfs contender, interleaved round by round. Each
/// contender gets its best round's rate, the ratio of that to ISA-L's best,
/// and the median over rounds of its rate over ISA-L's in the same round
/// (neighbours' load drifts slowly, so same-round ratios cancel most of it).
fn compare(contenders: &[(&str, &Parity)], label: &str, stripes: &mut Stripes) {
    for op in [Op::Xor, Op::Pq] {
        let mut isal = 0.0f64;
        let mut best = vec![0.0f64; contenders.len()];
        let mut ratios = vec![Vec::with_capacity(ROUNDS); contenders.len()];
        for _ in 0..ROUNDS {
            let isal_now = round(contenders[0].1, Who::Isal, op, stripes);
            isal = isal.max(isal_now);
            for (slot, (_, parity)) in contenders.iter().enumerate() {
                let rate = round(parity, Who::Raidfs, op, stripes);
                best[slot] = best[slot].max(rate);
                ratios[slot].push(rate / isal_now);
            }
        }
        let name = match op {
            Op::Xor => "xor 4+1",
            Op::Pq => "pq  4+2",
        };
        let mut line = format!("{label:<5} {name}  isa-l {isal:>5.1}");
        for (((who, parity), rate), ratios) in contenders.iter().zip(&best).zip(&mut ratios) {
            let (hot, cold) = match op {
                Op::Xor => (parity.chosen_xor(), parity.chosen_cold().0),
                Op::Pq => (parity.chosen().0, parity.chosen_cold().1),
            };
            let kernel = match cold {
                Some(cold) => format!("{hot}/{cold}"),
                None => hot.to_string(),
            };
            ratios.sort_by(f64::total_cmp);
            line += &format!(
                " | {who} {kernel} {rate:>5.1} ({:.2}x, med {:.2}x)",
                rate / isal,
                ratios[ratios.len() / 2]
            );
        }
        println!("{line}");
    }
}

/// Both libraries must agree on P and Q (ISA-L uses the same field and g).
fn check_agreement(parity: &Parity, stripes: &mut Stripes) {
    let mut ptrs = stripes.pointers(0);
    let read = |p: *mut c_void| {
        // SAFETY: a CHUNK-long chunk of the arena.
        unsafe { std::slice::from_raw_parts(p as *const u8, CHUNK) }.to_vec()
    };
    run_once(parity, Who::Isal, Op::Pq, &mut ptrs);
    let (isal_p, isal_q) = (read(ptrs[DATA_BLOCKS]), read(ptrs[DATA_BLOCKS + 1]));
    run_once(parity, Who::Raidfs, Op::Pq, &mut ptrs);
    assert!(read(ptrs[DATA_BLOCKS]) == isal_p, "P differs from ISA-L's");
    assert!(
        read(ptrs[DATA_BLOCKS + 1]) == isal_q,
        "Q differs from ISA-L's"
    );
    println!("P and Q agree with ISA-L's pq_gen");
}

fn main() {
    let selecting = Instant::now();
    let selected = Parity::select(None);
    let selection_time = selecting.elapsed();
    let parity = match selected {
        Ok(parity) => parity,
        Err(e) => {
            eprintln!("parity_vs_isal: {e}");
            std::process::exit(1);
        }
    };
    for line in parity.report() {
        println!("{line}");
    }
    println!("start-up selection took {selection_time:.1?}");
    let mut hot = Stripes::new(1);
    check_agreement(&parity, &mut hot);
    // The chosen kernels forced alone: ordinary stores for every call (what
    // a measured selection used before the cache probe), and their
    // streaming-store twin for every call.
    let ordinary = Parity::select(Some(parity.chosen().0)).ok();
    let streaming = parity
        .chosen_cold()
        .1
        .and_then(|twin| Parity::select(Some(twin)).ok());
    let mut contenders = vec![("chosen", &parity)];
    for forced in [&ordinary, &streaming].into_iter().flatten() {
        contenders.push(("forced", forced));
    }
    println!(
        "{DATA_BLOCKS} data chunks of {} KiB; GB/s of data, best of {ROUNDS} interleaved rounds; \
         (x) = best over ISA-L's best, med = median of same-round ratios; chosen = hot/cold-source kernel",
        CHUNK / 1024
    );
    compare(&contenders, "hot", &mut hot);
    let mut cold = Stripes::new(COLD_SET / STRIPE);
    compare(&contenders, "cold", &mut cold);
}
