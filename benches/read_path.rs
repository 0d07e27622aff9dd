//! CPU cost of the filesystem's read path, below FUSE and without a disk:
//! a RAID5 4+1 array on in-memory members, one 256 MiB file, and timed
//! random 4 KiB reads and sequential 128 KiB reads through `FileSystem::read`.
//! What a cold 4 KiB read costs in the daemon beyond the member `pread` is
//! this path plus FUSE, so changes to it are measured here without the
//! host's noise (`cargo bench --bench read_path`). Prints ns per read, the
//! median of five trials.

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Instant;

use raidfs::array::{create, CreateSpec};
use raidfs::fs::{ArrayStore, Caller, FileSystem, FormatOptions, FsOptions};
use raidfs::geometry::{Layout, Level};
use raidfs::member::memory::MemoryMember;
use raidfs::member::Member;

const MEMBER_SIZE: u64 = 160 << 20;
const FILE_SIZE: u64 = 256 << 20;
const TRIALS: usize = 5;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let members = (0..5)
        .map(|i| -> Result<(Arc<dyn Member>, String), std::io::Error> {
            Ok((Arc::new(MemoryMember::new(MEMBER_SIZE)?), format!("mem{i}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let spec = CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: 64 << 10,
        copies: 1,
        name: "bench".into(),
        ppl: false,
    };
    let array = Arc::new(create(members, &spec)?);
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    FileSystem::format_with(store.clone(), &FormatOptions::default())?;
    let fs = FileSystem::open(store, FsOptions::default())?;
    let root = Caller::root();
    let attr = fs.create(&root, 1, OsStr::new("data"), 0o644, 0, libc::O_RDWR)?;
    let chunk: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    for off in (0..FILE_SIZE).step_by(chunk.len()) {
        fs.write(attr.ino, off, &chunk)?;
    }
    fs.fsync(attr.ino, false)?;

    // A fixed xorshift sequence: every build reads the same offsets.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let blocks = FILE_SIZE / 4096;
    let offsets: Vec<u64> = (0..200_000)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % blocks) * 4096
        })
        .collect();
    let random = time_reads(&fs, attr.ino, &offsets, 4096)?;
    let sequential: Vec<u64> = (0..FILE_SIZE / (128 << 10))
        .map(|i| i * (128 << 10))
        .collect();
    let seq = time_reads(&fs, attr.ino, &sequential, 128 << 10)?;
    println!("random 4 KiB read      {random:8.0} ns/read (median of {TRIALS})");
    println!("sequential 128 KiB read {seq:8.0} ns/read (median of {TRIALS})");
    fs.unmount()?;
    Ok(())
}

fn time_reads(
    fs: &FileSystem,
    ino: u64,
    offsets: &[u64],
    size: usize,
) -> Result<f64, Box<dyn std::error::Error>> {
    let mut trials = Vec::with_capacity(TRIALS);
    for _ in 0..TRIALS {
        let started = Instant::now();
        for &off in offsets {
            let data = fs.read(ino, off, size)?;
            if data.len() != size {
                return Err(format!("short read at {off}: {} of {size}", data.len()).into());
            }
        }
        trials.push(started.elapsed().as_nanos() as f64 / offsets.len() as f64);
    }
    trials.sort_by(f64::total_cmp);
    Ok(trials[TRIALS / 2])
}
