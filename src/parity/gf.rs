//! GF(2^8) arithmetic with the RAID6 polynomial x^8+x^4+x^3+x^2+1 (0x11d),
//! generator g = 2: the log/exp tables and the per-constant tables that the
//! SIMD kernels consume (split nibble tables for pshufb, bit matrices for GFNI).

/// The reduction polynomial without its x^8 term.
pub const POLY: u8 = 0x1d;

const fn build_exp() -> [u8; 512] {
    let mut exp = [0u8; 512];
    let mut x: u8 = 1;
    let mut i = 0;
    while i < 512 {
        exp[i] = x;
        x = mul2(x);
        i += 1;
    }
    exp
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut log = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        log[exp[i] as usize] = i as u8;
        i += 1;
    }
    log
}

/// `EXP[i] = g^i`, doubled in length so that `EXP[log a + log b]` needs no modulo.
pub static EXP: [u8; 512] = build_exp();
/// `LOG[g^i] = i`; `LOG[0]` is meaningless.
pub static LOG: [u8; 256] = build_log();

/// Multiplication by g: a shift, reduced when the top bit falls off.
#[inline(always)]
pub const fn mul2(x: u8) -> u8 {
    (x << 1) ^ if x & 0x80 != 0 { POLY } else { 0 }
}

/// `a * b`.
#[inline]
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        0
    } else {
        EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
    }
}

/// `g^i` for any exponent (negative ones are inverses of powers of g).
pub fn pow_g(i: i64) -> u8 {
    EXP[i.rem_euclid(255) as usize]
}

/// Multiplicative inverse; `a` must not be zero.
pub fn inv(a: u8) -> u8 {
    debug_assert!(a != 0, "zero has no inverse");
    EXP[(255 - LOG[a as usize] as usize) % 255]
}

/// Split nibble tables for multiplication by `c`:
/// `c * x = lo[x & 15] ^ hi[x >> 4]` (multiplication distributes over XOR).
pub fn nibble_tables(c: u8) -> ([u8; 16], [u8; 16]) {
    let mut lo = [0u8; 16];
    let mut hi = [0u8; 16];
    for n in 0..16u8 {
        lo[n as usize] = mul(c, n);
        hi[n as usize] = mul(c, n << 4);
    }
    (lo, hi)
}

/// The 8x8 bit matrix, in the layout of `gf2p8affineqb`, whose affine
/// transform (with a zero constant) multiplies a byte by `c` in this field.
/// GFNI's own `gf2p8mulb` uses the AES polynomial 0x11b, so RAID6 needs the
/// affine form: multiplication by a constant is linear over GF(2).
/// Output bit `i` is the parity of `x & byte[7 - i]`, so byte `7 - i` holds the
/// input bits `j` for which bit `i` of `c * 2^j` is set.
pub const fn affine_matrix(c: u8) -> u64 {
    let mut matrix = 0u64;
    let mut out_bit = 0;
    while out_bit < 8 {
        let mut row = 0u8;
        let mut in_bit = 0;
        while in_bit < 8 {
            if (mul_shift_add(c, 1 << in_bit) >> out_bit) & 1 != 0 {
                row |= 1 << in_bit;
            }
            in_bit += 1;
        }
        matrix |= (row as u64) << (8 * (7 - out_bit));
        out_bit += 1;
    }
    matrix
}

/// `a * b` by shift-and-add, usable in constants (the tables cannot be read there).
pub const fn mul_shift_add(a: u8, b: u8) -> u8 {
    let (mut a, mut b, mut product) = (a, b, 0u8);
    while b != 0 {
        if b & 1 != 0 {
            product ^= a;
        }
        a = mul2(a);
        b >>= 1;
    }
    product
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiply then reduce: the definition, independent of the tables.
    fn mul_by_definition(a: u8, b: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if b & (1 << bit) != 0 {
                product ^= (a as u16) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product & (1 << bit) != 0 {
                product ^= 0x11d << (bit - 8);
            }
        }
        product as u8
    }

    /// `gf2p8affineqb` for one byte, as Intel's pseudocode defines it.
    fn affine_byte(matrix: u64, x: u8) -> u8 {
        let mut out = 0u8;
        for i in 0..8 {
            let row = (matrix >> (8 * (7 - i))) as u8;
            out |= (((row & x).count_ones() & 1) as u8) << i;
        }
        out
    }

    #[test]
    fn tables_match_the_definition() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_by_definition(a, b), "{a} * {b}");
                assert_eq!(mul_shift_add(a, b), mul_by_definition(a, b), "{a} * {b}");
            }
        }
    }

    #[test]
    fn g_generates_the_whole_group_and_inverses_invert() {
        let mut seen = [false; 256];
        for i in 0..255 {
            seen[pow_g(i) as usize] = true;
        }
        assert_eq!(seen.iter().filter(|s| **s).count(), 255);
        assert!(!seen[0]);
        for a in 1..=255u8 {
            assert_eq!(mul(a, inv(a)), 1);
        }
        assert_eq!(mul(pow_g(-3), pow_g(3)), 1);
    }

    #[test]
    fn nibble_tables_and_affine_matrices_multiply() {
        for c in 0..=255u8 {
            let (lo, hi) = nibble_tables(c);
            let matrix = affine_matrix(c);
            for x in 0..=255u8 {
                let want = mul_by_definition(c, x);
                assert_eq!(lo[(x & 15) as usize] ^ hi[(x >> 4) as usize], want);
                assert_eq!(affine_byte(matrix, x), want, "c={c} x={x}");
            }
        }
    }
}
