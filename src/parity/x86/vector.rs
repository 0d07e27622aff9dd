//! One SIMD register type per instruction set, behind the [`Vector`] trait
//! that the generic kernels in `generic.rs` are written against.
//!
//! Every method is `#[inline(always)]` and `unsafe`: it may only run inside a
//! function compiled with the type's target features (the `simd_ops!` wrappers in
//! `mod.rs`), where the intrinsics inline into straight-line code.

// The AVX-512 and GFNI intrinsics are stable since Rust 1.89; Cargo.toml's
// rust-version (1.80) predates them, the toolchain in use (1.95) does not.
#![allow(clippy::incompatible_msrv)]

#[cfg(target_arch = "x86")]
use std::arch::x86::*;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

use crate::parity::gf;

/// The operations a parity kernel needs on one SIMD register of bytes.
pub trait Vector: Copy {
    /// Register width in bytes.
    const BYTES: usize;
    /// Whatever makes multiplication by one constant fast (tables or a matrix).
    type MulTable: Copy;

    unsafe fn load(src: *const u8) -> Self;
    unsafe fn store(self, dst: *mut u8);
    /// Non-temporal store; `dst` must be aligned to `BYTES`.
    unsafe fn stream(self, dst: *mut u8);
    unsafe fn xor(self, other: Self) -> Self;
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        self.xor(a).xor(b)
    }
    /// `self * g ^ d`: one Horner step of the Q syndrome.
    unsafe fn mul2_xor(self, d: Self) -> Self;
    unsafe fn mul_table(c: u8) -> Self::MulTable;
    /// `c * self` for the constant `table` was made for.
    unsafe fn mul(self, table: &Self::MulTable) -> Self;
}

/// Nibble tables broadcast to every 128-bit lane (pshufb looks up within lanes).
#[inline(always)]
unsafe fn lane_tables(c: u8) -> (__m128i, __m128i) {
    let (lo, hi) = gf::nibble_tables(c);
    (
        _mm_loadu_si128(lo.as_ptr() as *const __m128i),
        _mm_loadu_si128(hi.as_ptr() as *const __m128i),
    )
}

const POLY: i8 = gf::POLY as i8;
const MUL2_MATRIX: i64 = gf::affine_matrix(2) as i64;

/// SSE2 for generation, SSSE3 (pshufb) for multiplication by constants.
#[derive(Clone, Copy)]
pub struct Sse(__m128i);

impl Vector for Sse {
    const BYTES: usize = 16;
    type MulTable = (__m128i, __m128i);

    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Sse(_mm_loadu_si128(src as *const __m128i))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm_storeu_si128(dst as *mut __m128i, self.0)
    }
    #[inline(always)]
    unsafe fn stream(self, dst: *mut u8) {
        _mm_stream_si128(dst as *mut __m128i, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Sse(_mm_xor_si128(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        // Bytes with the top bit set compare below zero: those need the reduction.
        let overflow = _mm_cmplt_epi8(self.0, _mm_setzero_si128());
        let reduce = _mm_and_si128(overflow, _mm_set1_epi8(POLY));
        let shifted = _mm_add_epi8(self.0, self.0);
        Sse(_mm_xor_si128(_mm_xor_si128(shifted, reduce), d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::MulTable {
        lane_tables(c)
    }
    #[inline(always)]
    unsafe fn mul(self, table: &Self::MulTable) -> Self {
        let nibble = _mm_set1_epi8(0x0f);
        let low = _mm_and_si128(self.0, nibble);
        let high = _mm_and_si128(_mm_srli_epi16(self.0, 4), nibble);
        Sse(_mm_xor_si128(
            _mm_shuffle_epi8(table.0, low),
            _mm_shuffle_epi8(table.1, high),
        ))
    }
}

/// AVX2: 32-byte registers.
#[derive(Clone, Copy)]
pub struct Avx2(__m256i);

impl Vector for Avx2 {
    const BYTES: usize = 32;
    type MulTable = (__m256i, __m256i);

    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx2(_mm256_loadu_si256(src as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn stream(self, dst: *mut u8) {
        _mm256_stream_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx2(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        // vpblendvb picks by each byte's top bit: one instruction for the
        // "reduce if it overflows" selection instead of compare + and.
        let reduce = _mm256_blendv_epi8(_mm256_setzero_si256(), _mm256_set1_epi8(POLY), self.0);
        let shifted = _mm256_add_epi8(self.0, self.0);
        Avx2(_mm256_xor_si256(_mm256_xor_si256(shifted, reduce), d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::MulTable {
        let (lo, hi) = lane_tables(c);
        (
            _mm256_broadcastsi128_si256(lo),
            _mm256_broadcastsi128_si256(hi),
        )
    }
    #[inline(always)]
    unsafe fn mul(self, table: &Self::MulTable) -> Self {
        let nibble = _mm256_set1_epi8(0x0f);
        let low = _mm256_and_si256(self.0, nibble);
        let high = _mm256_and_si256(_mm256_srli_epi16(self.0, 4), nibble);
        Avx2(_mm256_xor_si256(
            _mm256_shuffle_epi8(table.0, low),
            _mm256_shuffle_epi8(table.1, high),
        ))
    }
}

/// AVX2 registers with GFNI: multiplication by any constant (g included) is
/// one `vgf2p8affineqb` with that constant's bit matrix.
#[derive(Clone, Copy)]
pub struct Avx2Gfni(__m256i);

impl Vector for Avx2Gfni {
    const BYTES: usize = 32;
    type MulTable = __m256i;

    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx2Gfni(_mm256_loadu_si256(src as *const __m256i))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm256_storeu_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn stream(self, dst: *mut u8) {
        _mm256_stream_si256(dst as *mut __m256i, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx2Gfni(_mm256_xor_si256(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        let doubled = _mm256_gf2p8affine_epi64_epi8::<0>(self.0, _mm256_set1_epi64x(MUL2_MATRIX));
        Avx2Gfni(_mm256_xor_si256(doubled, d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::MulTable {
        _mm256_set1_epi64x(gf::affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, table: &Self::MulTable) -> Self {
        Avx2Gfni(_mm256_gf2p8affine_epi64_epi8::<0>(self.0, *table))
    }
}

/// AVX-512 (F + BW): 64-byte registers, three-input XOR through vpternlog.
#[derive(Clone, Copy)]
pub struct Avx512(__m512i);

/// vpternlog truth table for `a ^ b ^ c`.
const XOR3: i32 = 0x96;

impl Vector for Avx512 {
    const BYTES: usize = 64;
    type MulTable = (__m512i, __m512i);

    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx512(_mm512_loadu_si512(src as *const _))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn stream(self, dst: *mut u8) {
        _mm512_stream_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx512(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        Avx512(_mm512_ternarylogic_epi64::<XOR3>(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        let overflow = _mm512_movepi8_mask(self.0);
        let reduce = _mm512_maskz_mov_epi8(overflow, _mm512_set1_epi8(POLY));
        let shifted = _mm512_add_epi8(self.0, self.0);
        Avx512(_mm512_ternarylogic_epi64::<XOR3>(shifted, reduce, d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::MulTable {
        let (lo, hi) = lane_tables(c);
        (_mm512_broadcast_i32x4(lo), _mm512_broadcast_i32x4(hi))
    }
    #[inline(always)]
    unsafe fn mul(self, table: &Self::MulTable) -> Self {
        let nibble = _mm512_set1_epi8(0x0f);
        let low = _mm512_and_si512(self.0, nibble);
        let high = _mm512_and_si512(_mm512_srli_epi16::<4>(self.0), nibble);
        Avx512(_mm512_xor_si512(
            _mm512_shuffle_epi8(table.0, low),
            _mm512_shuffle_epi8(table.1, high),
        ))
    }
}

/// AVX-512 registers with GFNI.
#[derive(Clone, Copy)]
pub struct Avx512Gfni(__m512i);

impl Vector for Avx512Gfni {
    const BYTES: usize = 64;
    type MulTable = __m512i;

    #[inline(always)]
    unsafe fn load(src: *const u8) -> Self {
        Avx512Gfni(_mm512_loadu_si512(src as *const _))
    }
    #[inline(always)]
    unsafe fn store(self, dst: *mut u8) {
        _mm512_storeu_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn stream(self, dst: *mut u8) {
        _mm512_stream_si512(dst as *mut _, self.0)
    }
    #[inline(always)]
    unsafe fn xor(self, other: Self) -> Self {
        Avx512Gfni(_mm512_xor_si512(self.0, other.0))
    }
    #[inline(always)]
    unsafe fn xor3(self, a: Self, b: Self) -> Self {
        Avx512Gfni(_mm512_ternarylogic_epi64::<XOR3>(self.0, a.0, b.0))
    }
    #[inline(always)]
    unsafe fn mul2_xor(self, d: Self) -> Self {
        let doubled = _mm512_gf2p8affine_epi64_epi8::<0>(self.0, _mm512_set1_epi64(MUL2_MATRIX));
        Avx512Gfni(_mm512_xor_si512(doubled, d.0))
    }
    #[inline(always)]
    unsafe fn mul_table(c: u8) -> Self::MulTable {
        _mm512_set1_epi64(gf::affine_matrix(c) as i64)
    }
    #[inline(always)]
    unsafe fn mul(self, table: &Self::MulTable) -> Self {
        Avx512Gfni(_mm512_gf2p8affine_epi64_epi8::<0>(self.0, *table))
    }
}
