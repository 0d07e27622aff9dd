//! The x86 SIMD kernels: one module of thin `#[target_feature]` entry points
//! per instruction set, each instantiating the generic algorithms for its
//! register type. Nothing here checks CPU features; `kernel.rs` only hands
//! these out after detection.

mod generic;
mod vector;

macro_rules! simd_ops {
    ($module:ident, $vector:ty, $features:literal) => {
        pub mod $module {
            use super::generic;
            use super::vector;
            use crate::parity::kernel::Ops;

            #[target_feature(enable = $features)]
            unsafe fn xor_gen(data: &[&[u8]], p: &mut [u8]) {
                generic::xor_gen::<$vector, false>(data, p)
            }
            #[target_feature(enable = $features)]
            unsafe fn xor_gen_stream(data: &[&[u8]], p: &mut [u8]) {
                generic::xor_gen::<$vector, true>(data, p)
            }
            #[target_feature(enable = $features)]
            unsafe fn xor_into(p: &mut [u8], src: &[u8]) {
                generic::xor_into::<$vector>(p, src)
            }
            #[target_feature(enable = $features)]
            unsafe fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
                generic::pq_gen::<$vector, false>(data, p, q)
            }
            #[target_feature(enable = $features)]
            unsafe fn pq_gen_stream(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
                generic::pq_gen::<$vector, true>(data, p, q)
            }
            #[target_feature(enable = $features)]
            unsafe fn mul_acc(c: u8, src: &[u8], dst: &mut [u8]) {
                generic::mul_acc::<$vector>(c, src, dst)
            }
            #[target_feature(enable = $features)]
            unsafe fn mul_of_xor(c: u8, src: &[u8], dst: &mut [u8]) {
                generic::mul_of_xor::<$vector>(c, src, dst)
            }
            #[target_feature(enable = $features)]
            unsafe fn recov_2data(a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8]) {
                generic::recov_2data::<$vector>(a, b, p, q, dx, dy)
            }

            pub const OPS: Ops = Ops {
                xor_gen,
                xor_into,
                pq_gen,
                mul_acc,
                mul_of_xor,
                recov_2data,
            };
            /// The same kernel with generation writing non-temporal stores.
            #[allow(dead_code)]
            pub const OPS_STREAM: Ops = Ops {
                xor_gen: xor_gen_stream,
                pq_gen: pq_gen_stream,
                ..OPS
            };
        }
    };
}

simd_ops!(ssse3, vector::Sse, "sse2,ssse3");
simd_ops!(avx2, vector::Avx2, "avx2");
simd_ops!(avx2_gfni, vector::Avx2Gfni, "avx2,gfni");
simd_ops!(avx512, vector::Avx512, "avx512f,avx512bw");
simd_ops!(avx512_gfni, vector::Avx512Gfni, "avx512f,avx512bw,gfni");

/// Whether the running CPU has the named feature (names as in `kernel.rs`).
pub fn has_feature(name: &str) -> bool {
    match name {
        "sse2" => is_x86_feature_detected!("sse2"),
        "ssse3" => is_x86_feature_detected!("ssse3"),
        "avx2" => is_x86_feature_detected!("avx2"),
        "avx512f" => is_x86_feature_detected!("avx512f"),
        "avx512bw" => is_x86_feature_detected!("avx512bw"),
        "gfni" => is_x86_feature_detected!("gfni"),
        _ => false,
    }
}
