//! The parity algorithms, written once over [`Vector`] and instantiated per
//! instruction set by `mod.rs`. Each walks the buffers in blocks of `UNROLL`
//! registers (independent dependency chains keep every SIMD port busy), then
//! single registers, then hands the last bytes to the scalar kernel, so any
//! length and any alignment is handled.
//!
//! Safety contract for every function: the caller runs with `V`'s target
//! features, and every source slice is at least as long as the destination.

use super::vector::Vector;
use crate::parity::scalar;

const UNROLL: usize = 4;
/// XOR needs one register per lane of the unrolled block, so it can go wider
/// (fewer loop and pointer overheads per source) without spilling.
const XOR_UNROLL: usize = 8;

/// Runs `$body` with `$off` stepping over full blocks of `$unroll` registers
/// (`$n` = `$unroll`, `UNROLL` when not given) and then single registers
/// (`$n` = 1); yields the offset where the scalar tail starts.
macro_rules! blocks {
    ($v:ty, $len:expr, |$off:ident, $n:ident| $body:expr) => {
        blocks!($v, UNROLL, $len, |$off, $n| $body)
    };
    ($v:ty, $unroll:expr, $len:expr, |$off:ident, $n:ident| $body:expr) => {{
        let len: usize = $len;
        let mut $off = 0usize;
        while $off + $unroll * <$v>::BYTES <= len {
            {
                const $n: usize = $unroll;
                $body;
            }
            $off += $unroll * <$v>::BYTES;
        }
        while $off + <$v>::BYTES <= len {
            {
                const $n: usize = 1;
                $body;
            }
            $off += <$v>::BYTES;
        }
        $off
    }};
}

#[inline(always)]
unsafe fn load_n<V: Vector, const N: usize>(src: *const u8) -> [V; N] {
    std::array::from_fn(|i| V::load(src.add(i * V::BYTES)))
}

#[inline(always)]
unsafe fn store_n<V: Vector, const N: usize>(regs: [V; N], dst: *mut u8) {
    for (i, reg) in regs.into_iter().enumerate() {
        reg.store(dst.add(i * V::BYTES));
    }
}

/// Like `store_n`, non-temporal when `STREAM` (then `dst` is register-aligned).
#[inline(always)]
unsafe fn put_n<V: Vector, const N: usize, const STREAM: bool>(regs: [V; N], dst: *mut u8) {
    for (i, reg) in regs.into_iter().enumerate() {
        if STREAM {
            reg.stream(dst.add(i * V::BYTES));
        } else {
            reg.store(dst.add(i * V::BYTES));
        }
    }
}

/// Streaming stores demand register-aligned destinations; unaligned ones get
/// ordinary stores even from a streaming kernel.
#[inline(always)]
fn aligned<V: Vector>(outputs: &[*const u8]) -> bool {
    outputs
        .iter()
        .all(|p| (*p as usize).is_multiple_of(V::BYTES))
}

/// Orders streaming stores before whatever the caller does next.
#[inline(always)]
unsafe fn fence_if<const STREAM: bool>() {
    if STREAM {
        #[cfg(target_arch = "x86")]
        std::arch::x86::_mm_sfence();
        #[cfg(target_arch = "x86_64")]
        std::arch::x86_64::_mm_sfence();
    }
}

#[inline(always)]
unsafe fn xor_block<V: Vector, const N: usize, const STREAM: bool>(
    data: &[&[u8]],
    dst: *mut u8,
    off: usize,
) {
    let (first, rest) = (data[0], &data[1..]);
    let mut acc: [V; N] = load_n(first.as_ptr().add(off));
    let mut pairs = rest.chunks_exact(2);
    for pair in &mut pairs {
        let a: [V; N] = load_n(pair[0].as_ptr().add(off));
        let b: [V; N] = load_n(pair[1].as_ptr().add(off));
        for i in 0..N {
            acc[i] = acc[i].xor3(a[i], b[i]);
        }
    }
    if let [last] = pairs.remainder() {
        let a: [V; N] = load_n(last.as_ptr().add(off));
        for i in 0..N {
            acc[i] = acc[i].xor(a[i]);
        }
    }
    put_n::<V, N, STREAM>(acc, dst.add(off));
}

/// `p = XOR of data`; with `STREAM`, written by non-temporal stores (which
/// skip the cache: slower when the result is used soon, faster when
/// generation streams through more memory than the caches hold).
#[inline(always)]
pub unsafe fn xor_gen<V: Vector, const STREAM: bool>(data: &[&[u8]], p: &mut [u8]) {
    if STREAM && aligned::<V>(&[p.as_ptr()]) {
        xor_gen_with::<V, true>(data, p)
    } else {
        xor_gen_with::<V, false>(data, p)
    }
}

#[inline(always)]
unsafe fn xor_gen_with<V: Vector, const STREAM: bool>(data: &[&[u8]], p: &mut [u8]) {
    if data.is_empty() {
        return scalar::xor_gen(data, p, 0);
    }
    let dst = p.as_mut_ptr();
    let done = blocks!(V, XOR_UNROLL, p.len(), |off, N| {
        xor_block::<V, N, STREAM>(data, dst, off)
    });
    fence_if::<STREAM>();
    scalar::xor_gen(data, p, done);
}

#[inline(always)]
pub unsafe fn xor_into<V: Vector>(p: &mut [u8], src: &[u8]) {
    let dst = p.as_mut_ptr();
    let done = blocks!(V, p.len(), |off, N| {
        let a: [V; N] = load_n(dst.add(off));
        let b: [V; N] = load_n(src.as_ptr().add(off));
        let mut out = a;
        for i in 0..N {
            out[i] = a[i].xor(b[i]);
        }
        store_n(out, dst.add(off));
    });
    scalar::xor_into(p, src, done);
}

#[inline(always)]
unsafe fn pq_block<V: Vector, const N: usize, const STREAM: bool>(
    data: &[&[u8]],
    p: *mut u8,
    q: *mut u8,
    off: usize,
) {
    let (last, lower) = (data[data.len() - 1], &data[..data.len() - 1]);
    let mut pv: [V; N] = load_n(last.as_ptr().add(off));
    let mut qv = pv;
    // Horner's rule from the highest index: q = q * g ^ d.
    for src in lower.iter().rev() {
        let d: [V; N] = load_n(src.as_ptr().add(off));
        for i in 0..N {
            pv[i] = pv[i].xor(d[i]);
            qv[i] = qv[i].mul2_xor(d[i]);
        }
    }
    put_n::<V, N, STREAM>(pv, p.add(off));
    put_n::<V, N, STREAM>(qv, q.add(off));
}

/// P and Q; `STREAM` as for `xor_gen`.
#[inline(always)]
pub unsafe fn pq_gen<V: Vector, const STREAM: bool>(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    if STREAM && aligned::<V>(&[p.as_ptr(), q.as_ptr()]) {
        pq_gen_with::<V, true>(data, p, q)
    } else {
        pq_gen_with::<V, false>(data, p, q)
    }
}

#[inline(always)]
unsafe fn pq_gen_with<V: Vector, const STREAM: bool>(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    if data.is_empty() {
        return scalar::pq_gen(data, p, q, 0);
    }
    let (pp, qp) = (p.as_mut_ptr(), q.as_mut_ptr());
    let done = blocks!(V, p.len(), |off, N| pq_block::<V, N, STREAM>(
        data, pp, qp, off
    ));
    fence_if::<STREAM>();
    scalar::pq_gen(data, p, q, done);
}

#[inline(always)]
pub unsafe fn mul_acc<V: Vector>(c: u8, src: &[u8], dst: &mut [u8]) {
    let table = V::mul_table(c);
    let out = dst.as_mut_ptr();
    let done = blocks!(V, dst.len(), |off, N| {
        let s: [V; N] = load_n(src.as_ptr().add(off));
        let mut d: [V; N] = load_n(out.add(off));
        for i in 0..N {
            d[i] = d[i].xor(s[i].mul(&table));
        }
        store_n(d, out.add(off));
    });
    scalar::mul_acc(c, src, dst, done);
}

#[inline(always)]
pub unsafe fn mul_of_xor<V: Vector>(c: u8, src: &[u8], dst: &mut [u8]) {
    let table = V::mul_table(c);
    let out = dst.as_mut_ptr();
    let done = blocks!(V, dst.len(), |off, N| {
        let s: [V; N] = load_n(src.as_ptr().add(off));
        let mut d: [V; N] = load_n(out.add(off));
        for i in 0..N {
            d[i] = d[i].xor(s[i]).mul(&table);
        }
        store_n(d, out.add(off));
    });
    scalar::mul_of_xor(c, src, dst, done);
}

#[inline(always)]
pub unsafe fn recov_2data<V: Vector>(
    a: u8,
    b: u8,
    p: &[u8],
    q: &[u8],
    dx: &mut [u8],
    dy: &mut [u8],
) {
    let (ta, tb) = (V::mul_table(a), V::mul_table(b));
    let (xp, yp) = (dx.as_mut_ptr(), dy.as_mut_ptr());
    let done = blocks!(V, dx.len(), |off, N| {
        let pv: [V; N] = load_n(p.as_ptr().add(off));
        let qv: [V; N] = load_n(q.as_ptr().add(off));
        let mut x: [V; N] = load_n(xp.add(off));
        let mut y: [V; N] = load_n(yp.add(off));
        for i in 0..N {
            let pxy = pv[i].xor(x[i]);
            let qxy = qv[i].xor(y[i]);
            x[i] = pxy.mul(&ta).xor(qxy.mul(&tb));
            y[i] = pxy.xor(x[i]);
        }
        store_n(x, xp.add(off));
        store_n(y, yp.add(off));
    });
    scalar::recov_2data(a, b, p, q, dx, dy, done);
}
