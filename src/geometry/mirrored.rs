//! Chunk placement for the mirrored levels: md's RAID10 "near" layout, of
//! which RAID1 is the case copies = members.
//!
//! The members' chunk rows are read as one flattened sequence of positions
//! (`position = row * members + member`); logical chunk k occupies the
//! `copies` consecutive positions starting at `k * copies`. When `members` is
//! not a multiple of `copies`, a chunk's copies wrap from the end of one row to
//! the start of the next, exactly as md's raid10 near layout does.

/// One copy of a logical chunk: its member and chunk row.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct CopySlot {
    pub(super) member: usize,
    pub(super) row: u64,
}

/// The copies of logical chunk `chunk`, in copy order.
#[inline]
pub(super) fn copies_of(
    members: usize,
    copies: usize,
    chunk: u64,
) -> impl Iterator<Item = CopySlot> {
    let first = chunk * copies as u64;
    let members_u64 = members as u64;
    // `first % members` is below 256: the narrowing is lossless.
    let mut member = (first % members_u64) as usize;
    let mut row = first / members_u64;
    (0..copies).map(move |_| {
        let slot = CopySlot { member, row };
        member += 1;
        if member == members {
            member = 0;
            row += 1;
        }
        slot
    })
}

/// Which logical chunk, and which copy of it, `member` holds in chunk row `row`.
#[inline]
pub(super) fn chunk_at(members: usize, copies: usize, member: usize, row: u64) -> (u64, usize) {
    let position = row * members as u64 + member as u64;
    let copies_u64 = copies as u64;
    // The remainder is below `copies` (at most 255).
    (position / copies_u64, (position % copies_u64) as usize)
}

/// Whole logical chunks whose every copy fits in `rows` chunk rows.
pub(super) fn whole_chunks(members: usize, copies: usize, rows: u64) -> u64 {
    rows * members as u64 / copies as u64
}
