//! The portable kernels: the oracle every SIMD kernel is tested against, the
//! only kernel on non-x86 targets, and the tail handler of the SIMD kernels
//! (each function starts at byte `from`, so a SIMD body can hand over its rest).
//!
//! Written for obviousness first; the byte loops are simple enough that the
//! compiler vectorises them for the baseline target.

use super::gf;

/// `p[from..] = XOR of data[..][from..]`.
pub fn xor_gen(data: &[&[u8]], p: &mut [u8], from: usize) {
    let len = p.len();
    let p = &mut p[from..];
    match data.split_first() {
        None => p.fill(0),
        Some((first, rest)) => {
            p.copy_from_slice(&first[from..len]);
            for src in rest {
                xor_into(p, &src[from..len], 0);
            }
        }
    }
}

/// `p[from..] ^= src[from..]`.
pub fn xor_into(p: &mut [u8], src: &[u8], from: usize) {
    let len = p.len();
    for (x, s) in p[from..].iter_mut().zip(&src[from..len]) {
        *x ^= s;
    }
}

/// `p = XOR of data`, `q = sum of g^i * data[i]`, from byte `from` on.
/// Q by Horner's rule from the highest index: `q = q * g ^ data[i]`.
pub fn pq_gen(data: &[&[u8]], p: &mut [u8], q: &mut [u8], from: usize) {
    let len = p.len();
    let (p, q) = (&mut p[from..], &mut q[from..len]);
    let Some((last, lower)) = data.split_last() else {
        p.fill(0);
        q.fill(0);
        return;
    };
    p.copy_from_slice(&last[from..len]);
    q.copy_from_slice(&last[from..len]);
    for src in lower.iter().rev() {
        let src = &src[from..len];
        for ((pb, qb), s) in p.iter_mut().zip(q.iter_mut()).zip(src) {
            *pb ^= s;
            *qb = gf::mul2(*qb) ^ s;
        }
    }
}

/// Multiplication by a constant through the split nibble tables.
struct MulTable {
    lo: [u8; 16],
    hi: [u8; 16],
}

impl MulTable {
    fn new(c: u8) -> MulTable {
        let (lo, hi) = gf::nibble_tables(c);
        MulTable { lo, hi }
    }
    #[inline(always)]
    fn mul(&self, x: u8) -> u8 {
        self.lo[(x & 15) as usize] ^ self.hi[(x >> 4) as usize]
    }
}

/// `dst[from..] ^= c * src[from..]`.
pub fn mul_acc(c: u8, src: &[u8], dst: &mut [u8], from: usize) {
    let table = MulTable::new(c);
    let len = dst.len();
    for (d, s) in dst[from..].iter_mut().zip(&src[from..len]) {
        *d ^= table.mul(*s);
    }
}

/// `dst[from..] = c * (dst[from..] ^ src[from..])`.
pub fn mul_of_xor(c: u8, src: &[u8], dst: &mut [u8], from: usize) {
    let table = MulTable::new(c);
    let len = dst.len();
    for (d, s) in dst[from..].iter_mut().zip(&src[from..len]) {
        *d = table.mul(*d ^ s);
    }
}

/// The two-data-failure step. On entry `dx` holds P' and `dy` holds Q' (the
/// syndromes computed with both missing blocks as zero); on return they hold
/// the missing blocks: `dx = a*(P^P') ^ b*(Q^Q')`, `dy = (P^P') ^ dx`.
pub fn recov_2data(a: u8, b: u8, p: &[u8], q: &[u8], dx: &mut [u8], dy: &mut [u8], from: usize) {
    let (ta, tb) = (MulTable::new(a), MulTable::new(b));
    let len = dx.len();
    let survivors = p[from..len].iter().zip(&q[from..len]);
    for ((x, y), (pb, qb)) in dx[from..].iter_mut().zip(&mut dy[from..len]).zip(survivors) {
        let pxy = pb ^ *x;
        let qxy = qb ^ *y;
        let rebuilt = ta.mul(pxy) ^ tb.mul(qxy);
        *x = rebuilt;
        *y = pxy ^ rebuilt;
    }
}
