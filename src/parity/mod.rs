//! Parity kernels: XOR (RAID5 P) and RAID6 P+Q over GF(2^8), polynomial 0x11d.
//!
//! Several implementations exist (scalar oracle, SSSE3, AVX2, AVX-512, GFNI);
//! [`Parity::select`] benchmarks those the CPU supports and keeps the fastest.
//! The engine only ever calls the methods on [`Parity`].
//!
//! Block conventions used by every method: all slices have the same length;
//! data blocks are given in data-index order (index 0 is multiplied by g^0 in Q).
//!
//! Layout: `gf` (field arithmetic), `scalar` (portable oracle), `x86` (SIMD
//! kernels), `kernel` (registry and feature checks), `recover` (RAID6
//! reconstruction), `select` (start-up measurement).

pub mod gf;
mod kernel;
mod recover;
mod scalar;
mod select;
#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
mod x86;

use std::sync::OnceLock;

use kernel::Ops;
pub use kernel::{kernels, Kernel};
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
    figures: Vec<Figure>,
    /// Where a forced choice came from (`None` when measured).
    forced_by: Option<&'static str>,
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
        let figures = select::measure(&candidates);
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
        Parity {
            xor,
            gen,
            recov,
            xor_ops,
            gen_ops,
            recov_ops,
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
        // SAFETY: the kernel is supported (checked when `self` was built) and
        // every slice is as long as `p`.
        unsafe { (self.xor_ops.xor_gen)(data, p) }
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
        // SAFETY: as in `xor_gen`.
        unsafe { (self.gen_ops.pq_gen)(data, p, q) }
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
        lines
    }
}
