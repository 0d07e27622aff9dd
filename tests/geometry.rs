//! Geometry properties for every level, layout, member count, copy count and
//! chunk size: forward and reverse maps are inverse, every member offset of a
//! region holds exactly one thing, capacity counts what is there, and the
//! RAID5/6/10 placements match the tables in md's documentation.

use proptest::prelude::*;
use raidfs::geometry::{Geometry, GeometryError, Layout, Level, Role, Target};
use std::collections::HashMap;

const LEVELS: [Level; 5] = [
    Level::Raid0,
    Level::Raid1,
    Level::Raid5,
    Level::Raid6,
    Level::Raid10,
];
const LAYOUTS: [Layout; 4] = [
    Layout::LeftAsymmetric,
    Layout::RightAsymmetric,
    Layout::LeftSymmetric,
    Layout::RightSymmetric,
];

/// Any valid geometry of one of `levels` with 1 to 16 members and a 4 KiB to
/// 64 MiB chunk.
fn geometry_of(levels: &'static [Level]) -> impl Strategy<Value = Geometry> {
    (
        0..levels.len(),
        0..LAYOUTS.len(),
        1..=16usize,
        0..16usize,
        12u32..=26,
    )
        .prop_filter_map(
            "below the level's member minimum",
            |(level, layout, members, copies_seed, chunk_shift)| {
                let copies = 1 + copies_seed % members;
                Geometry::new(
                    levels[level],
                    members,
                    1 << chunk_shift,
                    copies,
                    LAYOUTS[layout],
                )
                .ok()
            },
        )
}

fn any_geometry() -> impl Strategy<Value = Geometry> {
    geometry_of(&LEVELS)
}

fn is_mirrored(geometry: &Geometry) -> bool {
    matches!(geometry.level, Level::Raid1 | Level::Raid10)
}

/// Every role a region holds, found by walking the forward map over the whole
/// logical capacity plus each stripe's parity. Panics if two things land on
/// the same (member, chunk row).
fn forward_roles(
    geometry: &Geometry,
    region_bytes: u64,
    offset_in_chunk: u64,
) -> HashMap<(usize, u64), Role> {
    let chunk = geometry.chunk;
    let rows = region_bytes / chunk;
    let mut roles = HashMap::new();
    let mut place = |target: Target, role: Role| {
        assert_eq!(
            target.offset % chunk,
            offset_in_chunk,
            "{geometry:?}: {role:?} not at the same offset in its chunk"
        );
        let row = target.offset / chunk;
        assert!(
            row < rows,
            "{geometry:?}: {role:?} at row {row} past the region's {rows} rows"
        );
        assert!(
            target.member < geometry.members,
            "{geometry:?}: {role:?} on member {}",
            target.member
        );
        if let Some(earlier) = roles.insert((target.member, row), role) {
            panic!(
                "{geometry:?}: member {} row {row} holds both {earlier:?} and {role:?}",
                target.member
            );
        }
    };
    for chunk_number in 0..geometry.capacity(region_bytes) / chunk {
        let logical = chunk_number * chunk + offset_in_chunk;
        for (copy, target) in geometry.map(logical).targets.into_iter().enumerate() {
            place(target, Role::Data { logical, copy });
        }
    }
    if !is_mirrored(geometry) {
        for stripe in 0..rows {
            let members = geometry.stripe_members(stripe);
            let offset = stripe * chunk + offset_in_chunk;
            if let Some(p) = members.p {
                place(
                    Target { member: p, offset },
                    Role::P {
                        stripe,
                        offset_in_chunk,
                    },
                );
            }
            if let Some(q) = members.q {
                place(
                    Target { member: q, offset },
                    Role::Q {
                        stripe,
                        offset_in_chunk,
                    },
                );
            }
        }
    }
    roles
}

proptest! {
    #[test]
    fn reverse_of_every_target_gives_back_the_logical_offset(
        geometry in any_geometry(),
        logical in 0u64..1 << 44,
    ) {
        let mapping = geometry.map(logical);
        prop_assert_eq!(mapping.offset_in_chunk, logical % geometry.chunk);
        if is_mirrored(&geometry) {
            prop_assert_eq!(mapping.stripe, logical / geometry.chunk);
            prop_assert_eq!(mapping.data_index, 0);
            prop_assert_eq!(mapping.targets.len(), geometry.copies);
        } else {
            prop_assert_eq!(mapping.stripe, logical / geometry.stripe_bytes());
            prop_assert_eq!(mapping.targets.len(), 1);
            let stripe = geometry.stripe_members(mapping.stripe);
            prop_assert_eq!(stripe.data[mapping.data_index], mapping.targets[0].member);
            prop_assert_eq!(mapping.targets[0].offset, mapping.stripe * geometry.chunk + mapping.offset_in_chunk);
        }
        for (copy, target) in mapping.targets.iter().enumerate() {
            prop_assert_eq!(geometry.reverse(target.member, target.offset), Role::Data { logical, copy });
        }
    }

    #[test]
    fn stripe_members_are_distinct_and_complete(geometry in any_geometry(), stripe in 0u64..1 << 40) {
        let members = geometry.stripe_members(stripe);
        let expected_data = if is_mirrored(&geometry) { geometry.copies } else { geometry.data_chunks() };
        prop_assert_eq!(members.data.len(), expected_data);
        prop_assert_eq!(members.p.is_some(), matches!(geometry.level, Level::Raid5 | Level::Raid6));
        prop_assert_eq!(members.q.is_some(), geometry.level == Level::Raid6);
        let mut all: Vec<usize> = members.data.iter().copied().chain(members.p).chain(members.q).collect();
        prop_assert!(all.iter().all(|&member| member < geometry.members), "{:?}", members);
        all.sort_unstable();
        all.dedup();
        prop_assert_eq!(all.len(), expected_data + members.p.iter().count() + members.q.iter().count());
    }

    /// Walking the forward map over a whole region (which panics on any
    /// collision) and then asking `role_in_region` about every member offset
    /// must give the same answer everywhere: the maps are a bijection between
    /// the logical capacity plus parity and the used member space.
    #[test]
    fn every_member_offset_of_a_region_holds_exactly_one_role(
        geometry in any_geometry(),
        rows_seed in 0u64..1024,
        tail_seed in any::<u64>(),
        offset_seed in any::<u64>(),
    ) {
        // Up to three full parity rotations, so every stripe shape appears.
        let rows = 1 + rows_seed % (3 * geometry.members as u64 + 2);
        check_region(&geometry, rows, tail_seed % geometry.chunk, offset_seed % geometry.chunk);
    }

    /// md rotates parity over the members: in any `members` consecutive
    /// stripes each member holds P once (and Q, right after P, once for RAID6).
    #[test]
    fn parity_rotates_over_every_member(
        geometry in geometry_of(&[Level::Raid5, Level::Raid6]),
        first_stripe in 0u64..1 << 40,
    ) {
        let mut p_count = vec![0; geometry.members];
        let mut q_count = vec![0; geometry.members];
        for stripe in first_stripe..first_stripe + geometry.members as u64 {
            let members = geometry.stripe_members(stripe);
            let p = members.p.expect("parity levels have P");
            p_count[p] += 1;
            if let Some(q) = members.q {
                q_count[q] += 1;
                prop_assert_eq!(q, (p + 1) % geometry.members);
            }
        }
        prop_assert!(p_count.iter().all(|&count| count == 1), "{:?}", p_count);
        if geometry.level == Level::Raid6 {
            prop_assert!(q_count.iter().all(|&count| count == 1), "{:?}", q_count);
        }
    }
}

/// The region check behind `every_member_offset_of_a_region_holds_exactly_one_role`:
/// `rows` whole chunk rows plus `tail` bytes, probed at `offset_in_chunk`.
fn check_region(geometry: &Geometry, rows: u64, tail: u64, offset_in_chunk: u64) {
    let chunk = geometry.chunk;
    let region_bytes = rows * chunk + tail;
    let forward = forward_roles(geometry, region_bytes, offset_in_chunk);
    let mut unused = 0u64;
    let mut first_copies = 0u64;
    for member in 0..geometry.members {
        for row in 0..rows {
            let offset = row * chunk + offset_in_chunk;
            let role = geometry.role_in_region(member, offset, region_bytes);
            match forward.get(&(member, row)) {
                Some(expected) => {
                    assert_eq!(role, *expected, "{geometry:?} member {member} row {row}");
                    assert_eq!(geometry.reverse(member, offset), *expected, "{geometry:?}");
                }
                None => {
                    assert_eq!(role, Role::Unused, "{geometry:?} member {member} row {row}");
                    unused += 1;
                }
            }
            first_copies += u64::from(matches!(role, Role::Data { copy: 0, .. }));
        }
        // The partial chunk row past the last whole one holds nothing.
        let past_end = rows * chunk + offset_in_chunk;
        assert_eq!(
            geometry.role_in_region(member, past_end, region_bytes),
            Role::Unused,
            "{geometry:?}"
        );
    }
    assert_eq!(
        geometry.capacity(region_bytes),
        first_copies * chunk,
        "{geometry:?} over {rows} rows"
    );
    if is_mirrored(geometry) {
        // Only the tail of the last row, too short for a whole chunk's copies.
        assert!(unused < geometry.copies as u64, "{geometry:?}");
        assert_eq!(
            unused,
            rows * geometry.members as u64 % geometry.copies as u64,
            "{geometry:?}"
        );
    } else {
        assert_eq!(unused, 0, "{geometry:?}");
    }
}

/// Every level, layout, member count (1 to 16) and copy count, not just a
/// random sample: the region check over two full parity rotations plus a
/// partial one.
#[test]
fn every_small_geometry_is_a_bijection_over_its_region() {
    let mut checked = 0;
    for level in LEVELS {
        for layout in LAYOUTS {
            for members in 1..=16 {
                // Only RAID10 takes a copy count; the other levels fix it.
                let most_copies = if level == Level::Raid10 { members } else { 1 };
                for copies in 1..=most_copies {
                    let Ok(geometry) = Geometry::new(level, members, 4096, copies, layout) else {
                        continue;
                    };
                    check_region(&geometry, 2 * members as u64 + 1, 100, 4095);
                    checked += 1;
                }
            }
        }
    }
    // RAID0/1 16 members each, RAID5 15, RAID6 14 (per layout), RAID10 136 copy counts (per layout).
    assert_eq!(checked, 4 * (16 + 16 + 15 + 14 + 136));
}

/// The placement picture of the first `rows` chunk rows, as md's documentation
/// draws it: logical chunk numbers, `P` and `Q`, `.` for unused.
fn picture_from_reverse(geometry: &Geometry, rows: u64) -> Vec<String> {
    (0..rows)
        .map(|row| {
            let cells: Vec<String> = (0..geometry.members)
                .map(
                    |member| match geometry.reverse(member, row * geometry.chunk) {
                        Role::Data { logical, .. } => (logical / geometry.chunk).to_string(),
                        Role::P { .. } => "P".to_string(),
                        Role::Q { .. } => "Q".to_string(),
                        Role::Unused => ".".to_string(),
                    },
                )
                .collect();
            cells.join(" ")
        })
        .collect()
}

/// The same picture drawn from the forward map and `stripe_members` only.
fn picture_from_map(geometry: &Geometry, rows: u64) -> Vec<String> {
    let mut cells = vec![vec![".".to_string(); geometry.members]; rows as usize];
    for chunk_number in 0..geometry.capacity(rows * geometry.chunk) / geometry.chunk {
        for target in geometry.map(chunk_number * geometry.chunk).targets {
            cells[(target.offset / geometry.chunk) as usize][target.member] =
                chunk_number.to_string();
        }
    }
    if !is_mirrored(geometry) {
        for (stripe, row) in cells.iter_mut().enumerate() {
            let members = geometry.stripe_members(stripe as u64);
            if let Some(p) = members.p {
                row[p] = "P".to_string();
            }
            if let Some(q) = members.q {
                row[q] = "Q".to_string();
            }
        }
    }
    cells.into_iter().map(|row| row.join(" ")).collect()
}

fn assert_picture(level: Level, members: usize, copies: usize, layout: Layout, expected: &[&str]) {
    let geometry = Geometry::new(level, members, 64 << 10, copies, layout).expect("valid geometry");
    let rows = expected.len() as u64;
    assert_eq!(
        picture_from_reverse(&geometry, rows),
        expected,
        "{level} {layout} reverse"
    );
    assert_eq!(
        picture_from_map(&geometry, rows),
        expected,
        "{level} {layout} map"
    );
}

#[test]
fn raid5_on_four_members_matches_md_pictures() {
    // drivers/md/raid5.c raid5_compute_sector, drawn for 4 disks.
    #[rustfmt::skip]
    let pictures: [(Layout, [&str; 5]); 4] = [
        (Layout::LeftSymmetric, ["0 1 2 P", "4 5 P 3", "8 P 6 7", "P 9 10 11", "12 13 14 P"]),
        (Layout::LeftAsymmetric, ["0 1 2 P", "3 4 P 5", "6 P 7 8", "P 9 10 11", "12 13 14 P"]),
        (Layout::RightSymmetric, ["P 0 1 2", "5 P 3 4", "7 8 P 6", "9 10 11 P", "P 12 13 14"]),
        (Layout::RightAsymmetric, ["P 0 1 2", "3 P 4 5", "6 7 P 8", "9 10 11 P", "P 12 13 14"]),
    ];
    for (layout, picture) in pictures {
        assert_picture(Level::Raid5, 4, 1, layout, &picture);
    }
}

#[test]
fn raid6_on_five_members_matches_md_pictures() {
    // Q follows P; the asymmetric layouts put Q on member 0 when P is last
    // ("Q D D D P" in raid5.c) and otherwise skip P and Q ("D D P Q D").
    #[rustfmt::skip]
    let pictures: [(Layout, [&str; 5]); 4] = [
        (Layout::LeftSymmetric, ["Q 0 1 2 P", "3 4 5 P Q", "7 8 P Q 6", "11 P Q 9 10", "P Q 12 13 14"]),
        (Layout::LeftAsymmetric, ["Q 0 1 2 P", "3 4 5 P Q", "6 7 P Q 8", "9 P Q 10 11", "P Q 12 13 14"]),
        (Layout::RightSymmetric, ["P Q 0 1 2", "5 P Q 3 4", "7 8 P Q 6", "9 10 11 P Q", "Q 12 13 14 P"]),
        (Layout::RightAsymmetric, ["P Q 0 1 2", "3 P Q 4 5", "6 7 P Q 8", "9 10 11 P Q", "Q 12 13 14 P"]),
    ];
    for (layout, picture) in pictures {
        assert_picture(Level::Raid6, 5, 1, layout, &picture);
    }
}

#[test]
fn raid0_raid1_and_raid10_near_match_md_pictures() {
    assert_picture(Level::Raid0, 3, 1, Layout::DEFAULT, &["0 1 2", "3 4 5"]);
    assert_picture(Level::Raid1, 3, 3, Layout::DEFAULT, &["0 0 0", "1 1 1"]);
    assert_picture(
        Level::Raid10,
        4,
        2,
        Layout::DEFAULT,
        &["0 0 1 1", "2 2 3 3"],
    );
    // md(4)'s picture of near=2 on 3 drives: copies wrap into the next row.
    assert_picture(
        Level::Raid10,
        3,
        2,
        Layout::DEFAULT,
        &["0 0 1", "1 2 2", "3 3 4", "4 5 5"],
    );
    assert_picture(
        Level::Raid10,
        5,
        3,
        Layout::DEFAULT,
        &["0 0 0 1 1", "1 2 2 2 3", "3 3 4 4 4"],
    );
}

#[test]
fn raid10_uneven_capacity_counts_only_whole_chunks() {
    let geometry =
        Geometry::new(Level::Raid10, 3, 4096, 2, Layout::DEFAULT).expect("valid geometry");
    // 5 rows × 3 members = 15 positions: 7 whole chunks, one lone copy of chunk 7.
    let region = 5 * 4096 + 100;
    assert_eq!(geometry.capacity(region), 7 * 4096);
    assert_eq!(geometry.role_in_region(2, 4 * 4096, region), Role::Unused);
    assert_eq!(
        geometry.reverse(2, 4 * 4096),
        Role::Data {
            logical: 7 * 4096,
            copy: 0
        }
    );
    assert_eq!(
        geometry.role_in_region(1, 4 * 4096 + 5, region),
        Role::Data {
            logical: 6 * 4096 + 5,
            copy: 1
        }
    );
}

#[test]
fn sizes_and_tolerance_per_level() {
    let chunk = 64 << 10;
    let cases = [
        (Level::Raid0, 4, 1, 4, 0),
        (Level::Raid1, 3, 3, 1, 2),
        (Level::Raid5, 4, 1, 3, 1),
        (Level::Raid6, 6, 1, 4, 2),
        (Level::Raid10, 4, 2, 1, 1),
        (Level::Raid10, 5, 3, 1, 2),
    ];
    for (level, members, copies, data_chunks, tolerance) in cases {
        let geometry =
            Geometry::new(level, members, chunk, copies, Layout::DEFAULT).expect("valid geometry");
        assert_eq!(geometry.data_chunks(), data_chunks, "{level}");
        assert_eq!(geometry.tolerance(), tolerance, "{level}");
        assert_eq!(
            geometry.stripe_bytes(),
            data_chunks as u64 * chunk,
            "{level}"
        );
    }
    let raid6 = Geometry::new(Level::Raid6, 6, chunk, 1, Layout::DEFAULT).expect("valid geometry");
    assert_eq!(raid6.capacity(10 * chunk + chunk - 1), 10 * 4 * chunk);
}

#[test]
fn new_rejects_what_md_would_and_normalises_the_rest() {
    let chunk = 64 << 10;
    let ls = Layout::LeftSymmetric;
    for bad_chunk in [0, 2048, 3 * 4096, 128 << 20] {
        assert_eq!(
            Geometry::new(Level::Raid5, 4, bad_chunk, 1, ls),
            Err(GeometryError::BadChunk(bad_chunk))
        );
    }
    assert!(Geometry::new(Level::Raid0, 4, 4096, 1, ls).is_ok());
    assert!(Geometry::new(Level::Raid0, 4, 64 << 20, 1, ls).is_ok());
    assert_eq!(
        Geometry::new(Level::Raid0, 256, chunk, 1, ls),
        Err(GeometryError::TooManyMembers(256))
    );
    assert!(Geometry::new(Level::Raid6, 255, chunk, 1, ls).is_ok());
    for (level, min) in [
        (Level::Raid0, 1),
        (Level::Raid1, 1),
        (Level::Raid5, 2),
        (Level::Raid6, 3),
    ] {
        assert_eq!(
            Geometry::new(level, min - 1, chunk, 1, ls),
            Err(GeometryError::TooFewMembers {
                level,
                min,
                got: min - 1
            })
        );
        assert!(Geometry::new(level, min, chunk, 1, ls).is_ok(), "{level}");
    }
    assert_eq!(
        Geometry::new(Level::Raid10, 2, chunk, 3, ls),
        Err(GeometryError::BadCopies(3, 2))
    );
    assert_eq!(
        Geometry::new(Level::Raid10, 2, chunk, 0, ls),
        Err(GeometryError::BadCopies(0, 2))
    );
    let raid1 =
        Geometry::new(Level::Raid1, 3, chunk, 2, Layout::RightAsymmetric).expect("valid geometry");
    assert_eq!((raid1.copies, raid1.layout), (3, Layout::LeftSymmetric));
    let raid5 =
        Geometry::new(Level::Raid5, 3, chunk, 2, Layout::RightAsymmetric).expect("valid geometry");
    assert_eq!((raid5.copies, raid5.layout), (1, Layout::RightAsymmetric));
    let message = Geometry::new(Level::Raid6, 2, chunk, 1, ls)
        .unwrap_err()
        .to_string();
    assert_eq!(message, "raid6 needs at least 3 members, got 2");
}

#[test]
fn metadata_geometry_mirrors_on_at_most_three_members() {
    for members in 1..=8 {
        let geometry = Geometry::metadata(members, 64 << 10).expect("valid geometry");
        assert_eq!(
            geometry.map(12345).targets.len(),
            members.min(3),
            "{members} members"
        );
    }
}

#[test]
fn reverse_of_a_member_outside_the_geometry_is_unused() {
    let geometry =
        Geometry::new(Level::Raid5, 4, 4096, 1, Layout::DEFAULT).expect("valid geometry");
    assert_eq!(geometry.reverse(4, 0), Role::Unused);
}

/// The copy counts a superblock may record are exactly those the geometry
/// keeps for that level and member count.
#[test]
fn copies_fit_is_what_the_geometry_keeps() {
    for level in [
        Level::Raid0,
        Level::Raid1,
        Level::Raid5,
        Level::Raid6,
        Level::Raid10,
    ] {
        for members in 4..=8usize {
            for copies in 0..=9usize {
                let kept = Geometry::new(level, members, 65536, copies, Layout::LeftSymmetric)
                    .is_ok_and(|g| g.copies == copies);
                assert_eq!(
                    level.copies_fit(copies as u64, members as u64),
                    kept,
                    "{level:?}, {members} members, {copies} copies"
                );
            }
        }
    }
}
