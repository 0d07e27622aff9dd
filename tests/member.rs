//! Member devices: image files (locking, symlinks, O_DIRECT, sparse create),
//! the in-memory member, and fault and crash injection.

use raidfs::member::faulty::{FaultyMember, Ops, SECTOR};
use raidfs::member::file::{FileMember, OpenOptions};
use raidfs::member::memory::MemoryMember;
use raidfs::member::Member;
use rand::{Rng, SeedableRng};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::sync::Arc;

fn direct() -> OpenOptions {
    OpenOptions {
        direct: true,
        ..OpenOptions::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------- FileMember

#[test]
fn create_makes_a_sparse_image_and_refuses_existing_paths() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m0.img");
    let size = 1u64 << 30;
    let m = FileMember::create(&path, size).unwrap();
    assert_eq!(m.len(), size);
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), size);
    assert!(meta.blocks() * 512 < 1 << 20, "image is not sparse");
    let mut buf = vec![0xffu8; 4096];
    m.read_at(&mut buf, size - 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 0));
    drop(m);
    let err = FileMember::create(&path, 4096)
        .err()
        .expect("O_EXCL create");
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    assert!(err.to_string().contains("m0.img"), "{err}");
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        size,
        "existing file untouched"
    );
}

#[test]
fn write_read_round_trip_and_bounds() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.img");
    let m = FileMember::create(&path, 64 * 1024).unwrap();
    let data = pattern(10_000, 7);
    m.write_at(&data, 123).unwrap();
    m.sync().unwrap();
    let mut back = vec![0u8; data.len()];
    m.read_at(&mut back, 123).unwrap();
    assert_eq!(back, data);
    let err = m.read_at(&mut [0u8; 2], 64 * 1024 - 1).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("m.img"), "{err}");
    assert!(m.write_at(&[1u8; 2], 64 * 1024 - 1).is_err());
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        64 * 1024,
        "no growth"
    );
    assert_eq!(m.name(), path.display().to_string());
}

#[test]
fn vectored_writes_land_one_after_another_on_every_kind_of_member() {
    let dir = tempfile::tempdir().unwrap();
    let size = 8u64 << 20;
    let buffered = FileMember::create(dir.path().join("b.img"), size).unwrap();
    let direct_path = dir.path().join("d.img");
    drop(FileMember::create(&direct_path, size).unwrap());
    let direct = FileMember::open(&direct_path, direct()).unwrap();
    let memory = MemoryMember::new(size).unwrap();
    // Uneven parts (one empty), more than one page each, from one buffer
    // at unaligned places, as a full-stripe write passes them.
    let source = pattern(700_000, 9);
    let parts: Vec<&[u8]> = vec![
        &source[5..65_541],
        &source[100_000..100_000],
        &source[200_001..462_145],
        &source[500_000..700_000],
    ];
    let expected: Vec<u8> = parts.concat();
    let members: [&dyn Member; 3] = [&buffered, &direct, &memory];
    for m in members {
        m.write_vectored_at(&parts, 1 << 20).unwrap();
        let mut back = vec![0u8; expected.len() + 8192];
        m.read_at(&mut back, (1 << 20) - 4096).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0), "{}: before", m.name());
        assert!(
            back[4096..4096 + expected.len()] == expected[..],
            "{}",
            m.name()
        );
        assert!(
            back[4096 + expected.len()..].iter().all(|&b| b == 0),
            "{}: after",
            m.name()
        );
        let beyond = m.write_vectored_at(&parts, size - 4096);
        assert!(beyond.is_err(), "{}: a write past the end", m.name());
    }
}

#[test]
fn short_file_reads_fail_instead_of_returning_zeros() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("short.img");
    std::fs::write(&path, pattern(1000, 1)).unwrap();
    let m = FileMember::open(&path, OpenOptions::default()).unwrap();
    assert_eq!(m.len(), 1000);
    let mut buf = vec![0u8; 4096];
    assert_eq!(
        m.read_at(&mut buf, 0).unwrap_err().kind(),
        io::ErrorKind::UnexpectedEof
    );
    let mut exact = vec![0u8; 1000];
    m.read_at(&mut exact, 0).unwrap();
    assert_eq!(exact, pattern(1000, 1));
}

#[test]
fn a_second_open_is_refused_while_locked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("locked.img");
    let first = FileMember::create(&path, 8192).unwrap();
    let err = FileMember::open(&path, OpenOptions::default())
        .err()
        .expect("second open of a locked member");
    assert!(
        err.to_string()
            .contains("is in use by another raidfs process"),
        "{err}"
    );
    assert!(err.to_string().contains("locked.img"), "{err}");
    // Inspection without the lock still works.
    let peek = FileMember::open(
        &path,
        OpenOptions {
            lock: false,
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    drop(peek);
    drop(first);
    FileMember::open(&path, OpenOptions::default()).expect("lock released on drop");
}

/// Large buffered writes hand their ranges to a write-behind thread that
/// holds the file open; dropping the member must still close it at once,
/// or an array could not be assembled again right after it was stopped.
#[test]
fn the_lock_is_released_on_drop_after_large_buffered_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("busy.img");
    for round in 0..20u8 {
        let m = if round == 0 {
            FileMember::create(&path, 8 << 20).unwrap()
        } else {
            FileMember::open(&path, OpenOptions::default())
                .unwrap_or_else(|e| panic!("round {round}: reopen right after drop: {e}"))
        };
        let data = pattern(1 << 20, round);
        for i in 0..4u64 {
            m.write_at(&data, i << 20).unwrap();
        }
        m.write_vectored_at(&[&data[..1 << 19], &data[1 << 19..]], 4 << 20)
            .unwrap();
        let mut back = vec![0u8; 1 << 20];
        m.read_at(&mut back, 4 << 20).unwrap();
        assert_eq!(back, data, "round {round}");
        drop(m);
    }
}

/// `len` bytes of `data` at a 4096-aligned address inside `storage`.
fn aligned<'a>(storage: &'a mut Vec<u8>, data: &[u8]) -> &'a [u8] {
    storage.resize(data.len() + 4096, 0);
    let at = storage.as_ptr().align_offset(4096);
    storage[at..at + data.len()].copy_from_slice(data);
    &storage[at..at + data.len()]
}

/// Whether `dir` is on a tmpfs, whose "direct" writes land in the page
/// cache like any other.
fn on_tmpfs(dir: &std::path::Path) -> bool {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: c is a valid C string; statfs fills st on success.
    let rc = unsafe { libc::statfs(c.as_ptr(), st.as_mut_ptr()) };
    assert_eq!(rc, 0, "statfs {}", dir.display());
    // SAFETY: rc == 0.
    unsafe { st.assume_init() }.f_type == libc::TMPFS_MAGIC
}

/// A new 8 MiB buffered image under /var/tmp (its directory, kept alive by
/// the caller), and whether its page cache can be told apart (not tmpfs).
fn image_on_disk() -> (tempfile::TempDir, FileMember, bool) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let checks_cache = !on_tmpfs(dir.path());
    let m = FileMember::create(dir.path().join("m.img"), 8 << 20).unwrap();
    (dir, m, checks_cache)
}

/// Whether all of `[at, at + len)` of `m` is in the host's page cache.
fn is_cached(m: &FileMember, at: u64, len: usize) -> bool {
    let mut buf = vec![0u8; len];
    m.read_cached(&mut buf, at).unwrap()
}

/// A buffered image writes large aligned requests around the host's page
/// cache (nothing of them is left cached) and everything else into it, and
/// the two kinds of write see each other in every order.
#[test]
fn large_aligned_writes_of_a_buffered_image_bypass_the_page_cache() {
    let (_dir, m, checks_cache) = image_on_disk();
    let mib = 1usize << 20;
    let cached = |at: u64, len: usize| is_cached(&m, at, len);
    let read = |at: u64, len: usize| {
        let mut buf = vec![0u8; len];
        m.read_at(&mut buf, at).unwrap();
        buf
    };

    // A small buffered write first, then a large aligned one over it:
    // the large one wins, and leaves nothing in the page cache.
    let small = pattern(4096, 1);
    m.write_at(&small, (1 << 20) + 8192).unwrap();
    let big = pattern(mib, 2);
    let mut storage = Vec::new();
    m.write_at(aligned(&mut storage, &big), 1 << 20).unwrap();
    if checks_cache {
        assert!(
            !cached(1 << 20, mib),
            "a large aligned write went through the page cache"
        );
    }
    assert_eq!(read(1 << 20, mib), big);

    // A small write after it lands on top.
    m.write_at(&small, (1 << 20) + 8192).unwrap();
    let mut expect = big.clone();
    expect[8192..8192 + 4096].copy_from_slice(&small);
    assert_eq!(read(1 << 20, mib), expect);

    // Vectored, every part aligned: around the cache too.
    let (a, b) = (pattern(mib / 2, 3), pattern(mib / 2, 4));
    let (mut sa, mut sb) = (Vec::new(), Vec::new());
    m.write_vectored_at(&[aligned(&mut sa, &a), aligned(&mut sb, &b)], 4 << 20)
        .unwrap();
    if checks_cache {
        assert!(
            !cached(4 << 20, mib),
            "an aligned vectored write was cached"
        );
    }
    assert_eq!(read(4 << 20, mib / 2), a);
    assert_eq!(read((4 << 20) + (mib / 2) as u64, mib / 2), b);

    // Unaligned (buffer one byte off) or small: into the page cache.
    let mut odd = vec![0u8; mib + 1];
    odd[1..].copy_from_slice(&pattern(mib, 5));
    m.write_at(&odd[1..], 6 << 20).unwrap();
    let small_big = pattern(128 << 10, 6);
    m.write_at(aligned(&mut storage, &small_big), 2 << 20)
        .unwrap();
    if checks_cache {
        assert!(
            cached(6 << 20, mib),
            "an unaligned write bypassed the cache"
        );
        assert!(
            cached(2 << 20, 128 << 10),
            "a small write bypassed the cache"
        );
    }
    assert_eq!(read(6 << 20, mib), pattern(mib, 5));
    assert_eq!(read(2 << 20, 128 << 10), small_big);
    m.sync().unwrap();
}

/// Aligned writes under 1 MiB, such as the 256 KiB member parts of a
/// RAID5/6 full-stripe write, go through the page cache (the host then
/// allocates the image's blocks at writeback); 1 MiB, whole or in parts of
/// one vectored write, goes around it; a sync changes neither.
#[test]
fn aligned_writes_under_a_mebibyte_go_through_the_page_cache() {
    let (_dir, m, checks_cache) = image_on_disk();
    let quarter = 256usize << 10;
    let mut storage = Vec::new();
    let mut write = |at: u64, len: usize, seed: u8| {
        let data = pattern(len, seed);
        m.write_at(aligned(&mut storage, &data), at).unwrap();
        data
    };
    let a = write(0, quarter, 1);
    let b = write(1 << 20, (1 << 20) - 4096, 2);
    m.sync().unwrap();
    let c = write(2 << 20, 1 << 20, 3);
    let d = write(4 << 20, quarter, 4);
    if checks_cache {
        assert!(
            is_cached(&m, 0, quarter),
            "a 256 KiB part went around the cache"
        );
        assert!(
            is_cached(&m, 1 << 20, (1 << 20) - 4096),
            "a part one block short of 1 MiB went around the cache"
        );
        assert!(!is_cached(&m, 2 << 20, 1 << 20), "a 1 MiB part was cached");
        assert!(
            is_cached(&m, 4 << 20, quarter),
            "a 256 KiB part after a sync went around the cache"
        );
    }
    // Every write reads back, whichever way it went.
    for (at, data) in [(0u64, a), (1 << 20, b), (2 << 20, c), (4 << 20, d)] {
        let mut back = vec![0u8; data.len()];
        m.read_at(&mut back, at).unwrap();
        assert!(back == data, "bytes at {at:#x}");
    }
    m.sync().unwrap();
}

/// A large read of a range the host has nothing of cached goes around the
/// cache (and leaves nothing there, parity between data chunks included);
/// a range with cached bytes, clean or dirty, is read through the cache,
/// so the read sees them; unaligned buffers get the same bytes.
#[test]
fn cold_large_reads_of_a_buffered_image_bypass_the_page_cache() {
    let (_dir, m, checks_cache) = image_on_disk();
    let mib = 1usize << 20;
    let cached = |at: u64, len: usize| is_cached(&m, at, len);
    // Written around the cache: nothing of it is cached.
    let big = pattern(4 * mib, 7);
    let mut storage = Vec::new();
    m.write_at(aligned(&mut storage, &big), 0).unwrap();
    m.sync().unwrap();
    for (at, len) in [
        (0usize, mib),
        (mib, 64 << 10),
        (2 * mib + 4096, 2 * mib - 8192),
    ] {
        // An unaligned destination, as the filesystem's buffers are.
        let mut back = vec![0u8; len + 1];
        m.read_at(&mut back[1..], at as u64).unwrap();
        assert!(back[1..] == big[at..at + len], "read at {at}");
        if checks_cache {
            assert!(
                !cached(at as u64, len),
                "a cold read at {at} filled the page cache"
            );
        }
    }
    // A dirty 4 KiB block inside a large range: read through the cache.
    let small = pattern(4096, 8);
    m.write_at(&small, (mib + 8192) as u64).unwrap();
    let mut back = vec![0u8; mib];
    m.read_at(&mut back, mib as u64).unwrap();
    let mut expect = big[mib..2 * mib].to_vec();
    expect[8192..8192 + 4096].copy_from_slice(&small);
    assert!(back == expect, "a read missed a dirty cached block");
    // Small reads keep the host's readahead.
    let mut four = vec![0u8; 4096];
    m.read_at(&mut four, (3 * mib) as u64).unwrap();
    assert!(four[..] == big[3 * mib..3 * mib + 4096]);
    if checks_cache {
        assert!(
            cached((3 * mib) as u64, 4096),
            "a small read bypassed the cache"
        );
    }
}

#[test]
fn symlinks_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("real.img");
    let link = dir.path().join("link.img");
    drop(FileMember::create(&target, 8192).unwrap());
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = FileMember::open(&link, OpenOptions::default())
        .err()
        .expect("symlink must be refused");
    assert!(err.to_string().contains("symbolic link"), "{err}");
    assert!(err.to_string().contains("link.img"), "{err}");
}

#[test]
fn descriptors_are_close_on_exec_and_direct_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("flags.img");
    let m = FileMember::create(&path, 8192).unwrap();
    let fd = m.as_raw_fd();
    // SAFETY: fcntl queries on a descriptor the member keeps open.
    let (fd_flags, fl_flags) = unsafe {
        (
            libc::fcntl(fd, libc::F_GETFD),
            libc::fcntl(fd, libc::F_GETFL),
        )
    };
    assert_ne!(fd_flags & libc::FD_CLOEXEC, 0);
    assert_eq!(fl_flags & libc::O_DIRECT, 0);
    drop(m);
    let m = FileMember::open(&path, direct()).unwrap();
    assert!(m.is_direct());
    // SAFETY: as above.
    let fl_flags = unsafe { libc::fcntl(m.as_raw_fd(), libc::F_GETFL) };
    assert_ne!(fl_flags & libc::O_DIRECT, 0);
}

#[test]
fn direct_io_refuses_sizes_that_are_not_block_multiples() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("odd.img");
    std::fs::write(&path, vec![0u8; 5000]).unwrap();
    let err = FileMember::open(&path, direct()).err().expect("odd size");
    assert!(err.to_string().contains("4096"), "{err}");
}

/// Random unaligned reads and writes through O_DIRECT agree with a model, and
/// the file read back through the page cache matches too.
#[test]
fn direct_io_handles_unaligned_buffers_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("direct.img");
    let size = 256 * 1024;
    drop(FileMember::create(&path, size as u64).unwrap());
    let m = FileMember::open(&path, direct()).unwrap();
    let mut model = vec![0u8; size];
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    // Backing storage one byte longer so slices can start at odd addresses.
    let mut storage = vec![0u8; 20_001];
    for round in 0..300 {
        let len = rng.gen_range(0..20_000);
        let offset = rng.gen_range(0..=size - len);
        let skew = rng.gen_range(0..2);
        let buf = &mut storage[skew..skew + len];
        if rng.gen_bool(0.5) {
            rng.fill(&mut buf[..]);
            m.write_at(buf, offset as u64).unwrap();
            model[offset..offset + len].copy_from_slice(buf);
        } else {
            m.read_at(buf, offset as u64).unwrap();
            assert!(buf[..] == model[offset..offset + len], "round {round}");
        }
    }
    m.sync().unwrap();
    drop(m);
    assert!(std::fs::read(&path).unwrap() == model);
}

/// Partial-block writers sharing blocks must not undo each other's bytes.
#[test]
fn concurrent_unaligned_direct_writes_do_not_lose_updates() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("rmw.img");
    drop(FileMember::create(&path, 16 * 4096).unwrap());
    let m = Arc::new(FileMember::open(&path, direct()).unwrap());
    let threads = 8usize;
    let piece = 512usize; // 8 writers share each 4 KiB block
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                for round in 0..100u8 {
                    for block in 0..16u64 {
                        let data = vec![round.wrapping_add(t as u8); piece];
                        m.write_at(&data, block * 4096 + (t * piece) as u64)
                            .unwrap();
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let mut all = vec![0u8; 16 * 4096];
    m.read_at(&mut all, 0).unwrap();
    for block in 0..16 {
        for t in 0..threads {
            let start = block * 4096 + t * piece;
            let expected = 99u8.wrapping_add(t as u8);
            assert!(
                all[start..start + piece].iter().all(|&b| b == expected),
                "block {block} writer {t} lost its last write"
            );
        }
    }
}

#[test]
fn directories_are_not_members() {
    let dir = tempfile::tempdir().unwrap();
    let err = FileMember::open(
        dir.path(),
        OpenOptions {
            read_only: true,
            ..OpenOptions::default()
        },
    )
    .err()
    .expect("a directory is not a member");
    assert!(
        err.to_string().contains(&dir.path().display().to_string()),
        "{err}"
    );
}

// -------------------------------------------------------------- MemoryMember

#[test]
fn memory_member_snapshot_duplicate_and_shared() {
    let m = MemoryMember::from_bytes(pattern(4096, 3)).with_name("mem");
    assert_eq!(m.len(), 4096);
    assert_eq!(m.name(), "mem");
    let copy = m.duplicate();
    let alias = m.shared();
    m.write_at(&[9, 9, 9], 10).unwrap();
    assert_eq!(&alias.snapshot()[10..13], &[9, 9, 9]);
    assert_eq!(copy.snapshot(), pattern(4096, 3));
    let err = m.read_at(&mut [0u8; 8], 4090).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("mem"));
    assert!(m.write_at(&[0u8; 8], u64::MAX - 2).is_err());
}

// -------------------------------------------------------------- FaultyMember

fn faulty(size: u64) -> FaultyMember {
    FaultyMember::memory(size, "f0").unwrap()
}

#[test]
fn fails_after_n_operations_of_the_chosen_kind() {
    let m = faulty(64 * 1024);
    m.fail_writes_after(3);
    for i in 0..3 {
        m.write_at(&[1u8; 10], i * 100).unwrap();
    }
    let err = m.write_at(&[1u8; 10], 0).unwrap_err();
    assert!(err.to_string().contains("injected write fault"), "{err}");
    assert!(err.to_string().contains("f0"), "{err}");
    assert!(m.write_at(&[1u8; 10], 0).is_err(), "stays failed");
    m.read_at(&mut [0u8; 10], 0).unwrap();
    m.sync().unwrap();
    let c = m.counts();
    assert_eq!((c.writes, c.failed_writes, c.reads, c.syncs), (5, 2, 1, 1));
    assert_eq!(c.bytes_written, 30);
    m.heal();
    m.write_at(&[1u8; 10], 0).unwrap();

    m.fail_after(2, Ops::READS_AND_WRITES);
    m.read_at(&mut [0u8; 4], 0).unwrap();
    m.write_at(&[0u8; 4], 0).unwrap();
    assert!(m.read_at(&mut [0u8; 4], 0).is_err());
    assert!(m.write_at(&[0u8; 4], 0).is_err());
    m.sync().unwrap();
}

#[test]
fn range_faults_hit_only_overlapping_operations() {
    let m = faulty(64 * 1024);
    m.fail_range(4096..8192, Ops::READS);
    m.read_at(&mut [0u8; 1], 4095).unwrap();
    assert!(m.read_at(&mut [0u8; 2], 4095).is_err());
    assert!(m.read_at(&mut [0u8; 1], 8191).is_err());
    m.read_at(&mut [0u8; 100], 8192).unwrap();
    m.write_at(&[5u8; 4096], 4096).unwrap();
    m.fail_range(0..10, Ops::WRITES);
    assert!(m.write_at(&[5u8; 1], 9).is_err());
    m.clear_ranges();
    let mut back = [0u8; 4096];
    m.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, [5u8; 4096]);
}

#[test]
fn pulling_a_member_from_another_thread_fails_it_mid_run() {
    let m = faulty(64 * 1024);
    let worker_side: Box<dyn Member> = Box::new(m.clone());
    let (to_main, from_worker) = crossbeam_channel::bounded::<()>(0);
    let (to_worker, from_main) = crossbeam_channel::bounded::<()>(0);
    let worker = std::thread::spawn(move || {
        for i in 0..10 {
            worker_side.write_at(&[i as u8; 512], i * 512).unwrap();
        }
        to_main.send(()).unwrap();
        from_main.recv().unwrap();
        let write = worker_side.write_at(&[1u8; 512], 0);
        let sync = worker_side.sync();
        (write.is_err(), sync.is_err())
    });
    from_worker.recv().unwrap();
    m.pull();
    assert!(m.is_pulled());
    to_worker.send(()).unwrap();
    assert_eq!(worker.join().unwrap(), (true, true));
    m.reinsert();
    m.write_at(&[1u8; 512], 0).unwrap();
    assert_eq!(m.counts().writes, 12);
}

#[test]
fn crash_image_keeps_exactly_the_synced_data() {
    let m = faulty(64 * 1024);
    let first = pattern(10_000, 1);
    m.write_at(&first, 1000).unwrap();
    m.sync().unwrap();
    let mut expected = vec![0u8; 64 * 1024];
    expected[1000..11_000].copy_from_slice(&first);
    // Unsynced: overlapping the synced data, and fresh ground.
    m.write_at(&pattern(3000, 2), 9000).unwrap();
    m.write_at(&pattern(700, 3), 40_000).unwrap();
    m.write_at(&pattern(100, 4), 9500).unwrap();
    assert_eq!(m.unsynced_writes(), 3);
    assert!(m.crash_image().unwrap().snapshot() == expected);
    // A failed sync makes nothing durable.
    m.fail_after(0, Ops::SYNCS);
    assert!(m.sync().is_err());
    assert!(m.crash_image().unwrap().snapshot() == expected);
    m.heal();
    m.sync().unwrap();
    let mut live = vec![0u8; 64 * 1024];
    m.read_at(&mut live, 0).unwrap();
    assert!(m.crash_image().unwrap().snapshot() == live);
    assert_eq!(m.unsynced_writes(), 0);
}

/// Random crash images keep each unsynced sector either old or new, depend
/// only on the seed, and over many seeds show whole, dropped and torn writes.
#[test]
fn random_crash_images_tear_at_sector_granularity() {
    let m = faulty(16 * 1024);
    m.write_at(&[0x11u8; 16 * 1024], 0).unwrap();
    m.sync().unwrap();
    let offset = 1000u64; // not sector aligned: the first and last sectors are partial
    let new = vec![0x22u8; 4000];
    m.write_at(&new, offset).unwrap();
    let end = offset + new.len() as u64;
    let mut saw = (false, false, false); // whole, dropped, torn
    for seed in 0..60 {
        let image = m.crash_image_random(seed).unwrap().snapshot();
        assert!(
            image == m.crash_image_random(seed).unwrap().snapshot(),
            "deterministic"
        );
        let mut kept_sectors = 0;
        let mut sectors = 0;
        let mut at = offset;
        while at < end {
            let piece_end = ((at / SECTOR + 1) * SECTOR).min(end);
            let piece = &image[at as usize..piece_end as usize];
            let kept = piece.iter().all(|&b| b == 0x22);
            assert!(
                kept || piece.iter().all(|&b| b == 0x11),
                "seed {seed}: sector torn inside"
            );
            kept_sectors += kept as usize;
            sectors += 1;
            at = piece_end;
        }
        assert!(image[..offset as usize].iter().all(|&b| b == 0x11));
        assert!(image[end as usize..].iter().all(|&b| b == 0x11));
        match kept_sectors {
            0 => saw.1 = true,
            n if n == sectors => saw.0 = true,
            _ => saw.2 = true,
        }
    }
    assert_eq!(saw, (true, true, true));
}

#[test]
fn crash_tracking_can_be_switched_off() {
    let m = faulty(4096);
    m.set_crash_tracking(false);
    m.write_at(&[7u8; 100], 0).unwrap();
    assert_eq!(m.unsynced_writes(), 0);
    assert_eq!(&m.crash_image().unwrap().snapshot()[..100], &[7u8; 100]);
}

#[test]
fn faulty_file_member_counts_and_forwards() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ff.img");
    let m = FaultyMember::new(FileMember::create(&path, 8192).unwrap());
    m.write_at(b"hello", 4096).unwrap();
    m.sync().unwrap();
    assert_eq!(m.len(), 8192);
    assert_eq!(m.name(), path.display().to_string());
    let on_disk = std::fs::read(&path).unwrap();
    assert_eq!(&on_disk[4096..4101], b"hello");
    let c = m.counts();
    assert_eq!((c.reads, c.writes, c.syncs), (0, 1, 1));
    m.reset_counts();
    assert_eq!(m.counts(), Default::default());
}

/// A durable write reads back on image files and, on the fault-injecting
/// member, survives a crash while the unsynced writes around it do not:
/// its range is synced, nothing else is.
#[test]
fn durable_writes_sync_their_range_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let file = FileMember::create(dir.path().join("d.img"), 256 * 1024).unwrap();
    let data = pattern(8192, 3);
    file.write_durable(&data, 4096).unwrap();
    assert!(file.write_durable(&data, 256 * 1024 - 100).is_err());
    let mut back = vec![0u8; data.len()];
    file.read_at(&mut back, 4096).unwrap();
    assert_eq!(back, data);

    let m = FaultyMember::memory(64 * 1024, "f").unwrap();
    let older = pattern(4096, 9);
    m.write_at(&older, 0).unwrap(); // unsynced, under the durable write
    m.write_at(&older, 32 * 1024).unwrap(); // unsynced, elsewhere
    let durable = pattern(2048, 5);
    m.write_durable(&durable, 1024).unwrap();
    let image = m.crash_image().unwrap();
    let mut got = vec![0u8; 4096];
    image.read_at(&mut got, 0).unwrap();
    let mut want = vec![0u8; 4096];
    want[1024..3072].copy_from_slice(&durable);
    assert_eq!(got, want, "only the durable range survives the crash");
    image.read_at(&mut got, 32 * 1024).unwrap();
    assert_eq!(got, vec![0u8; 4096], "the unsynced write elsewhere is lost");
}
