//! Whether a generation call's sources are already in the CPU caches, decided
//! per call by timing the loads of their first cache lines.
//!
//! Why: ordinary stores are the right policy when parity is computed from
//! blocks just read or written (the output is handed straight on and stays in
//! cache), non-temporal stores when the blocks come from DRAM (an ordinary
//! store would first read each output line from DRAM, and the output would
//! only evict useful lines). A call's length cannot tell the two apart (a 64
//! KiB stripe is both), the sources' residency can. The probed lines are the
//! first ones the kernel needs anyway, so a cold call loses nothing to the
//! probe; a hot one pays two timestamp reads (about 1 % of a 64 KiB stripe,
//! which is why small calls are not probed).
//!
//! [`CacheProbe::calibrate`] measures, at start, how long the probe takes on
//! lines in L1 and on lines just flushed to DRAM (`clflush`), and puts the
//! threshold halfway; where the timer cannot tell them apart (a hypervisor
//! trapping `rdtsc`, a non-x86 CPU) there is no probe and every call uses the
//! ordinary kernel.

/// At most this many sources are probed (their loads overlap, so the probe
/// costs one memory latency however many there are).
const PROBED_SOURCES: usize = 8;
/// Calls with shorter blocks are never probed: the timestamps would cost
/// several percent of a hot call, and a short cold call has little to win.
pub const MIN_PROBED_LEN: usize = 32 * 1024;
const CALIBRATION_ROUNDS: usize = 24;
/// A probe of in-cache lines slower than this means the timer itself is slow
/// (e.g. trapped by a hypervisor): probing would cost more than it saves.
const MAX_HOT_TICKS: u64 = 600;

/// The calibrated probe: timestamp ticks for lines in cache and in DRAM.
#[derive(Clone, Copy, Debug)]
pub struct CacheProbe {
    pub hot_ticks: u64,
    pub dram_ticks: u64,
    threshold: u64,
}

impl CacheProbe {
    /// Times the probe on cached and on flushed lines; `None` when the two
    /// cannot be told apart here.
    pub fn calibrate() -> Option<CacheProbe> {
        let (hot_ticks, dram_ticks) = arch::calibration_times(CALIBRATION_ROUNDS)?;
        let usable = hot_ticks <= MAX_HOT_TICKS
            && dram_ticks >= 2 * hot_ticks.max(1)
            && dram_ticks - hot_ticks >= 40;
        usable.then_some(CacheProbe {
            hot_ticks,
            dram_ticks,
            threshold: hot_ticks + (dram_ticks - hot_ticks) / 2,
        })
    }

    /// Whether the first lines of `sources` (of `len` bytes each) took as long
    /// as a trip to DRAM; short calls count as hot without a probe.
    #[inline]
    pub fn sources_cold(&self, sources: &[&[u8]], len: usize) -> bool {
        len >= MIN_PROBED_LEN && arch::time_first_lines(sources) > self.threshold
    }

    /// The tick count above which a probe means "from DRAM".
    pub fn threshold(&self) -> u64 {
        self.threshold
    }
}

pub use arch::evict;

#[cfg(target_arch = "x86_64")]
mod arch {
    use std::arch::x86_64::{__cpuid, __rdtscp, _mm_clflush, _mm_lfence, _mm_mfence, _rdtsc};

    use super::PROBED_SOURCES;

    /// Timestamp ticks to load the first byte of up to PROBED_SOURCES blocks.
    #[inline]
    pub fn time_first_lines(sources: &[&[u8]]) -> u64 {
        let mut sink = 0u8;
        let mut aux = 0u32;
        // SAFETY: SSE2 and rdtscp exist on every x86_64 CPU this crate runs
        // on (rdtscp since 2006); the volatile reads are of live slices.
        let ticks = unsafe {
            // Only the fence that keeps the loads after the first timestamp:
            // each fence drains the pipeline, and hot calls pay for it.
            let start = _rdtsc();
            _mm_lfence();
            for block in sources.iter().take(PROBED_SOURCES) {
                if let Some(first) = block.first() {
                    sink ^= std::ptr::read_volatile(first);
                }
            }
            // rdtscp waits until the loads above have completed.
            __rdtscp(&mut aux).saturating_sub(start)
        };
        std::hint::black_box(sink);
        ticks
    }

    /// CPUID 0x8000_0001, EDX bit 27 (std's feature macro does not know it).
    fn has_rdtscp() -> bool {
        let highest = __cpuid(0x8000_0000).eax;
        highest >= 0x8000_0001 && __cpuid(0x8000_0001).edx & (1 << 27) != 0
    }

    /// Writes back and drops every line of `bytes` from all cache levels.
    pub fn evict(bytes: &[u8]) {
        for line in bytes.chunks(64) {
            // SAFETY: flushing a line of a live buffer only evicts it.
            unsafe { _mm_clflush(line.as_ptr()) };
        }
        // SAFETY: a plain fence.
        unsafe { _mm_mfence() };
    }

    /// (best probe time on cached lines, median on flushed lines).
    pub fn calibration_times(rounds: usize) -> Option<(u64, u64)> {
        if !has_rdtscp() {
            return None;
        }
        // Four blocks a page apart, as a stripe's sources are.
        const SPACING: usize = 4096;
        let buffer = vec![1u8; PROBED_SOURCES.min(4) * SPACING];
        let blocks: Vec<&[u8]> = buffer.chunks(SPACING).collect();
        let hot = (0..rounds)
            .map(|_| time_first_lines(&blocks))
            .min()
            .unwrap_or(u64::MAX);
        let mut flushed: Vec<u64> = (0..rounds)
            .map(|_| {
                for block in &blocks {
                    // SAFETY: flushing a line of a live buffer only evicts it.
                    unsafe { _mm_clflush(block.as_ptr()) };
                }
                // SAFETY: a plain fence.
                unsafe { _mm_mfence() };
                time_first_lines(&blocks)
            })
            .collect();
        flushed.sort_unstable();
        Some((hot, flushed[flushed.len() / 2]))
    }
}

#[cfg(not(target_arch = "x86_64"))]
mod arch {
    #[inline]
    pub fn time_first_lines(_sources: &[&[u8]]) -> u64 {
        0
    }
    pub fn calibration_times(_rounds: usize) -> Option<(u64, u64)> {
        None
    }
    pub fn evict(_bytes: &[u8]) {}
}

#[cfg(test)]
impl CacheProbe {
    /// A probe that finds every probed call cold (to test the cold path).
    pub fn always_cold() -> CacheProbe {
        CacheProbe {
            hot_ticks: 0,
            dram_ticks: 0,
            threshold: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many of `tries` probes of `sources` found them cold, `prepare`
    /// running before each.
    fn cold_count(probe: &CacheProbe, sources: &[&[u8]], prepare: impl Fn()) -> usize {
        (0..9)
            .filter(|_| {
                prepare();
                probe.sources_cold(sources, MIN_PROBED_LEN)
            })
            .count()
    }

    #[test]
    fn calibrated_probe_tells_cached_from_flushed_sources() {
        let Some(probe) = CacheProbe::calibrate() else {
            eprintln!("SKIPPED: no usable cache probe on this machine");
            return;
        };
        assert!(probe.hot_ticks < probe.threshold() && probe.threshold() < probe.dram_ticks);
        let buffer = vec![7u8; 4 * MIN_PROBED_LEN];
        let sources: Vec<&[u8]> = buffer.chunks(MIN_PROBED_LEN).collect();
        // A majority vote: a probe can be interrupted on a busy machine.
        let touch = || {
            let sum: u32 = sources.iter().map(|s| s[0] as u32).sum();
            std::hint::black_box(sum);
        };
        assert!(
            cold_count(&probe, &sources, touch) <= 4,
            "cached sources seen cold"
        );
        let flush = || sources.iter().for_each(|s| evict(&s[..64]));
        #[cfg(target_arch = "x86_64")]
        assert!(
            cold_count(&probe, &sources, flush) >= 5,
            "flushed sources seen cached"
        );
    }

    #[test]
    fn short_blocks_are_never_probed() {
        let probe = CacheProbe::always_cold();
        let buffer = vec![1u8; 4 * 1024];
        let sources: Vec<&[u8]> = buffer.chunks(1024).collect();
        assert!(!probe.sources_cold(&sources, MIN_PROBED_LEN - 1));
        #[cfg(target_arch = "x86_64")]
        assert!(probe.sources_cold(&sources, MIN_PROBED_LEN));
    }
}
