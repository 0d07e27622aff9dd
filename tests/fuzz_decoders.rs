//! Every decoder of on-disk bytes, driven by mutated valid encodings: bit
//! flips, overwritten bytes, truncations, extensions, length and count
//! fields set huge, bincode length prefixes forged. Most mutants are
//! re-sealed (checksums recomputed) so they reach the field checks behind
//! the checksum instead of stopping at it. No input may panic, allocate
//! without bound (a counting allocator refuses any single allocation over
//! [`ALLOC_LIMIT`]) or hang (a watchdog aborts a case running over
//! [`CASE_LIMIT`]); every rejection is an error with a message, and
//! whatever a decoder accepts is valid and encodes back to itself.
//!
//! `cargo test --test fuzz_decoders` runs a modest number of cases; the
//! long run is
//! `RAIDFS_FUZZ_CASES=1000000 cargo test --release --test fuzz_decoders -- --ignored`
//! (`RAIDFS_FUZZ_SEED` picks another sequence). A failure prints the
//! target, the case and the seed, which replay it.

use std::alloc::{GlobalAlloc, Layout as AllocLayout, System};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use raidfs::array::bitmap::Header as BitmapHeader;
use raidfs::array::ppl::{decode_ring, Ppl, PPL_OFFSET};
use raidfs::fs::ondisk;
use raidfs::geometry::{Layout, Level};
use raidfs::superblock::*;
use uuid::Uuid;

/// The largest single allocation a decoder may make. The biggest input is
/// a few KiB; anything near this means a length was trusted.
const ALLOC_LIMIT: usize = 64 << 20;
/// The longest one case may run (a hang, not a slow machine).
const CASE_LIMIT: Duration = Duration::from_secs(20);

struct Bounded;

static BIGGEST_REFUSED: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Bounded {
    unsafe fn alloc(&self, layout: AllocLayout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            // Null makes the caller report the failed allocation (and abort);
            // the size is kept for the message below.
            BIGGEST_REFUSED.fetch_max(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: AllocLayout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: AllocLayout) -> *mut u8 {
        if layout.size() > ALLOC_LIMIT {
            BIGGEST_REFUSED.fetch_max(layout.size(), Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: AllocLayout, new_size: usize) -> *mut u8 {
        if new_size > ALLOC_LIMIT {
            BIGGEST_REFUSED.fetch_max(new_size, Ordering::Relaxed);
            return std::ptr::null_mut();
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Bounded = Bounded;

/// xorshift64*: small, fast, and the same sequence everywhere.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.next().is_multiple_of(one_in)
    }
}

/// Values that break careless arithmetic and allocation.
const NASTY: [u64; 10] = [
    0,
    1,
    u64::MAX,
    u64::MAX - 1,
    1 << 63,
    u32::MAX as u64,
    i64::MAX as u64,
    1 << 32,
    4095,
    1 << 40,
];

/// Mutate `bytes` in place by one to four random edits.
fn mutate(rng: &mut Rng, bytes: &mut Vec<u8>) {
    for _ in 0..1 + rng.below(4) {
        let len = bytes.len();
        match rng.below(9) {
            0 | 1 if len > 0 => {
                let at = rng.below(len);
                bytes[at] ^= 1 << rng.below(8);
            }
            2 if len > 0 => {
                let at = rng.below(len);
                bytes[at] = rng.next() as u8;
            }
            3 => bytes.truncate(rng.below(len + 1)),
            4 => {
                let extra = rng.below(64);
                bytes.extend((0..extra).map(|_| rng.next() as u8));
            }
            5 if len >= 8 => {
                // A little-endian u64 or u32 field set to a nasty value.
                let at = rng.below(len - 7) & !3;
                let value = NASTY[rng.below(NASTY.len())];
                if rng.chance(2) {
                    bytes[at..at + 8].copy_from_slice(&value.to_le_bytes());
                } else {
                    bytes[at..at + 4].copy_from_slice(&(value as u32).to_le_bytes());
                }
            }
            6 if len >= 9 => {
                // A bincode varint length prefix forged huge: 253 then a u64.
                let at = rng.below(len - 8);
                bytes[at] = 253;
                let value = NASTY[rng.below(NASTY.len())] | 1 << rng.below(62);
                bytes[at + 1..at + 9].copy_from_slice(&value.to_le_bytes());
            }
            7 if len >= 5 => {
                let at = rng.below(len - 4);
                bytes[at] = 252;
                bytes[at + 1..at + 5].copy_from_slice(&u32::MAX.to_le_bytes());
            }
            _ if len > 1 => {
                // A slice repeated or cut out: shifts every later field.
                let a = rng.below(len);
                let b = a + rng.below(len - a);
                if rng.chance(2) {
                    let piece = bytes[a..b].to_vec();
                    bytes.splice(a..a, piece);
                } else {
                    bytes.drain(a..b);
                }
            }
            _ => bytes.push(rng.next() as u8),
        }
    }
}

fn crc32c_put(bytes: &mut [u8], covered: std::ops::Range<usize>, at: usize) {
    if bytes.len() >= at + 4 && covered.end <= bytes.len() {
        let crc = crc32c::crc32c(&bytes[covered]);
        bytes[at..at + 4].copy_from_slice(&crc.to_le_bytes());
    }
}

fn seeded(uuid: &[u8; 16], data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc32c::crc32c(uuid), data)
}

/// Valid encodings to start from.
struct Corpus {
    superblocks: Vec<Vec<u8>>,
    bitmap: Vec<u8>,
    ring: Vec<u8>,
    fs: ondisk::Samples,
}

fn superblock(version: u32, level: Level, features: Features) -> Superblock {
    let (members, copies) = match level {
        Level::Raid1 => (3, 3),
        Level::Raid10 => (4, 2),
        _ => (4, 1),
    };
    Superblock {
        version,
        array_uuid: Uuid::from_u128(0xfeed),
        member_uuid: Uuid::from_u128(0xbeef),
        name: "fuzz".into(),
        slot: 1,
        level,
        layout: Layout::LeftSymmetric,
        chunk: 64 << 10,
        members,
        copies,
        data_offset: DEFAULT_DATA_OFFSET,
        data_size: 6 * (8 << 20) + 4096,
        group_size: 8 << 20,
        events: 42,
        state: ArrayState::Dirty,
        recovery_offset: 1 << 20,
        features,
        ctime: 1_700_000_000,
        utime: 1_700_000_500,
        slots: (0..members)
            .map(|i| match i {
                1 => SlotState::Rebuilding,
                2 => SlotState::Faulty,
                _ => SlotState::Active,
            })
            .collect(),
        groups: vec![
            GroupProfile::Metadata,
            GroupProfile::Data,
            GroupProfile::Unallocated,
            GroupProfile::Data,
            GroupProfile::Data,
            GroupProfile::Unallocated,
        ],
        reshape: None,
        scrub: None,
    }
}

fn corpus() -> Corpus {
    let ppl = Features {
        ro_compat: FEATURE_PPL,
        ..Features::default()
    };
    let mut superblocks = Vec::new();
    for (version, level, features) in [
        (1, Level::Raid5, ppl),
        (2, Level::Raid6, Features::default()),
        (2, Level::Raid5, ppl),
        (3, Level::Raid10, Features::default()),
        (3, Level::Raid1, Features::default()),
        (
            3,
            Level::Raid5,
            Features {
                compat: 1 << 33,
                ro_compat: FEATURE_PPL | 1 << 9,
                incompat: 0,
            },
        ),
        (3, Level::Raid0, Features::default()),
    ] {
        let sb = superblock(version, level, features);
        assert_eq!(sb.validate(), Ok(()), "corpus superblock v{version}");
        superblocks.push(sb.encode().to_vec());
    }
    // A reshape under way: RAID5 from RAID1 of the same three members,
    // groups 1 and 3 still pending, group 3 staged in slice 2.
    let mut reshaping = superblock(3, Level::Raid5, Features::default());
    reshaping.features.incompat |= FEATURE_RESHAPE;
    reshaping.reshape = Some(Reshape {
        from: GeometrySpec {
            level: Level::Raid1,
            layout: reshaping.layout,
            chunk: reshaping.chunk,
            members: reshaping.members,
            copies: reshaping.members,
        },
        pending: vec![false, true, false, true, false, false],
        staging: 2,
        staged: Some(3),
    });
    assert_eq!(reshaping.validate(), Ok(()), "corpus reshape superblock");
    superblocks.push(reshaping.encode().to_vec());
    let bitmap = BitmapHeader {
        region_size: 4 << 20,
        bits: 100,
        events_cleared: 17,
    }
    .encode();
    let log = Ppl::new(3, DEFAULT_DATA_OFFSET);
    let mut ring = log.header();
    for (i, len) in [512usize, 1000, 4096].into_iter().enumerate() {
        let pp: Vec<u8> = (0..len).map(|b| (b * 7 + i) as u8).collect();
        let (offset, entry) = log
            .reserve(0, i as u32, 3 + i as u64, 512, &[0, 1 + i % 2], &pp)
            .expect("room in the ring");
        assert_eq!(offset, PPL_OFFSET + ring.len() as u64);
        ring.extend_from_slice(&entry);
    }
    ring.resize(ring.len() + 2048, 0);
    Corpus {
        superblocks,
        bitmap,
        ring,
        fs: ondisk::samples().expect("fs samples"),
    }
}

/// A rejection must say something. Returns false: nothing was accepted.
fn said<E: std::fmt::Display>(target: &str, err: E) -> bool {
    assert!(!err.to_string().trim().is_empty(), "{target}: empty error");
    false
}

fn superblock_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let mut block = corpus.superblocks[rng.below(corpus.superblocks.len())].clone();
    mutate(rng, &mut block);
    if !rng.chance(8) {
        crc32c_put(&mut block, 0..SUPERBLOCK_SIZE - 4, SUPERBLOCK_SIZE - 4);
    }
    match Superblock::decode(&block, "fuzz") {
        Ok(sb) => {
            assert_eq!(sb.validate(), Ok(()), "accepted means valid");
            let again = Superblock::decode(&sb.encode(), "fuzz").expect("re-encoded decodes");
            assert_eq!(again, sb, "accepted superblock round-trips");
            true
        }
        Err(e) => said("superblock", e),
    }
}

fn bitmap_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let mut block = corpus.bitmap.clone();
    mutate(rng, &mut block);
    if !rng.chance(8) {
        crc32c_put(&mut block, 0..4092, 4092);
    }
    match BitmapHeader::decode(&block) {
        Ok(h) => {
            assert_eq!(BitmapHeader::decode(&h.encode()), Ok(h));
            true
        }
        Err(e) => said("bitmap", e),
    }
}

fn ring_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let mut ring = corpus.ring.clone();
    // Mutate the header or one entry, then re-seal what was mutated.
    let entry_starts = [512usize, 1536, 3584];
    if rng.chance(4) {
        let mut head = ring[..512].to_vec();
        mutate(rng, &mut head);
        head.resize(512, 0);
        crc32c_put(&mut head, 0..508, 508);
        ring[..512].copy_from_slice(&head);
    } else if rng.chance(8) {
        mutate(rng, &mut ring);
    } else {
        let at = entry_starts[rng.below(entry_starts.len())];
        let mut entry = ring[at..at + 512].to_vec();
        mutate(rng, &mut entry);
        entry.resize(512, 0);
        let len = u64::from_le_bytes(entry[48..56].try_into().expect("8 bytes"));
        let pp_end = (at + 512).saturating_add(usize::try_from(len).unwrap_or(usize::MAX));
        if pp_end <= ring.len() {
            let mut covered = entry[..508].to_vec();
            covered.extend_from_slice(&ring[at + 512..pp_end]);
            let crc = crc32c::crc32c(&covered);
            entry[508..].copy_from_slice(&crc.to_le_bytes());
        }
        ring[at..at + 512].copy_from_slice(&entry);
    }
    match decode_ring(&ring) {
        Ok((_, entries)) => {
            for e in &entries {
                assert!(e.modified.iter().all(|&i| i < 256));
                assert!(e.partial_parity.len() <= ring.len());
            }
            !entries.is_empty()
        }
        Err(e) => said("ppl ring", e),
    }
}

/// Recompute a header block's frame crc (when its length is in range)
/// and its feature words' crc.
fn reseal_header(block: &mut [u8]) {
    if block.len() >= 8 {
        let len = u32::from_le_bytes(block[0..4].try_into().expect("4 bytes")) as usize;
        if let Some(end) = 8usize.checked_add(len).filter(|&e| e <= block.len()) {
            let crc = crc32c::crc32c_append(crc32c::crc32c(&block[0..4]), &block[8..end]);
            block[4..8].copy_from_slice(&crc.to_le_bytes());
        }
    }
    if block.len() >= 4096 {
        crc32c_put(block, 4064..4092, 4092);
    }
}

fn header_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let mut block = corpus.fs.header_block.clone();
    if rng.chance(3) {
        // The bincode fields only, the frame re-made around them.
        let len = u32::from_le_bytes(block[0..4].try_into().expect("4 bytes")) as usize;
        let mut payload = block[8..8 + len].to_vec();
        mutate(rng, &mut payload);
        if payload.len() <= 4000 {
            block[..8 + len].fill(0);
            block[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            block[8..8 + payload.len()].copy_from_slice(&payload);
        }
    } else {
        mutate(rng, &mut block);
    }
    if !rng.chance(8) {
        reseal_header(&mut block);
    }
    match ondisk::header_block(&block) {
        Ok(version) => {
            assert!(version <= raidfs::fs::FORMAT_VERSION);
            true
        }
        Err(e) => said("fs header", e),
    }
}

fn record_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let s = &corpus.fs;
    if rng.chance(2) {
        let mut payload = s.record_payload.clone();
        mutate(rng, &mut payload);
        return match ondisk::record_payload(&payload) {
            Ok(_) => true,
            Err(e) => said("journal record payload", e),
        };
    }
    let mut rec = s.record.clone();
    mutate(rng, &mut rec);
    if !rng.chance(8) && rec.len() >= 24 {
        let len = u32::from_le_bytes(rec[4..8].try_into().expect("4 bytes")) as usize;
        if let Some(payload) = rec.get(24..24 + len) {
            let crc = seeded(&s.uuid, payload);
            rec[16..20].copy_from_slice(&crc.to_le_bytes());
        }
        let hcrc = seeded(&s.uuid, &rec[..20]);
        rec[20..24].copy_from_slice(&hcrc.to_le_bytes());
    }
    match ondisk::record(&s.uuid, &rec, s.record_seq) {
        Ok(_) => true,
        Err(e) => said("journal record", e),
    }
}

fn checkpoint_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let s = &corpus.fs;
    if rng.chance(2) {
        let mut payload = s.checkpoint_payload.clone();
        mutate(rng, &mut payload);
        return match ondisk::checkpoint_payload(&payload) {
            Ok(_) => true,
            Err(e) => said("checkpoint payload", e),
        };
    }
    let mut cp = s.checkpoint.clone();
    mutate(rng, &mut cp);
    if !rng.chance(8) && cp.len() >= 32 {
        let len = u64::from_le_bytes(cp[16..24].try_into().expect("8 bytes"));
        let payload = usize::try_from(len)
            .ok()
            .and_then(|len| cp.get(4096..4096usize.checked_add(len)?));
        if let Some(payload) = payload {
            let crc = seeded(&s.uuid, payload);
            cp[24..28].copy_from_slice(&crc.to_le_bytes());
        }
        let hcrc = seeded(&s.uuid, &cp[..28]);
        cp[28..32].copy_from_slice(&hcrc.to_le_bytes());
    }
    match ondisk::checkpoint(&s.uuid, &cp) {
        Ok(_) => true,
        Err(e) => said("checkpoint", e),
    }
}

fn tree_checkpoint_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let s = &corpus.fs;
    let mut block = s.tree_checkpoint.clone();
    mutate(rng, &mut block);
    if !rng.chance(8) && block.len() == 4096 {
        let crc = seeded(&s.uuid, &block[..4092]);
        block[4092..].copy_from_slice(&crc.to_le_bytes());
    }
    match ondisk::tree_checkpoint(&s.uuid, &block) {
        Ok(_) => true,
        Err(e) => said("tree checkpoint", e),
    }
}

fn tree_node_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let s = &corpus.fs;
    let (addr, sample) = &s.tree_nodes[rng.below(s.tree_nodes.len())];
    let mut block = sample.clone();
    mutate(rng, &mut block);
    if !rng.chance(8) {
        raidfs::fs::tree::node::reseal(&s.uuid, &mut block);
    }
    let addr = if rng.chance(16) { addr ^ 4096 } else { *addr };
    match ondisk::tree_node(&s.uuid, &block, addr) {
        Ok(_) => true,
        Err(e) => said("tree node", e),
    }
}

fn tree_entries_case(rng: &mut Rng, corpus: &Corpus) -> bool {
    let mut entries = corpus.fs.tree_entries.clone();
    for _ in 0..1 + rng.below(3) {
        let i = rng.below(entries.len());
        match rng.below(4) {
            0 => mutate(rng, &mut entries[i].0),
            1 => mutate(rng, &mut entries[i].1),
            2 => {
                entries.remove(i);
            }
            _ => {
                let copy = entries[i].clone();
                entries.insert(rng.below(entries.len() + 1), copy);
            }
        }
        if entries.is_empty() {
            break;
        }
    }
    match ondisk::tree_entries(&entries) {
        Ok(_) => true,
        Err(e) => said("tree entries", e),
    }
}

type Target = (&'static str, fn(&mut Rng, &Corpus) -> bool);

const TARGETS: [Target; 9] = [
    ("superblock", superblock_case),
    ("bitmap header", bitmap_case),
    ("ppl ring", ring_case),
    ("fs header", header_case),
    ("journal record", record_case),
    ("checkpoint", checkpoint_case),
    ("tree checkpoint", tree_checkpoint_case),
    ("tree node", tree_node_case),
    ("tree entries", tree_entries_case),
];

/// Run `cases` cases spread over the targets; each case's generator is
/// seeded from (seed, case), so one case replays alone.
fn run(cases: u64, seed: u64) {
    let corpus = corpus();
    // The samples decode as they are.
    for block in &corpus.superblocks {
        Superblock::decode(block, "sample").expect("sample superblock");
    }
    assert_eq!(
        ondisk::header_block(&corpus.fs.header_block).ok(),
        Some(raidfs::fs::FORMAT_VERSION)
    );
    let rec = ondisk::record(&corpus.fs.uuid, &corpus.fs.record, corpus.fs.record_seq)
        .expect("sample record");
    let cp = ondisk::checkpoint(&corpus.fs.uuid, &corpus.fs.checkpoint).expect("sample checkpoint");
    assert_eq!(rec, cp, "the checkpoint holds what the record made");
    assert_eq!((cp.inodes, cp.dir_entries), (4, 3));
    assert_eq!(
        ondisk::tree_checkpoint(&corpus.fs.uuid, &corpus.fs.tree_checkpoint).ok(),
        Some(9)
    );
    for (addr, block) in &corpus.fs.tree_nodes {
        ondisk::tree_node(&corpus.fs.uuid, block, *addr).expect("sample tree node");
    }
    assert_eq!(
        ondisk::tree_entries(&corpus.fs.tree_entries).expect("sample tree entries"),
        cp,
        "the tree's entries hold what the checkpoint holds"
    );
    assert_eq!(decode_ring(&corpus.ring).expect("sample ring").1.len(), 3);
    // The same bytes every time, so (seed, case) replays a case.
    let again = ondisk::samples().expect("fs samples");
    assert!(again.record == corpus.fs.record && again.checkpoint == corpus.fs.checkpoint);

    // Watchdog: a case that runs too long is a hang; abort with its number.
    let started = std::sync::Arc::new(AtomicU64::new(u64::MAX));
    let current = std::sync::Arc::new(AtomicU64::new(0));
    let epoch = Instant::now();
    {
        let (started, current) = (started.clone(), current.clone());
        std::thread::spawn(move || loop {
            std::thread::sleep(Duration::from_millis(500));
            let at = started.load(Ordering::Acquire);
            if at != u64::MAX
                && epoch.elapsed().as_millis() as u64 > at + CASE_LIMIT.as_millis() as u64
            {
                eprintln!(
                    "fuzz case {} (seed {seed:#x}) ran over {CASE_LIMIT:?}: a hang",
                    current.load(Ordering::Acquire)
                );
                std::process::abort();
            }
        });
    }
    let mut per_target = [0u64; TARGETS.len()];
    let mut accepted = [0u64; TARGETS.len()];
    let begin = Instant::now();
    for case in 0..cases {
        let mut rng = Rng(seed ^ case.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let which = rng.below(TARGETS.len());
        let (name, target) = TARGETS[which];
        current.store(case, Ordering::Release);
        started.store(epoch.elapsed().as_millis() as u64, Ordering::Release);
        let outcome = catch_unwind(AssertUnwindSafe(|| target(&mut rng, &corpus)));
        started.store(u64::MAX, Ordering::Release);
        match outcome {
            Ok(taken) => accepted[which] += u64::from(taken),
            Err(panic) => {
                eprintln!("fuzz case {case} ({name}, seed {seed:#x}) panicked");
                std::panic::resume_unwind(panic);
            }
        }
        per_target[which] += 1;
    }
    assert_eq!(BIGGEST_REFUSED.load(Ordering::Relaxed), 0);
    let summary: Vec<String> = TARGETS
        .iter()
        .zip(per_target.iter().zip(accepted))
        .map(|((name, _), (n, ok))| format!("{name} {n} ({ok} accepted)"))
        .collect();
    eprintln!(
        "{cases} fuzz cases (seed {seed:#x}) in {:.1?}: {}",
        begin.elapsed(),
        summary.join(", ")
    );
    assert!(per_target.iter().all(|&n| n > 0 || cases < 100));
}

fn env_u64(name: &str) -> Option<u64> {
    let value = std::env::var(name).ok()?;
    let value = value.trim();
    match value.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => value.parse().ok(),
    }
}

const DEFAULT_SEED: u64 = 0x005e_ed0a_1df5;

#[test]
fn decoders_survive_mutated_encodings() {
    let cases = env_u64("RAIDFS_FUZZ_CASES").unwrap_or(20_000);
    run(
        cases.min(100_000),
        env_u64("RAIDFS_FUZZ_SEED").unwrap_or(DEFAULT_SEED),
    );
}

/// The long run: a million cases unless `RAIDFS_FUZZ_CASES` says otherwise.
#[test]
#[ignore = "long: run with --release --ignored"]
fn decoders_survive_a_million_mutated_encodings() {
    let cases = env_u64("RAIDFS_FUZZ_CASES").unwrap_or(1_000_000);
    run(cases, env_u64("RAIDFS_FUZZ_SEED").unwrap_or(DEFAULT_SEED));
}
