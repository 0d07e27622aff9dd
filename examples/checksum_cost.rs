//! What data checksums cost: sequential write, overwrite and read of one
//! large file on a RAID5 array of in-memory members, with crc32c block
//! checksums and with them turned off at format time (same build, same
//! array), best of three rounds each.
//!
//! Run: `cargo run --release --example checksum_cost [FILE_MIB] [LEVEL] [MEMBERS]`
//! (defaults 512, 5, 4).

use std::ffi::OsStr;
use std::sync::Arc;
use std::time::Instant;

use raidfs::array::{create, CreateSpec};
use raidfs::fs::{
    ArrayStore, Caller, ChecksumKind, FileSystem, FormatOptions, FsOptions, ROOT_INO,
};
use raidfs::geometry::Level;
use raidfs::member::memory::MemoryMember;
use raidfs::member::Member;

const WRITE: usize = 1 << 20;
const READ: usize = 128 << 10;

struct Figures {
    write: f64,
    overwrite: f64,
    read: f64,
}

fn mib_s(bytes: u64, t: Instant) -> f64 {
    bytes as f64 / (1 << 20) as f64 / t.elapsed().as_secs_f64()
}

fn round(
    kind: ChecksumKind,
    level: Level,
    members: usize,
    file: u64,
) -> Result<Figures, Box<dyn std::error::Error>> {
    let member_size = file * 3 / (members as u64 - 1).max(1) + (256 << 20);
    let ms: Vec<(Arc<dyn Member>, String)> = (0..members)
        .map(|i| -> Result<_, std::io::Error> {
            Ok((
                Arc::new(MemoryMember::new(member_size)?) as Arc<dyn Member>,
                format!("mem{i}"),
            ))
        })
        .collect::<Result<_, _>>()?;
    let array = Arc::new(create(ms, &CreateSpec::new(level))?);
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    FileSystem::format_with(
        store.clone(),
        &FormatOptions {
            data_checksum: kind,
            ..Default::default()
        },
    )?;
    let fs = FileSystem::open(store, FsOptions::default())?;
    let ino = fs
        .mknod(&Caller::root(), ROOT_INO, OsStr::new("big"), 0o100644, 0, 0)?
        .ino;
    let buf: Vec<u8> = (0..WRITE).map(|i| (i * 7 + i / 4096) as u8).collect();

    let t = Instant::now();
    for off in (0..file).step_by(WRITE) {
        fs.write(ino, off, &buf)?;
    }
    fs.sync_all()?;
    let write = mib_s(file, t);

    let t = Instant::now();
    for off in (0..file).step_by(WRITE) {
        fs.write(ino, off, &buf)?;
    }
    fs.sync_all()?;
    let _first_overwrite = mib_s(file, t);

    // Measured on the second overwrite: the first one also pays for
    // allocating (zeroing) the groups copy-on-write needs.
    let t = Instant::now();
    for off in (0..file).step_by(WRITE) {
        fs.write(ino, off, &buf)?;
    }
    fs.sync_all()?;
    let overwrite = mib_s(file, t);

    let t = Instant::now();
    let mut sum = 0u64;
    for off in (0..file).step_by(READ) {
        let data = fs.read(ino, off, READ)?;
        sum = sum.wrapping_add(data[0] as u64);
    }
    let read = mib_s(file, t);
    std::hint::black_box(sum);
    fs.unmount()?;
    Ok(Figures {
        write,
        overwrite,
        read,
    })
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let file_mib: u64 = args.next().map(|a| a.parse()).transpose()?.unwrap_or(512);
    let level: Level = args
        .next()
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(Level::Raid5);
    let members: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(4);
    let file = file_mib << 20;
    println!(
        "{file_mib} MiB file, {level} on {members} in-memory members, 1 MiB writes, 128 KiB reads"
    );
    println!(
        "{:<10} {:>12} {:>12} {:>12}",
        "checksums", "write MiB/s", "rewrite MiB/s", "read MiB/s"
    );
    for (name, kind) in [
        ("off", ChecksumKind::None),
        ("crc32c", ChecksumKind::Crc32c),
    ] {
        let mut best = Figures {
            write: 0.0,
            overwrite: 0.0,
            read: 0.0,
        };
        for _ in 0..3 {
            let f = round(kind, level, members, file)?;
            best.write = best.write.max(f.write);
            best.overwrite = best.overwrite.max(f.overwrite);
            best.read = best.read.max(f.read);
        }
        println!(
            "{name:<10} {:>12.0} {:>12.0} {:>12.0}",
            best.write, best.overwrite, best.read
        );
    }
    Ok(())
}
