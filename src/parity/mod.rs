//! Parity kernels: XOR (RAID5 P) and RAID6 P+Q over GF(2^8), polynomial 0x11d.
//!
//! Several implementations exist (scalar oracle, SSSE3, AVX2, AVX-512, GFNI);
//! [`Parity::select`] benchmarks those the CPU supports and keeps the fastest.
//! The engine only ever calls the methods on [`Parity`].
//!
//! Block conventions used by every method: all slices have the same length;
//! data blocks are given in data-index order (index 0 is multiplied by g^0 in Q).
//!
//! A measured selection also keeps, for XOR and P+Q generation, the chosen
//! kernel's streaming-store twin when it measured faster on memory flushed
//! from the caches; each call of at least `probe::MIN_PROBED_LEN` bytes per
//! block then times its sources' first lines and takes the twin when they
//! came from DRAM (see `probe`).
//!
//! Layout: `gf` (field arithmetic), `scalar` (portable oracle), `x86` (SIMD
//! kernels), `kernel` (registry and feature checks), `recover` (RAID6
//! reconstruction), `select` (start-up measurement), `probe` (per-call cache
//! residency of the sources).

pub mod gf;
mod kernel;
mod probe;
mod recover;
mod scalar;
mod select;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86;

use std::sync::OnceLock;

use kernel::Ops;
pub use kernel::{kernels, Kernel};
use probe::CacheProbe;
use select::{Figure, Operation};

/// Environment variable naming a kernel to force when `select` is given none.
pub const KERNEL_ENV: &str = "RAIDFS_PARITY_KERNEL";

/// The chosen kernels, one for each operation, plus the figures that chose them.
pub struct Parity {
    xor: &'static Kernel,
    gen: &'static Kernel,
    recov: &'static Kernel,
    xor_ops: Ops,
    gen_ops: Ops,
    recov_ops: Ops,
    /// The kernels for calls whose sources are cold (measured selections
    /// only, and only where the twin won on flushed memory).
    xor_cold: Option<ColdKernel>,
    gen_cold: Option<ColdKernel>,
    probe: Option<CacheProbe>,
    figures: Vec<Figure>,
    /// Where a forced choice came from (`None` when measured).
    forced_by: Option<&'static str>,
}

/// A streaming-store kernel used when the probe finds the sources in DRAM.
#[derive(Clone, Copy)]
struct ColdKernel {
    kernel: &'static Kernel,
    ops: Ops,
    probe: CacheProbe,
}

impl ColdKernel {
    /// `cold` when `sources` come from DRAM, else `hot`.
    #[inline]
    fn pick(this: &Option<ColdKernel>, hot: Ops, sources: &[&[u8]], len: usize) -> Ops {
        match this {
            Some(cold) if cold.probe.sources_cold(sources, len) => cold.ops,
            _ => hot,
        }
    }
}

/// Why a kernel could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("unknown parity kernel '{0}' (known: {1})")]
    Unknown(String, String),
    #[error("parity kernel '{0}' needs CPU features this machine lacks: {1}")]
    Unsupported(String, String),
}

/// The supported kernel called `name`, or why not.
fn usable(name: &str) -> Result<(&'static Kernel, Ops), ParityError> {
    let Some(kernel) = kernel::find(name) else {
        let known: Vec<&str> = kernels().iter().map(|k| k.name()).collect();
        return Err(ParityError::Unknown(name.to_string(), known.join(", ")));
    };
    match kernel.ops() {
        Some(ops) => Ok((kernel, ops)),
        None => Err(ParityError::Unsupported(
            name.to_string(),
            kernel.missing_features().join(", "),
        )),
    }
}

impl Parity {
    /// Benchmark every kernel this CPU supports (under 50 ms in all) and keep the
    /// fastest; `force` (or the RAIDFS_PARITY_KERNEL environment variable when
    /// `force` is None) names a kernel to use instead.
    pub fn select(force: Option<&str>) -> Result<Parity, ParityError> {
        if let Some(name) = force {
            return Parity::forced(name, "request");
        }
        if let Ok(name) = std::env::var(KERNEL_ENV) {
            if !name.trim().is_empty() {
                return Parity::forced(name.trim(), KERNEL_ENV);
            }
        }
        Ok(Parity::measured())
    }

    fn forced(name: &str, by: &'static str) -> Result<Parity, ParityError> {
        let (kernel, ops) = usable(name)?;
        Ok(Parity {
            xor: kernel,
            gen: kernel,
            recov: kernel,
            xor_ops: ops,
            gen_ops: ops,
            recov_ops: ops,
            xor_cold: None,
            gen_cold: None,
            probe: None,
            figures: Vec::new(),
            forced_by: Some(by),
        })
    }

    fn measured() -> Parity {
        let candidates: Vec<(&'static Kernel, Ops)> = kernels()
            .iter()
            .filter(|k| k.measured())
            .filter_map(|k| k.ops().map(|ops| (k, ops)))
            .collect();
        let mut figures = select::measure(&candidates);
        let pick = |operation| {
            let name = select::fastest(&figures, operation).map_or("scalar", |f| f.kernel);
            candidates
                .iter()
                .copied()
                .find(|(k, _)| k.name() == name)
                .unwrap_or(candidates[0])
        };
        let (xor, xor_ops) = pick(Operation::Xor);
        let (gen, gen_ops) = pick(Operation::Gen);
        let (recov, recov_ops) = pick(Operation::Recover);
        let probe = CacheProbe::calibrate();
        let mut cold_twin = |kernel: &'static Kernel, ops: Ops, operation| {
            let probe = probe?;
            let (twin, twin_ops) = usable(kernel.streaming_twin()?).ok()?;
            let rates = select::measure_cold(operation, &[ops, twin_ops]);
            for (name, &mb_per_s) in [kernel.name(), twin.name()].iter().zip(&rates) {
                figures.push(Figure {
                    kernel: name,
                    operation,
                    mb_per_s,
                });
            }
            (rates[1] > rates[0]).then_some(ColdKernel {
                kernel: twin,
                ops: twin_ops,
                probe,
            })
        };
        let xor_cold = cold_twin(xor, xor_ops, Operation::XorCold);
        let gen_cold = cold_twin(gen, gen_ops, Operation::GenCold);
        Parity {
            xor,
            gen,
            recov,
            xor_ops,
            gen_ops,
            recov_ops,
            xor_cold,
            gen_cold,
            probe,
            figures,
            forced_by: None,
        }
    }

    /// The process-wide selection, made on first use with `select(None)`
    /// (falling back to the scalar kernel, with a logged warning, if the
    /// environment names a kernel that cannot be used).
    pub fn global() -> &'static Parity {
        static GLOBAL: OnceLock<Parity> = OnceLock::new();
        GLOBAL.get_or_init(|| match Parity::select(None) {
            Ok(parity) => parity,
            Err(e) => {
                log::warn!("{e}; using the scalar parity kernel");
                // The scalar kernel needs no CPU feature, so this cannot fail.
                match Parity::forced("scalar", "fallback") {
                    Ok(parity) => parity,
                    Err(e) => unreachable!("scalar kernel refused: {e}"),
                }
            }
        })
    }

    /// `p = XOR of data`.
    pub fn xor_gen(&self, data: &[&[u8]], p: &mut [u8]) {
        assert!(
            data.iter().all(|d| d.len() == p.len()),
            "xor_gen: blocks differ in length"
        );
        let ops = ColdKernel::pick(&self.xor_cold, self.xor_ops, data, p.len());
        // SAFETY: the kernel is supported (checked when `self` was built) and
        // every slice is as long as `p`.
        unsafe { (ops.xor_gen)(data, p) }
    }

    /// `p ^= src` (read-modify-write updates and incremental XOR).
    pub fn xor_into(&self, p: &mut [u8], src: &[u8]) {
        assert_eq!(p.len(), src.len(), "xor_into: blocks differ in length");
        // SAFETY: as in `xor_gen`.
        unsafe { (self.xor_ops.xor_into)(p, src) }
    }

    /// `p = XOR of data`, `q = sum of g^i * data[i]`.
    pub fn pq_gen(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        assert!(
            q.len() == p.len() && data.iter().all(|d| d.len() == p.len()),
            "pq_gen: blocks differ in length"
        );
        let ops = ColdKernel::pick(&self.gen_cold, self.gen_ops, data, p.len());
        // SAFETY: as in `xor_gen`.
        unsafe { (ops.pq_gen)(data, p, q) }
    }

    /// Read-modify-write: data block `index` changes by `delta = old ^ new`;
    /// `p ^= delta`, `q ^= g^index * delta`.
    pub fn pq_update(&self, index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
        assert!(
            p.len() == delta.len() && q.len() == delta.len(),
            "pq_update: blocks differ in length"
        );
        // SAFETY: as in `xor_gen`.
        unsafe {
            (self.xor_ops.xor_into)(p, delta);
            (self.recov_ops.mul_acc)(gf::pow_g(index as i64), delta, q);
        }
    }

    /// RAID6 recovery in place. `blocks` holds data 0..k, then P, then Q
    /// (k + 2 blocks). `failed` names one or two indices into `blocks` whose
    /// contents are garbage; they are rebuilt from the others.
    pub fn raid6_recover(&self, blocks: &mut [&mut [u8]], failed: &[usize]) {
        let engines = recover::Engines {
            gen: self.gen_ops,
            mul: self.recov_ops,
        };
        recover::raid6_recover(&engines, blocks, failed)
    }

    /// Name of the kernel used for each operation, e.g. `("avx2x4", "avx2x4")`
    /// for (XOR / P+Q generation, RAID6 recovery).
    pub fn chosen(&self) -> (&str, &str) {
        (self.gen.name(), self.recov.name())
    }

    /// Name of the kernel used for XOR (P only) parity; measured separately
    /// from P+Q generation, like md's xor and raid6 choices.
    pub fn chosen_xor(&self) -> &str {
        self.xor.name()
    }

    /// The kernels XOR and P+Q generation switch to when a call's sources
    /// are not in cache (`None`: the same kernel as for cached sources).
    pub fn chosen_cold(&self) -> (Option<&str>, Option<&str>) {
        (
            self.xor_cold.map(|c| c.kernel.name()),
            self.gen_cold.map(|c| c.kernel.name()),
        )
    }

    /// The lines to log at mount, md style (`raid6: avx2x4 gen() 20313 MB/s`,
    /// `raid6: using algorithm avx2x4`).
    pub fn report(&self) -> Vec<String> {
        if let Some(by) = self.forced_by {
            return vec![
                format!("xor: using function {} (forced by {by})", self.xor.name()),
                format!(
                    "raid6: using algorithm {} (forced by {by})",
                    self.gen.name()
                ),
                format!(
                    "raid6: using {} recovery algorithm (forced by {by})",
                    self.recov.name()
                ),
            ];
        }
        let rate = |kernel: &str, operation| {
            self.figures
                .iter()
                .find(|f| f.kernel == kernel && f.operation == operation)
                .map_or(0, |f| f.mb_per_s)
        };
        let mut lines = Vec::new();
        for f in self
            .figures
            .iter()
            .filter(|f| f.operation == Operation::Xor)
        {
            lines.push(format!("xor: {:<11} {:>7} MB/s", f.kernel, f.mb_per_s));
        }
        for f in self
            .figures
            .iter()
            .filter(|f| f.operation == Operation::Gen)
        {
            lines.push(format!("raid6: {} gen() {} MB/s", f.kernel, f.mb_per_s));
        }
        for f in self
            .figures
            .iter()
            .filter(|f| f.operation == Operation::Recover)
        {
            lines.push(format!("raid6: {} recov() {} MB/s", f.kernel, f.mb_per_s));
        }
        let xor = self.xor.name();
        let gen = self.gen.name();
        let recov = self.recov.name();
        lines.push(format!(
            "xor: using function {xor} ({} MB/s)",
            rate(xor, Operation::Xor)
        ));
        lines.push(format!(
            "raid6: using algorithm {gen} gen() {} MB/s",
            rate(gen, Operation::Gen)
        ));
        lines.push(format!(
            "raid6: using {recov} recovery algorithm ({} MB/s)",
            rate(recov, Operation::Recover)
        ));
        lines.extend(self.cold_report(&rate));
        lines
    }

    /// The choice in one line, for a mount's log (the [`Parity::report`]
    /// table behind it is for `raidfs bench` and the debug log).
    pub fn summary(&self) -> String {
        let cold = |kernel: Option<&str>| {
            kernel
                .map(|k| format!(" (cold sources {k})"))
                .unwrap_or_default()
        };
        let (xor_cold, gen_cold) = self.chosen_cold();
        let forced = self
            .forced_by
            .map(|by| format!("; forced by {by}"))
            .unwrap_or_default();
        format!(
            "parity kernels: xor {}{}, raid6 gen {}{}, raid6 recovery {}{forced}",
            self.xor.name(),
            cold(xor_cold),
            self.gen.name(),
            cold(gen_cold),
            self.recov.name(),
        )
    }

    /// The lines on the cold-source choice: the probe's calibration, the
    /// flushed-memory figures, and which kernel cold calls use.
    fn cold_report(&self, rate: &dyn Fn(&str, Operation) -> u64) -> Vec<String> {
        let Some(probe) = self.probe else {
            return vec![
                "parity: no cache probe (the timer cannot tell cache from DRAM here); \
                 every call uses the kernels above"
                    .to_string(),
            ];
        };
        let mut lines = vec![format!(
            "parity: cache probe {} ticks in cache, {} from DRAM; sources of blocks >= {} KiB \
             slower than {} ticks are cold",
            probe.hot_ticks,
            probe.dram_ticks,
            probe::MIN_PROBED_LEN / 1024,
            probe.threshold()
        )];
        for (label, hot, cold, operation) in [
            ("xor", self.xor, self.xor_cold, Operation::XorCold),
            ("raid6", self.gen, self.gen_cold, Operation::GenCold),
        ] {
            let measured: Vec<String> = self
                .figures
                .iter()
                .filter(|f| f.operation == operation)
                .map(|f| format!("{} {} MB/s", f.kernel, f.mb_per_s))
                .collect();
            let used = cold.map_or(hot.name(), |c| c.kernel.name());
            let what = if measured.is_empty() {
                "no streaming twin".to_string()
            } else {
                format!("flushed 64 KiB stripes: {}", measured.join(", "))
            };
            lines.push(format!(
                "{label}: cold sources use {used} ({} MB/s; {what})",
                rate(used, operation)
            ));
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(seed: usize, len: usize) -> Vec<u8> {
        (0..len)
            .map(|j| ((j * 31 + seed * 97) ^ (j >> 7)) as u8)
            .collect()
    }

    /// A measured kernel with its streaming twin wired in as the cold-source
    /// kernel behind a probe that always says cold.
    fn always_cold(kernel: &'static Kernel) -> Option<Parity> {
        let (twin, twin_ops) = usable(kernel.streaming_twin()?).ok()?;
        let mut parity = Parity::forced(kernel.name(), "test").ok()?;
        let cold = ColdKernel {
            kernel: twin,
            ops: twin_ops,
            probe: CacheProbe::always_cold(),
        };
        parity.xor_cold = Some(cold);
        parity.gen_cold = Some(cold);
        Some(parity)
    }

    #[test]
    fn cold_source_dispatch_matches_the_oracle() {
        let oracle = match Parity::forced("scalar", "test") {
            Ok(parity) => parity,
            Err(e) => panic!("scalar refused: {e}"),
        };
        let mut tested = 0;
        for kernel in kernels().iter().filter(|k| k.measured() && k.supported()) {
            let Some(parity) = always_cold(kernel) else {
                continue;
            };
            tested += 1;
            // Both sides of the probe's length limit; odd lengths and
            // destinations off register alignment fall back to ordinary stores.
            for (len, skew) in [(probe::MIN_PROBED_LEN - 32, 0), (65536, 0), (65536 + 13, 1)] {
                let blocks: Vec<Vec<u8>> = (0..5).map(|i| pattern(i, len)).collect();
                let data: Vec<&[u8]> = blocks.iter().map(|b| b.as_slice()).collect();
                let (mut want_p, mut want_q) = (vec![0u8; len], vec![0u8; len]);
                oracle.pq_gen(&data, &mut want_p, &mut want_q);
                let mut out = vec![0u8; 2 * len + 2];
                let (p, q) = out[skew..].split_at_mut(len);
                parity.pq_gen(&data, p, &mut q[..len]);
                assert!(p == want_p.as_slice(), "{}: P, {len} bytes", kernel.name());
                assert!(
                    &q[..len] == want_q.as_slice(),
                    "{}: Q, {len} bytes",
                    kernel.name()
                );
                parity.xor_gen(&data, p);
                assert!(
                    p == want_p.as_slice(),
                    "{}: XOR, {len} bytes",
                    kernel.name()
                );
            }
        }
        if tested == 0 {
            eprintln!("SKIPPED: no kernel with a streaming twin runs on this CPU");
        }
    }

    #[test]
    fn measured_selection_reports_the_cold_source_choice() {
        let parity = Parity::measured();
        let report = parity.report();
        let (xor_cold, gen_cold) = parity.chosen_cold();
        for (prefix, cold, hot) in [
            ("xor: cold sources use ", xor_cold, parity.chosen_xor()),
            ("raid6: cold sources use ", gen_cold, parity.chosen().0),
        ] {
            let used = cold.unwrap_or(hot);
            if parity.probe.is_some() {
                assert!(
                    report
                        .iter()
                        .any(|l| l.starts_with(&format!("{prefix}{used} "))),
                    "{report:?}"
                );
            }
        }
        assert!(
            report.iter().any(|l| l.starts_with("parity: ")),
            "{report:?}"
        );
    }
}
