//! Superblock format: round trips, checksum coverage, the four-copy rule
//! (two at the front, two at the end of each member), version 1 members and
//! field validation.

use proptest::prelude::*;
use raidfs::geometry::{Geometry, Layout, Level};
use raidfs::member::faulty::{FaultyMember, Ops};
use raidfs::member::memory::MemoryMember;
use raidfs::member::Member;
use raidfs::superblock::*;
use uuid::Uuid;

const CHUNK: u64 = 4096;
const GROUPS: usize = 4;

/// A valid superblock with a small data area (4 groups of one chunk).
fn sample(events: u64) -> Superblock {
    Superblock {
        version: FORMAT_VERSION,
        array_uuid: Uuid::from_u128(0x1234),
        member_uuid: Uuid::from_u128(0x5678),
        name: "tank".into(),
        slot: 1,
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: CHUNK,
        members: 3,
        copies: 1,
        data_offset: DEFAULT_DATA_OFFSET,
        data_size: CHUNK * GROUPS as u64,
        group_size: CHUNK,
        events,
        state: ArrayState::Clean,
        recovery_offset: u64::MAX,
        features: Features::default(),
        ctime: 1_700_000_000,
        utime: 1_700_000_100,
        slots: vec![SlotState::Active, SlotState::Active, SlotState::Faulty],
        groups: vec![
            GroupProfile::Metadata,
            GroupProfile::Data,
            GroupProfile::Unallocated,
            GroupProfile::Data,
        ],
        reshape: None,
        scrub: None,
    }
}

/// A member just big enough for `sample`'s data area and the end copies.
fn member() -> MemoryMember {
    MemoryMember::new(DEFAULT_DATA_OFFSET + CHUNK * GROUPS as u64 + END_COPIES_LEN)
        .expect("small memory member")
        .with_name("m0")
}

/// Every copy's offset on `member()`, in verdict order.
fn all_offsets(m: &dyn Member) -> [u64; 4] {
    let [e0, e1] = end_offsets(m.len()).expect("room for the end copies");
    [SB_OFFSETS[0], SB_OFFSETS[1], e0, e1]
}

use CopyState::{BadChecksum, Good, Invalid, Missing, NotPresent, Stale};

fn arb_superblock() -> impl Strategy<Value = Superblock> {
    let level = prop_oneof![
        Just(Level::Raid0),
        Just(Level::Raid1),
        Just(Level::Raid5),
        Just(Level::Raid6),
        Just(Level::Raid10),
    ];
    let layout = prop_oneof![
        Just(Layout::LeftAsymmetric),
        Just(Layout::RightAsymmetric),
        Just(Layout::LeftSymmetric),
        Just(Layout::RightSymmetric),
    ];
    let slot_state = prop_oneof![
        Just(SlotState::Active),
        Just(SlotState::Faulty),
        Just(SlotState::Rebuilding),
        Just(SlotState::Missing),
    ];
    let group = prop_oneof![
        Just(GroupProfile::Unallocated),
        Just(GroupProfile::Metadata),
        Just(GroupProfile::Data),
    ];
    let head = (
        level,
        layout,
        1u32..=MAX_MEMBERS as u32,
        12u32..=26,
        1u64..64,
        "[^\u{0}]{0,8}",
        any::<u128>(),
        any::<u128>(),
        any::<bool>(),
    );
    let counters = (
        any::<u64>(),
        any::<u64>(),
        (any::<bool>(), any::<u64>(), any::<u64>()),
        any::<u64>(),
        any::<u64>(),
        0u64..=(1 << 30),
        any::<u64>(),
    );
    (head, counters).prop_flat_map(move |(head, counters)| {
        let (level, layout, members, chunk_shift, group_chunks, name, au, mu, dirty) = head;
        let version = prop_oneof![Just(OLDEST_FORMAT_VERSION), Just(2), Just(FORMAT_VERSION)];
        let copies = match level {
            Level::Raid1 => Just(members).boxed(),
            Level::Raid10 => (1..=members).boxed(),
            _ => Just(1).boxed(),
        };
        let slot = prop_oneof![0..members, Just(SPARE_SLOT)];
        (
            (copies, version),
            slot,
            proptest::collection::vec(slot_state.clone(), members as usize),
            proptest::collection::vec(group.clone(), 0..=MAX_GROUPS),
            Just((
                level,
                layout,
                members,
                chunk_shift,
                group_chunks,
                name,
                au,
                mu,
                dirty,
            )),
            Just(counters),
        )
            .prop_map(|((copies, version), slot, slots, groups, head, counters)| {
                let (level, layout, members, chunk_shift, group_chunks, name, au, mu, dirty) = head;
                let (events, recovery, features, ctime, utime, offset_blocks, spare) = counters;
                let chunk = 1u64 << chunk_shift;
                let group_size = chunk * group_chunks;
                // Versions 1 and 2 hold only the PPL bit; version 3 keeps
                // any compat and ro-compat bits, known or not.
                let (ppl, compat, ro_compat) = features;
                let ppl = if ppl { FEATURE_PPL } else { 0 };
                let features = if version >= FEATURE_WORDS_VERSION {
                    Features {
                        compat,
                        ro_compat: ro_compat | ppl,
                        incompat: 0,
                    }
                } else {
                    Features {
                        ro_compat: ppl,
                        ..Features::default()
                    }
                };
                Superblock {
                    version,
                    array_uuid: Uuid::from_u128(au),
                    member_uuid: Uuid::from_u128(mu),
                    name,
                    slot,
                    level,
                    layout,
                    chunk,
                    members,
                    copies,
                    data_offset: 8192 + offset_blocks * 4096,
                    // Any remainder below one group is allowed and kept.
                    data_size: group_size * groups.len() as u64 + spare % group_size,
                    group_size,
                    events,
                    state: if dirty {
                        ArrayState::Dirty
                    } else {
                        ArrayState::Clean
                    },
                    recovery_offset: recovery,
                    features,
                    ctime,
                    utime,
                    slots,
                    groups,
                    reshape: None,
                    scrub: None,
                }
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn encode_decode_round_trips(sb in arb_superblock()) {
        prop_assert_eq!(sb.validate(), Ok(()));
        let block = sb.encode();
        let back = Superblock::decode(&block, "m").expect("valid superblock decodes");
        prop_assert_eq!(back, sb);
    }

    #[test]
    fn any_corruption_of_one_byte_is_caught(
        sb in arb_superblock(),
        at in 0usize..SUPERBLOCK_SIZE,
        mask in 1u8..=255,
    ) {
        let mut block = sb.encode();
        block[at] ^= mask;
        let result = Superblock::decode(&block, "m");
        if at < MAGIC.len() {
            prop_assert!(matches!(result, Err(SuperblockError::NotMember(_))), "{:?}", result);
        } else {
            prop_assert!(matches!(result, Err(SuperblockError::Corrupt { .. })), "{:?}", result);
        }
    }
}

#[test]
fn every_single_flipped_byte_fails_decode() {
    let block = sample(7).encode();
    for at in 0..SUPERBLOCK_SIZE {
        let mut bad = block;
        bad[at] ^= 0xff;
        let result = Superblock::decode(&bad, "m");
        let expected_kind_ok = if at < MAGIC.len() {
            matches!(result, Err(SuperblockError::NotMember(_)))
        } else {
            matches!(result, Err(SuperblockError::Corrupt { .. }))
        };
        assert!(expected_kind_ok, "byte {at}: {result:?}");
    }
}

#[test]
fn layout_fields_sit_where_the_format_says() {
    let block = sample(0x0102_0304_0506_0708).encode();
    assert_eq!(&block[0..8], &MAGIC);
    assert_eq!(
        u32::from_le_bytes(block[8..12].try_into().unwrap()),
        FORMAT_VERSION
    );
    assert_eq!(&block[16..32], Uuid::from_u128(0x1234).as_bytes());
    assert_eq!(&block[48..52], b"tank");
    assert_eq!(u32::from_le_bytes(block[80..84].try_into().unwrap()), 1);
    assert_eq!(block[84], 5, "level code");
    assert_eq!(block[85], 2, "left-symmetric is md algorithm 2");
    assert_eq!(
        u64::from_le_bytes(block[128..136].try_into().unwrap()),
        0x0102_0304_0506_0708
    );
    assert_eq!(u32::from_le_bytes(block[168..172].try_into().unwrap()), 4);
    assert_eq!(&block[256..260], &[1, 1, 2, 0]);
    assert_eq!(&block[512..517], &[1, 2, 0, 2, 0]);
    let crc = crc32c::crc32c(&block[..4092]);
    assert_eq!(u32::from_le_bytes(block[4092..].try_into().unwrap()), crc);
}

/// Re-seal a hand-edited block so only the edited field is wrong.
fn reseal(block: &mut [u8; SUPERBLOCK_SIZE]) {
    let crc = crc32c::crc32c(&block[..4092]);
    block[4092..].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn unknown_version_is_refused_naming_it() {
    let mut block = sample(1).encode();
    block[8..12].copy_from_slice(&4u32.to_le_bytes());
    reseal(&mut block);
    let result = Superblock::decode(&block, "m");
    match &result {
        Err(SuperblockError::Version { version: 4, .. }) => {}
        other => panic!("expected Version error, got {other:?}"),
    }
    let message = result.unwrap_err().to_string();
    assert!(message.contains("version 4"), "{message}");
    // On a member, every copy with version 4: the error names it too.
    let m = member();
    for offset in all_offsets(&m) {
        m.write_at(&block, offset).unwrap();
    }
    let err = Superblock::read_from(&m).unwrap_err();
    assert!(
        matches!(err, SuperblockError::Version { version: 4, .. }),
        "{err:?}"
    );
    let mut sb = sample(1);
    sb.version = 4;
    assert!(sb.validate().unwrap_err().contains("version 4"));
}

/// `sample` with the given feature words, on a version 3 superblock.
fn with_features(compat: u64, ro_compat: u64, incompat: u64) -> Superblock {
    Superblock {
        features: Features {
            compat,
            ro_compat,
            incompat,
        },
        ..sample(1)
    }
}

#[test]
fn unknown_incompat_feature_bits_are_refused_naming_them() {
    let sb = with_features(0, FEATURE_PPL, 1 << 5);
    let why = sb.validate().unwrap_err();
    assert!(
        why.contains("unknown incompatible feature bit 5 (0x20)"),
        "{why}"
    );
    assert!(why.contains("too old"), "{why}");
    match Superblock::decode(&sb.encode(), "m") {
        Err(SuperblockError::Feature { what, .. }) => {
            assert!(what.contains("incompatible feature bit 5 (0x20)"), "{what}")
        }
        other => panic!("expected Feature, got {other:?}"),
    }
    // Every copy of a member refused: the error names the bit.
    let m = member();
    for offset in all_offsets(&m) {
        m.write_at(&sb.encode(), offset).unwrap();
    }
    let err = Superblock::read_from(&m).unwrap_err().to_string();
    assert!(
        err.contains("m0: superblock has unknown incompatible feature bit 5"),
        "{err}"
    );
    let m = member();
    assert!(sb.write_to(&m).is_err(), "write_to refuses it");
    assert!(m.snapshot().iter().all(|&b| b == 0), "nothing written");
    // A version 2 superblock's one word: any bit but PPL is incompat.
    let mut v2 = sample(1);
    v2.version = 2;
    let mut block = v2.encode();
    block[144..152].copy_from_slice(&(FEATURE_PPL | 1 << 7).to_le_bytes());
    reseal(&mut block);
    let err = Superblock::decode(&block, "m").unwrap_err().to_string();
    assert!(err.contains("incompatible feature bit 7 (0x80)"), "{err}");
    assert_eq!(raidfs::array::FEATURE_PPL, FEATURE_PPL);
    assert_eq!(
        (KNOWN_COMPAT, KNOWN_RO_COMPAT, KNOWN_INCOMPAT),
        (0, FEATURE_PPL, FEATURE_RESHAPE)
    );
}

#[test]
fn unknown_ro_compat_bits_read_and_are_kept_but_never_written() {
    let sb = with_features(0, FEATURE_PPL | 1 << 9, 0);
    assert_eq!(sb.validate(), Ok(()));
    let back = Superblock::decode(&sb.encode(), "m").expect("an unknown ro-compat bit reads");
    assert_eq!(back.features, sb.features, "kept as read");
    assert!(back.has_ppl(), "the known bit still counts");
    let m = member();
    let why = sb.write_to(&m).unwrap_err().to_string();
    assert!(
        why.contains("unknown read-only-compatible feature bit 9 (0x200)"),
        "{why}"
    );
    assert!(m.snapshot().iter().all(|&b| b == 0), "nothing written");
}

#[test]
fn unknown_compat_bits_are_ignored_and_preserved() {
    let sb = with_features(1 << 3 | 1 << 62, 0, 0);
    let m = member();
    sb.write_to(&m)
        .expect("unknown compat bits are written back");
    let (back, _) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.features.compat, 1 << 3 | 1 << 62);
    let block = back.encode();
    assert_eq!(&block[180..188], &(1u64 << 3 | 1 << 62).to_le_bytes());
}

#[test]
fn versions_1_and_2_keep_ppl_in_their_one_word() {
    for version in [1, 2] {
        let mut sb = with_features(0, FEATURE_PPL, 0);
        sb.version = version;
        let block = sb.encode();
        assert_eq!(&block[144..152], &FEATURE_PPL.to_le_bytes(), "v{version}");
        assert!(block[172..188].iter().all(|&b| b == 0), "v{version}");
        let back = Superblock::decode(&block, "m").unwrap();
        assert_eq!(back.features, sb.features);
        // The words of version 3 cannot be told to a version 2 member.
        sb.features.compat = 1;
        let why = sb.validate().unwrap_err();
        assert!(why.contains("one feature word"), "{why}");
    }
    // Version 3 puts PPL in the ro-compat word.
    let block = with_features(0, FEATURE_PPL, 0).encode();
    assert_eq!(&block[144..152], &[0; 8]);
    assert_eq!(&block[172..180], &FEATURE_PPL.to_le_bytes());
}

/// A change that breaks one rule of the format.
type Edit = Box<dyn Fn(&mut Superblock)>;

#[test]
fn insane_fields_are_invalid() {
    let cases: Vec<(&str, Edit)> = vec![
        ("slot >= members", Box::new(|sb| sb.slot = 3)),
        (
            "zero members",
            Box::new(|sb| {
                sb.members = 0;
                sb.slots.clear();
            }),
        ),
        (
            "group count mismatch",
            Box::new(|sb| {
                sb.groups.pop();
            }),
        ),
        (
            "chunk not a power of two",
            Box::new(|sb| {
                sb.chunk = 12288;
                sb.group_size = 12288;
                sb.data_size = 12288 * 4;
            }),
        ),
        (
            "group size not a chunk multiple",
            Box::new(|sb| sb.group_size = 6144),
        ),
        ("raid5 with 2 copies", Box::new(|sb| sb.copies = 2)),
        (
            "data offset over the superblocks",
            Box::new(|sb| sb.data_offset = 4096),
        ),
        (
            "data offset unaligned",
            Box::new(|sb| sb.data_offset = DEFAULT_DATA_OFFSET + 1),
        ),
        (
            "slots shorter than members",
            Box::new(|sb| {
                sb.slots.pop();
            }),
        ),
    ];
    for (what, edit) in cases {
        let mut sb = sample(1);
        edit(&mut sb);
        assert!(sb.validate().is_err(), "{what}: validate accepted it");
        let result = Superblock::decode(&sb.encode(), "m");
        assert!(
            matches!(result, Err(SuperblockError::Invalid { .. })),
            "{what}: {result:?}"
        );
        let m = member();
        let err = sb
            .write_to(&m)
            .expect_err("write_to must refuse an invalid superblock");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput, "{what}");
        assert!(
            m.snapshot()[..8192].iter().all(|&b| b == 0),
            "{what}: wrote something"
        );
    }
}

#[test]
fn spare_slot_is_valid() {
    let mut sb = sample(1);
    sb.slot = SPARE_SLOT;
    assert!(sb.is_spare());
    assert_eq!(Superblock::decode(&sb.encode(), "m").unwrap(), sb);
}

#[test]
fn stray_table_entries_are_invalid() {
    let mut block = sample(1).encode();
    block[256 + 5] = 1; // slot 5 of a 3-slot array
    reseal(&mut block);
    assert!(matches!(
        Superblock::decode(&block, "m"),
        Err(SuperblockError::Invalid { .. })
    ));
    let mut block = sample(1).encode();
    block[512 + 10] = 2; // group 10 of a 4-group array
    reseal(&mut block);
    assert!(matches!(
        Superblock::decode(&block, "m"),
        Err(SuperblockError::Invalid { .. })
    ));
}

#[test]
fn write_then_read_returns_it_with_all_four_copies_good() {
    let m = member();
    let sb = sample(9);
    sb.write_to(&m).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back, sb);
    assert_eq!(verdict.copies, [Good; 4]);
    assert!(!verdict.needs_rewrite());
    let bytes = m.snapshot();
    let block = sb.encode();
    for offset in all_offsets(&m) {
        let at = offset as usize;
        assert_eq!(bytes[at..at + SUPERBLOCK_SIZE], block, "copy at {offset}");
    }
    let end = m.len() as usize;
    assert_eq!(all_offsets(&m)[2..], [end as u64 - 8192, end as u64 - 4096]);
}

#[test]
fn end_copies_sit_in_the_last_whole_4k_blocks() {
    assert_eq!(member_end(1 << 20), 1 << 20);
    assert_eq!(member_end((1 << 20) + 4095), 1 << 20);
    assert_eq!(
        end_offsets((1 << 20) + 100),
        Some([(1 << 20) - 8192, (1 << 20) - 4096])
    );
    // Too small to keep them apart from the front copies.
    assert_eq!(end_offsets(16383), None);
    assert_eq!(end_offsets(16384), Some([8192, 12288]));
}

#[test]
fn write_to_syncs_after_every_copy() {
    let m = FaultyMember::new(member());
    sample(3).write_to(&m).unwrap();
    let counts = m.counts();
    assert_eq!((counts.writes, counts.syncs), (4, 4));
    // Interrupted after copy 0 and its sync: copy 0 is already durable.
    m.fail_writes_after(1);
    assert!(sample(4).write_to(&m).is_err());
    let image = m.crash_image().unwrap();
    let (back, verdict) = Superblock::read_from(&image).unwrap();
    assert_eq!(back.events, 4);
    assert_eq!(verdict.copies, [Good, Stale, Stale, Stale]);
    assert!(verdict.needs_rewrite(), "stale copies are healed");
    assert!(!verdict.has_damage(), "an interrupted update is no damage");
}

#[test]
fn no_magic_is_not_a_member() {
    let m = member();
    assert!(matches!(
        Superblock::read_from(&m),
        Err(SuperblockError::NotMember(name)) if name == "m0"
    ));
}

#[test]
fn torn_copy_zero_falls_back_to_copy_one() {
    let m = member();
    sample(5).write_to(&m).unwrap();
    // A crash half-way through rewriting copy 0 with a newer superblock.
    let newer = sample(6).encode();
    m.write_at(&newer[..2048], SB_OFFSETS[0]).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.events, 5);
    assert_eq!(verdict.copies, [BadChecksum, Good, Good, Good]);
    assert!(verdict.needs_rewrite());
    assert_eq!(verdict.damaged(), "front 0 bad checksum");
}

#[test]
fn torn_copy_one_keeps_the_newer_copy_zero() {
    let m = member();
    sample(5).write_to(&m).unwrap();
    let newer = sample(6).encode();
    m.write_at(&newer, SB_OFFSETS[0]).unwrap();
    m.write_at(&newer[..512], SB_OFFSETS[1]).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.events, 6);
    assert_eq!(verdict.copies, [Good, BadChecksum, Stale, Stale]);
}

#[test]
fn higher_events_wins_among_valid_copies() {
    let m = member();
    sample(5).write_to(&m).unwrap();
    let [_, f1, e0, e1] = all_offsets(&m);
    m.write_at(&sample(8).encode(), f1).unwrap();
    assert_eq!(Superblock::read_from(&m).unwrap().0.events, 8);
    m.write_at(&sample(9).encode(), e0).unwrap();
    assert_eq!(Superblock::read_from(&m).unwrap().0.events, 9);
    m.write_at(&sample(10).encode(), e1).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.events, 10);
    assert_eq!(verdict.copies, [Stale, Stale, Stale, Good]);
}

#[test]
fn one_copy_without_magic_is_reported_missing() {
    let m = member();
    sample(5).write_to(&m).unwrap();
    m.write_at(&[0u8; SUPERBLOCK_SIZE], SB_OFFSETS[0]).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.events, 5);
    assert_eq!(verdict.copies, [Missing, Good, Good, Good]);
}

#[test]
fn zeroed_front_mib_is_recognised_from_the_end_copies() {
    let m = member();
    let sb = sample(5);
    sb.write_to(&m).unwrap();
    m.write_at(&vec![0u8; DEFAULT_DATA_OFFSET as usize], 0)
        .unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back, sb);
    assert_eq!(verdict.copies, [Missing, Missing, Good, Good]);
    assert!(verdict.needs_rewrite());
    assert_eq!(verdict.damaged(), "front 0 missing, front 1 missing");
    assert!(verdict.has_damage());
    // Writing it again heals the front.
    back.write_to(&m).unwrap();
    assert_eq!(Superblock::read_from(&m).unwrap().1.copies, [Good; 4]);
}

#[test]
fn end_copies_of_another_array_never_win_over_the_front() {
    let m = member();
    let mut old = sample(50);
    old.array_uuid = Uuid::from_u128(0x9999);
    old.write_to(&m).unwrap();
    // The device is reused for a new array; only its front is written
    // (as by a raidfs that kept no end copies, or a torn create).
    let new = sample(2);
    for offset in SB_OFFSETS {
        m.write_at(&new.encode(), offset).unwrap();
    }
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back, new, "the front's identity wins despite fewer events");
    assert_eq!(verdict.copies, [Good, Good, Stale, Stale]);
    assert!(verdict.needs_rewrite());
}

#[test]
fn every_copy_bad_is_corrupt() {
    let m = member();
    sample(5).write_to(&m).unwrap();
    let offsets = all_offsets(&m);
    for (i, offset) in offsets.into_iter().enumerate() {
        m.write_at(&[0xAA], offset + 100).unwrap();
        let result = Superblock::read_from(&m);
        if i < 3 {
            assert!(result.is_ok(), "{} copies left: {result:?}", 3 - i);
        } else {
            assert!(matches!(
                result,
                Err(SuperblockError::Corrupt { member }) if member == "m0"
            ));
        }
    }
}

#[test]
fn unreadable_copy_falls_back_and_all_unreadable_is_io() {
    let m = FaultyMember::new(member());
    sample(5).write_to(&m).unwrap();
    m.fail_range(0..4096, Ops::READS);
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back.events, 5);
    assert_eq!(verdict.copies, [Invalid, Good, Good, Good]);
    m.fail_range(4096..8192, Ops::READS);
    let (_, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(verdict.copies, [Invalid, Invalid, Good, Good]);
    let end = member_end(m.len());
    m.fail_range(end - 8192..end, Ops::READS);
    assert!(matches!(
        Superblock::read_from(&m),
        Err(SuperblockError::Io(..))
    ));
}

#[test]
fn data_area_past_the_member_end_is_invalid() {
    let m = MemoryMember::new(DEFAULT_DATA_OFFSET).unwrap();
    let err = sample(1).write_to(&m).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    for offset in SB_OFFSETS {
        m.write_at(&sample(1).encode(), offset).unwrap();
    }
    assert!(matches!(
        Superblock::read_from(&m),
        Err(SuperblockError::Invalid { .. })
    ));
}

#[test]
fn version_2_data_area_over_the_end_copies_is_invalid() {
    // Room for the data area, but not for the end copies after it.
    let len = DEFAULT_DATA_OFFSET + CHUNK * GROUPS as u64 + 4096;
    let m = MemoryMember::new(len).unwrap();
    let sb = sample(1);
    let err = sb.write_to(&m).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("end superblock copies"), "{err}");
    assert!(m.snapshot().iter().all(|&b| b == 0), "nothing written");
    for offset in SB_OFFSETS {
        m.write_at(&sb.encode(), offset).unwrap();
    }
    match Superblock::read_from(&m) {
        Err(SuperblockError::Invalid { what, .. }) => {
            assert!(what.contains("end superblock copies"), "{what}")
        }
        other => panic!("expected Invalid, got {other:?}"),
    }
    assert_eq!(sb.min_member_len(), len + 4096);
}

/// A paused scrub's checkpoint is kept by every format version, and a kind
/// code this raidfs does not know (a later one's) reads as none rather
/// than refusing the member.
#[test]
fn scrub_checkpoint_round_trips_and_unknown_kinds_read_as_none() {
    for version in [1, 2, FORMAT_VERSION] {
        for repair in [false, true] {
            let sb = Superblock {
                version,
                features: Features {
                    ro_compat: FEATURE_PPL,
                    ..Features::default()
                },
                scrub: Some(ScrubCheckpoint {
                    repair,
                    offset: 3 << 20,
                }),
                ..sample(5)
            };
            let back = Superblock::decode(&sb.encode(), "m").expect("decodes");
            assert_eq!(back.scrub, sb.scrub, "version {version}");
        }
    }
    let mut block = sample(5).encode();
    assert_eq!(block[188], 0, "no checkpoint: zero");
    block[188] = 9;
    block[192..200].copy_from_slice(&(7u64 << 20).to_le_bytes());
    let crc = crc32c::crc32c(&block[..4092]);
    block[4092..].copy_from_slice(&crc.to_le_bytes());
    let back = Superblock::decode(&block, "m").expect("an unknown kind is no obstacle");
    assert_eq!(back.scrub, None);
}

/// A version 1 superblock, as releases before the end copies wrote it.
fn sample_v1(events: u64) -> Superblock {
    Superblock {
        version: 1,
        features: Features {
            ro_compat: FEATURE_PPL,
            ..Features::default()
        },
        ..sample(events)
    }
}

#[test]
fn version_1_member_with_data_to_the_end_still_reads() {
    // The data area runs to the member's very end, as version 1 allowed.
    let sb = sample_v1(7);
    let m = MemoryMember::new(sb.data_offset + sb.data_size)
        .unwrap()
        .with_name("old");
    let block = sb.encode();
    assert_eq!(u32::from_le_bytes(block[8..12].try_into().unwrap()), 1);
    for offset in SB_OFFSETS {
        m.write_at(&block, offset).unwrap();
    }
    // Its last 8 KiB is array data that happens to look like a superblock
    // of another array: never taken for an end copy.
    let mut foreign = sample(99);
    foreign.array_uuid = Uuid::from_u128(0xdead);
    let [e0, e1] = end_offsets(m.len()).unwrap();
    m.write_at(&foreign.encode(), e0).unwrap();
    m.write_at(&foreign.encode(), e1).unwrap();
    let (back, verdict) = Superblock::read_from(&m).unwrap();
    assert_eq!(back, sb);
    assert_eq!(verdict.copies, [Good, Good, NotPresent, NotPresent]);
    assert!(!verdict.needs_rewrite());
    assert_eq!(sb.min_member_len(), m.len());
    // Writing it again keeps version 1 and writes the front only.
    let newer = Superblock {
        events: 8,
        ..sb.clone()
    };
    let f = FaultyMember::new(m.duplicate());
    newer.write_to(&f).unwrap();
    assert_eq!((f.counts().writes, f.counts().syncs), (2, 2));
    let (back, _) = Superblock::read_from(&f).unwrap();
    assert_eq!((back.version, back.events), (1, 8));
    let image = f.crash_image().unwrap().snapshot();
    assert_eq!(
        image[e0 as usize..e0 as usize + SUPERBLOCK_SIZE],
        foreign.encode(),
        "the v1 data area at the end is untouched"
    );
}

#[test]
fn a_version_1_superblock_at_the_end_is_not_an_end_copy() {
    let m = member();
    let [e0, e1] = end_offsets(m.len()).unwrap();
    m.write_at(&sample_v1(3).encode(), e0).unwrap();
    m.write_at(&sample_v1(3).encode(), e1).unwrap();
    assert!(matches!(
        Superblock::read_from(&m),
        Err(SuperblockError::Invalid { .. })
    ));
}

/// A crash during a superblock update, with the disk keeping any subset of
/// the unsynced sectors, always leaves a readable copy, old or new, whichever
/// of the four writes was in flight; the copies not yet reached are intact.
#[test]
fn crash_during_update_always_leaves_a_valid_copy() {
    for in_flight in 0..4usize {
        // old kept, new kept, the copy in flight torn
        let mut outcomes = [0usize; 3];
        for seed in 0..150 {
            let m = FaultyMember::new(member());
            sample(5).write_to(&m).unwrap();
            m.fail_after(in_flight as u64, Ops::SYNCS);
            assert!(
                sample(6).write_to(&m).is_err(),
                "sync fails, so write_to does"
            );
            let image = m.crash_image_random(seed).unwrap();
            let (back, verdict) = Superblock::read_from(&image).unwrap_or_else(|e| {
                panic!("copy {in_flight} in flight, seed {seed}: no readable copy: {e}")
            });
            for copy in 0..4 {
                let state = verdict.copies[copy];
                if copy < in_flight {
                    assert_eq!(back.events, 6, "copy {copy} was synced new");
                    assert_eq!(state, Good, "synced copy {copy}");
                } else if copy > in_flight {
                    let want = if back.events == 5 { Good } else { Stale };
                    assert_eq!(state, want, "copy {copy} was never touched");
                }
            }
            match (back.events, verdict.copies[in_flight]) {
                (5, Good) => outcomes[0] += 1,
                (6, Good) => outcomes[1] += 1,
                (_, BadChecksum) => outcomes[2] += 1,
                (6, Stale) => outcomes[0] += 1,
                other => panic!("copy {in_flight} in flight, seed {seed}: {other:?}"),
            }
        }
        assert!(
            outcomes.iter().all(|&n| n > 0),
            "copy {in_flight} in flight: outcomes {outcomes:?}"
        );
    }
}

#[test]
fn new_for_create_and_for_slot() {
    let geometry = Geometry {
        level: Level::Raid6,
        members: 5,
        chunk: 65536,
        copies: 1,
        layout: Layout::LeftSymmetric,
    };
    let sb = Superblock::new_for_create("backup", &geometry, 8 << 20, 1 << 20).unwrap();
    assert_eq!(sb.group_count(), 8);
    assert_eq!(sb.slots, vec![SlotState::Active; 5]);
    assert_eq!(sb.validate(), Ok(()));
    assert_eq!(sb.level_code(), 6);
    let other = sb.for_slot(3);
    assert_eq!(other.slot, 3);
    assert_eq!(other.array_uuid, sb.array_uuid);
    assert_ne!(other.member_uuid, sb.member_uuid);
    assert!(Superblock::new_for_create(&"x".repeat(33), &geometry, 8 << 20, 1 << 20).is_err());
    assert!(Superblock::new_for_create("ok", &geometry, 1 << 40, 4096).is_err());
}

#[test]
fn serializes_to_json_for_examine() {
    let json = serde_json::to_value(sample(5)).unwrap();
    assert_eq!(json["events"], 5);
    assert_eq!(json["name"], "tank");
    assert_eq!(json["level"], "Raid5");
    assert_eq!(json["array_uuid"], Uuid::from_u128(0x1234).to_string());
}

/// The rows of the markdown table that follows `heading` in docs/format.md,
/// split into trimmed cells.
fn format_md_table(heading: &str) -> Vec<Vec<String>> {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/format.md"))
        .expect("docs/format.md");
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} missing"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // header and separator
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_string())
                .collect()
        })
        .collect()
}

/// docs/format.md's superblock table, checked against the bytes `encode`
/// writes: every row's offset and size, contiguous over the 4 KiB, named
/// fields holding their value and reserved bytes zero.
#[test]
fn format_md_superblock_table_matches_the_encoded_bytes() {
    let mut sb = sample(0x0102_0304_0506_0708);
    sb.features = Features {
        compat: 0x0a0b_0c0d_0e0f_1011,
        ro_compat: FEATURE_PPL,
        incompat: FEATURE_RESHAPE,
    };
    // A reshape from RAID1 on the three members, group 3 staged in slice 2.
    sb.reshape = Some(Reshape {
        from: GeometrySpec {
            level: Level::Raid1,
            layout: Layout::RightAsymmetric,
            chunk: sb.chunk,
            members: 3,
            copies: 3,
        },
        pending: vec![false, true, false, true],
        staging: 2,
        staged: Some(3),
    });
    assert_eq!(sb.validate(), Ok(()));
    sb.recovery_offset = 0x1111_2222_3333_4444;
    sb.state = ArrayState::Dirty;
    sb.scrub = Some(ScrubCheckpoint {
        repair: true,
        offset: 0x5555_6666_7777_8888,
    });
    let block = sb.encode();
    let le64 = |v: u64| v.to_le_bytes().to_vec();
    let le32 = |v: u32| v.to_le_bytes().to_vec();
    let mut name = b"tank".to_vec();
    name.resize(32, 0);
    let crc = crc32c::crc32c(&block[..4092]);
    let expected = |field: &str| -> Option<Vec<u8>> {
        Some(match field {
            "`magic`" => MAGIC.to_vec(),
            "`version`" => le32(FORMAT_VERSION),
            "`array_uuid`" => sb.array_uuid.as_bytes().to_vec(),
            "`member_uuid`" => sb.member_uuid.as_bytes().to_vec(),
            "`name`" => name.clone(),
            "`slot`" => le32(sb.slot),
            "`level`" => vec![5],
            "`layout`" => vec![2],
            "`state`" => vec![1],
            "`chunk`" => le64(sb.chunk),
            "`members`" => le32(sb.members),
            "`copies`" => le32(sb.copies),
            "`data_offset`" => le64(sb.data_offset),
            "`data_size`" => le64(sb.data_size),
            "`group_size`" => le64(sb.group_size),
            "`events`" => le64(sb.events),
            "`recovery_offset`" => le64(sb.recovery_offset),
            "`incompat`" => le64(FEATURE_RESHAPE),
            "`ro_compat`" => le64(FEATURE_PPL),
            "`compat`" => le64(sb.features.compat),
            "`ctime`" => le64(sb.ctime),
            "`utime`" => le64(sb.utime),
            "`group_count`" => le32(sb.groups.len() as u32),
            "`reshape_from_level`" => vec![1],
            "`reshape_from_layout`" => vec![1],
            "`reshape_from_members`" => le32(3),
            "`reshape_from_chunk`" => le64(sb.chunk),
            "`reshape_from_copies`" => le32(3),
            "`reshape_staging`" => le32(2),
            "`reshape_staged`" => le32(3),
            "`reshape_pending`" => {
                let mut bits = vec![0u8; 256];
                bits[0] = 0b1010;
                bits
            }
            "`scrub_kind`" => vec![2],
            "`scrub_offset`" => le64(0x5555_6666_7777_8888),
            "`crc`" => le32(crc),
            _ => return None,
        })
    };
    let rows = format_md_table("## Superblock (4096 bytes per copy)");
    let mut at = 0usize;
    for row in &rows {
        let offset: usize = row[0].parse().expect("offset");
        let size: usize = row[1].parse().expect("size");
        let field = row[2].as_str();
        assert_eq!(offset, at, "{field} starts where the row before ended");
        let bytes = &block[offset..offset + size];
        match field {
            "reserved" => assert!(bytes.iter().all(|&b| b == 0), "reserved at {offset}"),
            "slot table" => assert_eq!(&bytes[..4], &[1, 1, 2, 0]),
            "group table" => assert_eq!(&bytes[..5], &[1, 2, 0, 2, 0]),
            _ => {
                let want = expected(field).unwrap_or_else(|| panic!("unknown field {field}"));
                assert_eq!(bytes, &want[..], "{field} at {offset}+{size}");
            }
        }
        at = offset + size;
    }
    assert_eq!(at, SUPERBLOCK_SIZE, "the table covers the whole copy");
    assert!(rows.len() > 20, "{} rows", rows.len());
}

/// docs/format.md's member layout table and feature table name the offsets
/// and bits the code uses.
#[test]
fn format_md_member_layout_matches_the_code() {
    let rows = format_md_table("## Member layout");
    let offset_of = |region: &str| -> String {
        rows.iter()
            .find(|r| r[0] == region)
            .unwrap_or_else(|| panic!("no row {region}"))[1]
            .clone()
    };
    assert_eq!(
        offset_of("Superblock front copy 0"),
        SB_OFFSETS[0].to_string()
    );
    assert_eq!(
        offset_of("Superblock front copy 1"),
        SB_OFFSETS[1].to_string()
    );
    let m = member();
    let [e0, e1] = end_offsets(m.len()).unwrap();
    let end = member_end(m.len());
    assert_eq!(offset_of("Superblock end copy 0"), "`end - 8192`");
    assert_eq!(end - e0, 8192);
    assert_eq!(offset_of("Superblock end copy 1"), "`end - 4096`");
    assert_eq!(end - e1, 4096);
    assert_eq!(END_COPIES_LEN, 8192);
    assert_eq!(offset_of("Write-intent bitmap"), "65536 (`BITMAP_OFFSET`)");
    assert_eq!(
        offset_of("Probe block"),
        format!("{} (`PROBE_OFFSET`)", raidfs::array::host::PROBE_OFFSET)
    );
    assert_eq!(
        offset_of("Partial parity log"),
        format!("{} (`PPL_OFFSET`)", raidfs::array::ppl::PPL_OFFSET)
    );
    assert_eq!(offset_of("Data area"), "`data_offset` (1 MiB)");
    assert_eq!(DEFAULT_DATA_OFFSET, 1 << 20);
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/format.md"))
        .expect("docs/format.md");
    assert_eq!(TAIL_RESERVE, 1 << 20);
    assert!(doc.contains("tail reserve** of 1 MiB (`TAIL_RESERVE`"));
    assert!(doc.contains(&format!(
        "The superblock format version described here is **{FORMAT_VERSION}**"
    )));
    // Every known bit has its row (word, bit, mask, name) and no other
    // row names a bit.
    let features = format_md_table("### Feature words");
    let named: Vec<&Vec<String>> = features.iter().filter(|r| r[3] != "—").collect();
    let known = [
        ("compat", SUPERBLOCK_FEATURES.compat),
        ("ro_compat", SUPERBLOCK_FEATURES.ro_compat),
        ("incompat", SUPERBLOCK_FEATURES.incompat),
    ];
    let mut count = 0;
    for (word, bits) in known {
        for (bit, name) in bits {
            let row = named
                .iter()
                .find(|r| r[0] == format!("`{word}`") && r[1] == bit.trailing_zeros().to_string())
                .unwrap_or_else(|| panic!("no row for {word} bit {bit:#x}"));
            assert_eq!(row[2], format!("`{bit:#x}`"));
            assert_eq!(row[3], format!("`{name}`"));
            count += 1;
        }
    }
    assert_eq!(named.len(), count, "{named:?}");
    assert_eq!(FEATURE_PPL, 0x2);
    assert!(doc.contains(&format!(
        "`KNOWN_COMPAT = {KNOWN_COMPAT:#x}`, `KNOWN_RO_COMPAT = {KNOWN_RO_COMPAT:#x}`, `KNOWN_INCOMPAT = {KNOWN_INCOMPAT:#x}`"
    )));
}

/// docs/format.md's partial parity log tables, checked against the bytes
/// `Ppl` writes for a ring header and an entry.
#[test]
fn format_md_ppl_tables_match_the_log_bytes() {
    use raidfs::array::ppl::{Ppl, PPL_OFFSET};
    let ppl = Ppl::new(3, DEFAULT_DATA_OFFSET);
    let header = ppl.header();
    let rows = format_md_table("Ring header (512 bytes at member offset 131072)");
    assert_eq!(PPL_OFFSET, 131072);
    let mut at = 0;
    for row in &rows {
        let (offset, size): (usize, usize) = (row[0].parse().unwrap(), row[1].parse().unwrap());
        assert_eq!(offset, at, "{row:?}");
        let bytes = &header[offset..offset + size];
        match row[2].as_str() {
            "`magic`" => assert_eq!(bytes, b"RAIDPPLR"),
            "`epoch`" => assert_eq!(bytes, &1u64.to_le_bytes()),
            "reserved" => assert!(bytes.iter().all(|&b| b == 0)),
            "`crc`" => assert_eq!(bytes, &crc32c::crc32c(&header[..508]).to_le_bytes()),
            other => panic!("unknown ring header field {other}"),
        }
        at = offset + size;
    }
    assert_eq!(at, header.len());

    let pp = vec![0xABu8; 1000];
    let (offset, entry) = ppl
        .reserve(1, 7, 9, 512, &[0, 2], &pp)
        .expect("room in the ring");
    assert_eq!(offset, 131584, "the first entry follows the ring header");
    assert_eq!(entry.len(), 512 + 1024, "payload padded to 512 bytes");
    assert_eq!(&entry[512..1512], &pp[..]);
    assert!(entry[1512..].iter().all(|&b| b == 0));
    let mut covered = entry[..508].to_vec();
    covered.extend_from_slice(&pp);
    let rows = format_md_table("Entries follow from offset 131584");
    let mut at = 0;
    for row in &rows {
        let (offset, size): (usize, usize) = (row[0].parse().unwrap(), row[1].parse().unwrap());
        assert_eq!(offset, at, "{row:?}");
        let bytes = &entry[offset..offset + size];
        let want: Vec<u8> = match row[2].as_str() {
            "`magic`" => b"RAIDPPLE".to_vec(),
            "`epoch`" => 1u64.to_le_bytes().to_vec(),
            "`seq`" => 1u64.to_le_bytes().to_vec(),
            "`group`" => 7u32.to_le_bytes().to_vec(),
            "`stripe`" => 9u64.to_le_bytes().to_vec(),
            "`lo`" => 512u64.to_le_bytes().to_vec(),
            "`len`" => 1000u64.to_le_bytes().to_vec(),
            "`modified`" => {
                let mut mask = vec![0u8; 32];
                mask[0] = 0b101;
                mask
            }
            "reserved" => vec![0; size],
            "`crc`" => crc32c::crc32c(&covered).to_le_bytes().to_vec(),
            other => panic!("unknown entry field {other}"),
        };
        assert_eq!(bytes, &want[..], "{row:?}");
        at = offset + size;
    }
    assert_eq!(at, 512);
}

/// docs/format.md's bitmap header table, checked against the bytes the
/// bitmap writes, and its region rule against `region_size`.
#[test]
fn format_md_bitmap_table_matches_the_header_bytes() {
    use raidfs::array::bitmap::{region_size, Bitmap, Header, BITMAP_OFFSET};
    assert_eq!(BITMAP_OFFSET, 65536);
    let data_size = 10u64 << 30;
    let bitmap = Bitmap::new(DEFAULT_DATA_OFFSET, data_size);
    let region = region_size(data_size);
    assert_eq!(
        region,
        16 << 20,
        "doubled from 4 MiB until at most 1024 regions"
    );
    let bits = data_size.div_ceil(region);
    let block = bitmap.encode_header(0x0102_0304_0506_0708);
    assert_eq!(
        Header::decode(&block),
        Ok(Header {
            region_size: region,
            bits,
            events_cleared: 0x0102_0304_0506_0708,
        })
    );
    let rows = format_md_table("Header (4096 bytes at member offset 65536)");
    let mut at = 0;
    for row in &rows {
        let (offset, size): (usize, usize) = (row[0].parse().unwrap(), row[1].parse().unwrap());
        assert_eq!(offset, at, "{row:?}");
        let bytes = &block[offset..offset + size];
        let want: Vec<u8> = match row[2].as_str() {
            "`magic`" => b"RAIDBMP1".to_vec(),
            "`region_size`" => region.to_le_bytes().to_vec(),
            "`bits`" => bits.to_le_bytes().to_vec(),
            "`events_cleared`" => 0x0102_0304_0506_0708u64.to_le_bytes().to_vec(),
            "reserved" => vec![0; size],
            "`crc`" => crc32c::crc32c(&block[..4092]).to_le_bytes().to_vec(),
            other => panic!("unknown bitmap header field {other}"),
        };
        assert_eq!(bytes, &want[..], "{row:?}");
        at = offset + size;
    }
    assert_eq!(at, 4096, "the table covers the header block");
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/format.md"))
        .expect("docs/format.md");
    assert!(doc.contains("Bits block (4096 bytes at member offset 69632)"));
    // Bit b covers data_offset + b * region_size ..; bit b % 8 of byte b / 8.
    let first = DEFAULT_DATA_OFFSET + 9 * region;
    bitmap.begin_write(first, first + 1);
    let (offset, block, _) = bitmap.snapshot().expect("a bit to write");
    assert_eq!(offset, 69632);
    assert_eq!(block.len(), 4096);
    let mut want = vec![0u8; 4096];
    want[1] = 1 << 1;
    assert_eq!(block, want);
}
