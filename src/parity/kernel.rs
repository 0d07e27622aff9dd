//! The kernel registry: each kernel's name, the CPU features it needs, and its
//! operations. A kernel's operations are only reachable through
//! [`Kernel::ops`], which refuses kernels whose features the CPU lacks; that
//! check is what makes calling the `#[target_feature]` functions sound.

use super::scalar;

/// The primitive operations every kernel provides (see `scalar.rs` for the
/// meaning of each). `unsafe` because a SIMD kernel's functions are only sound
/// on a CPU with its features; all slices are as long as the destination.
/// `recov_2data(a, b, p, q, dx, dy)`.
pub(crate) type Recover2DataFn = unsafe fn(u8, u8, &[u8], &[u8], &mut [u8], &mut [u8]);

#[derive(Clone, Copy)]
pub(crate) struct Ops {
    pub xor_gen: unsafe fn(&[&[u8]], &mut [u8]),
    pub xor_into: unsafe fn(&mut [u8], &[u8]),
    pub pq_gen: unsafe fn(&[&[u8]], &mut [u8], &mut [u8]),
    pub mul_acc: unsafe fn(u8, &[u8], &mut [u8]),
    pub mul_of_xor: unsafe fn(u8, &[u8], &mut [u8]),
    pub recov_2data: Recover2DataFn,
}

/// One implementation of the parity operations.
pub struct Kernel {
    name: &'static str,
    needs: &'static [&'static str],
    /// Whether the start-up measurement considers it. Streaming-store kernels
    /// only win when generation runs through more memory than the caches
    /// hold, which an in-cache measurement cannot show: they are never chosen
    /// on their own, only as a measured kernel's `streaming_twin`, or forced.
    measured: bool,
    /// The kernel with the same arithmetic and non-temporal stores, which
    /// `Parity` switches to for calls whose sources are not in cache.
    streaming_twin: Option<&'static str>,
    ops: Ops,
}

impl Kernel {
    /// The name accepted by `Parity::select` and `RAIDFS_PARITY_KERNEL`.
    pub fn name(&self) -> &'static str {
        self.name
    }
    /// The CPU features the kernel needs (as `is_x86_feature_detected!` names them).
    pub fn needs(&self) -> &'static [&'static str] {
        self.needs
    }
    /// The needed features this CPU lacks; empty when the kernel can run here.
    pub fn missing_features(&self) -> Vec<&'static str> {
        self.needs
            .iter()
            .copied()
            .filter(|f| !has_feature(f))
            .collect()
    }
    /// Whether this CPU can run the kernel.
    pub fn supported(&self) -> bool {
        self.missing_features().is_empty()
    }
    /// Whether `Parity::select(None)` measures it (forced-only kernels do not).
    pub fn measured(&self) -> bool {
        self.measured
    }
    /// The name of the streaming-store twin used for cold sources, if any.
    pub fn streaming_twin(&self) -> Option<&'static str> {
        self.streaming_twin
    }
    /// The operations, only for a kernel this CPU supports.
    pub(crate) fn ops(&self) -> Option<Ops> {
        self.supported().then_some(self.ops)
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn has_feature(name: &str) -> bool {
    super::x86::has_feature(name)
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
fn has_feature(_name: &str) -> bool {
    false
}

fn scalar_xor_gen(data: &[&[u8]], p: &mut [u8]) {
    scalar::xor_gen(data, p, 0)
}
fn scalar_xor_into(p: &mut [u8], src: &[u8]) {
    scalar::xor_into(p, src, 0)
}
fn scalar_pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    scalar::pq_gen(data, p, q, 0)
}
fn scalar_mul_acc(c: u8, src: &[u8], dst: &mut [u8]) {
    scalar::mul_acc(c, src, dst, 0)
}
fn scalar_mul_of_xor(c: u8, src: &[u8], dst: &mut [u8]) {
    scalar::mul_of_xor(c, src, dst, 0)
}
fn scalar_recov_2data(a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
    scalar::recov_2data(a, b, p, q, dx, dy, 0)
}

const SCALAR: Kernel = Kernel {
    name: "scalar",
    needs: &[],
    measured: true,
    streaming_twin: None,
    ops: Ops {
        xor_gen: scalar_xor_gen,
        xor_into: scalar_xor_into,
        pq_gen: scalar_pq_gen,
        mul_acc: scalar_mul_acc,
        mul_of_xor: scalar_mul_of_xor,
        recov_2data: scalar_recov_2data,
    },
};

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
static KERNELS: &[Kernel] = {
    use super::x86;
    &[
        SCALAR,
        Kernel {
            name: "ssse3x4",
            needs: &["sse2", "ssse3"],
            measured: true,
            streaming_twin: None,
            ops: x86::ssse3::OPS,
        },
        Kernel {
            name: "avx2x4",
            needs: &["avx2"],
            measured: true,
            streaming_twin: Some("avx2x4nt"),
            ops: x86::avx2::OPS,
        },
        Kernel {
            name: "avx2x4nt",
            needs: &["avx2"],
            measured: false,
            streaming_twin: None,
            ops: x86::avx2::OPS_STREAM,
        },
        Kernel {
            name: "avx2gfni",
            needs: &["avx2", "gfni"],
            measured: true,
            streaming_twin: Some("avx2gfnint"),
            ops: x86::avx2_gfni::OPS,
        },
        Kernel {
            name: "avx2gfnint",
            needs: &["avx2", "gfni"],
            measured: false,
            streaming_twin: None,
            ops: x86::avx2_gfni::OPS_STREAM,
        },
        Kernel {
            name: "avx512x4",
            needs: &["avx512f", "avx512bw"],
            measured: true,
            streaming_twin: Some("avx512x4nt"),
            ops: x86::avx512::OPS,
        },
        Kernel {
            name: "avx512x4nt",
            needs: &["avx512f", "avx512bw"],
            measured: false,
            streaming_twin: None,
            ops: x86::avx512::OPS_STREAM,
        },
        Kernel {
            name: "avx512gfni",
            needs: &["avx512f", "avx512bw", "gfni"],
            measured: true,
            streaming_twin: Some("avx512gfnint"),
            ops: x86::avx512_gfni::OPS,
        },
        Kernel {
            name: "avx512gfnint",
            needs: &["avx512f", "avx512bw", "gfni"],
            measured: false,
            streaming_twin: None,
            ops: x86::avx512_gfni::OPS_STREAM,
        },
    ]
};

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64")))]
static KERNELS: &[Kernel] = &[SCALAR];

/// Every kernel built into this binary, supported here or not, scalar first.
pub fn kernels() -> &'static [Kernel] {
    KERNELS
}

/// The kernel called `name`, if built in.
pub fn find(name: &str) -> Option<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name)
}
