//! Parity kernels: XOR (RAID5 P) and RAID6 P+Q over GF(2^8), polynomial 0x11d.
//!
//! Several implementations exist (scalar oracle, SSE2/SSSE3, AVX2, AVX-512, GFNI);
//! [`Parity::select`] benchmarks those the CPU supports and keeps the fastest.
//! The engine only ever calls the methods on [`Parity`].
//!
//! Block conventions used by every method: all slices have the same length;
//! data blocks are given in data-index order (index 0 is multiplied by g^0 in Q).

/// The chosen kernels, one for each operation, plus the figures that chose them.
pub struct Parity {
    _private: (),
}

/// Why a kernel could not be used.
#[derive(Debug, thiserror::Error)]
pub enum ParityError {
    #[error("unknown parity kernel '{0}' (known: {1})")]
    Unknown(String, String),
    #[error("parity kernel '{0}' needs CPU features this machine lacks: {1}")]
    Unsupported(String, String),
}

impl Parity {
    /// Benchmark every kernel this CPU supports (under 50 ms in all) and keep the
    /// fastest; `force` (or the RAIDFS_PARITY_KERNEL environment variable when
    /// `force` is None) names a kernel to use instead.
    pub fn select(force: Option<&str>) -> Result<Parity, ParityError> {
        let _ = force;
        unimplemented!()
    }
    /// The process-wide selection, made on first use with `select(None)`
    /// (falling back to the scalar kernel, with a logged warning, if the
    /// environment names a kernel that cannot be used).
    pub fn global() -> &'static Parity {
        unimplemented!()
    }
    /// `p = XOR of data`.
    pub fn xor_gen(&self, data: &[&[u8]], p: &mut [u8]) {
        let _ = (data, p);
        unimplemented!()
    }
    /// `p ^= src` (read-modify-write updates and incremental XOR).
    pub fn xor_into(&self, p: &mut [u8], src: &[u8]) {
        let _ = (p, src);
        unimplemented!()
    }
    /// `p = XOR of data`, `q = sum of g^i * data[i]`.
    pub fn pq_gen(&self, data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
        let _ = (data, p, q);
        unimplemented!()
    }
    /// Read-modify-write: data block `index` changes by `delta = old ^ new`;
    /// `p ^= delta`, `q ^= g^index * delta`.
    pub fn pq_update(&self, index: usize, delta: &[u8], p: &mut [u8], q: &mut [u8]) {
        let _ = (index, delta, p, q);
        unimplemented!()
    }
    /// RAID6 recovery in place. `blocks` holds data 0..k, then P, then Q
    /// (k + 2 blocks). `failed` names one or two indices into `blocks` whose
    /// contents are garbage; they are rebuilt from the others.
    pub fn raid6_recover(&self, blocks: &mut [&mut [u8]], failed: &[usize]) {
        let _ = (blocks, failed);
        unimplemented!()
    }
    /// Name of the kernel used for each operation, e.g. `("avx2x4", "avx2x4")`
    /// for (XOR / P+Q generation, RAID6 recovery).
    pub fn chosen(&self) -> (&str, &str) {
        unimplemented!()
    }
    /// The lines to log at mount, md style (`raid6: avx2x4 gen() 20313 MB/s`,
    /// `raid6: using algorithm avx2x4`).
    pub fn report(&self) -> Vec<String> {
        unimplemented!()
    }
}
