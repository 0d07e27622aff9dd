//! Rebuild speed against the ceiling it can approach: a durable copy of one
//! member image (`dd bs=1M conv=fsync`), measured in the same run on the
//! same disk; and a sequential reader's throughput idle and during the
//! rebuild. Usage (release build, a directory on the disk to measure):
//!
//!     cargo run --release --example bench_rebuild -- [DIR] [MEMBER_MIB]

use raidfs::array::{assemble, create, open_member, AssembleOptions, CreateSpec, GROUP_SHIFT};
use raidfs::geometry::Level;
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / (1 << 20) as f64
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Read every filled group sequentially in 1 MiB requests; MiB/s.
fn read_all(
    array: &raidfs::array::Array,
    bases: &[(u64, u64)],
    stop: Option<&AtomicBool>,
) -> Result<f64, raidfs::array::ArrayError> {
    let mut buf = vec![0u8; 1 << 20];
    let t = Instant::now();
    let mut bytes = 0u64;
    for (base, cap) in bases {
        let mut off = 0;
        while off + buf.len() as u64 <= *cap {
            if stop.is_some_and(|s| s.load(Ordering::Relaxed)) {
                return Ok(mib_per_s(bytes, t.elapsed().as_secs_f64()));
            }
            array.read(base + off, &mut buf)?;
            off += buf.len() as u64;
            bytes += buf.len() as u64;
        }
    }
    Ok(mib_per_s(bytes, t.elapsed().as_secs_f64()))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .cloned()
            .unwrap_or_else(|| "/var/tmp/raidfs-bench-rebuild".into()),
    );
    let member_mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1024);
    std::fs::create_dir_all(&dir)?;
    let paths: Vec<PathBuf> = (0..4).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let size = member_mib << 20;
    let members: Vec<(Arc<dyn Member>, String)> = paths
        .iter()
        .map(|p| Ok((open_member(p, Some(size))?, p.display().to_string())))
        .collect::<Result<_, raidfs::array::ArrayError>>()?;
    let array = Arc::new(create(members, &CreateSpec::new(Level::Raid5))?);
    // Fill every group with data, so the rebuild has everything to copy.
    let chunk = vec![0x5au8; 4 << 20];
    let mut bases = Vec::new();
    while let Ok(g) = array.allocate_group(GroupProfile::Data) {
        let base = (g as u64) << GROUP_SHIFT;
        let cap = array.group_capacity(GroupProfile::Data);
        let mut off = 0;
        while off < cap {
            let n = (chunk.len() as u64).min(cap - off) as usize;
            array.write(base + off, &chunk[..n])?;
            off += n as u64;
        }
        bases.push((base, cap));
    }
    array.mark_clean()?;
    drop(array);

    // Baseline: a durable copy of one member image.
    drop_caches();
    let copy = dir.join("copy.img");
    let t = Instant::now();
    let status = Command::new("dd")
        .arg(format!("if={}", paths[0].display()))
        .arg(format!("of={}", copy.display()))
        .args(["bs=1M", "conv=fsync", "status=none"])
        .status()?;
    let dd_secs = t.elapsed().as_secs_f64();
    std::fs::remove_file(&copy)?;
    if !status.success() {
        return Err("dd failed".into());
    }
    let dd_speed = mib_per_s(size, dd_secs);

    // Idle sequential reader through the engine.
    let survivors: Vec<(Arc<dyn Member>, String)> = paths[..3]
        .iter()
        .map(|p| Ok((open_member(p, None)?, p.display().to_string())))
        .collect::<Result<_, raidfs::array::ArrayError>>()?;
    let array = Arc::new(assemble(survivors, AssembleOptions::default())?.array);
    array.start_background();
    drop_caches();
    let idle_read = read_all(&array, &bases, None)?;

    // Rebuild onto a fresh image, alone.
    std::fs::remove_file(&paths[3])?;
    drop_caches();
    let t = Instant::now();
    array.add(
        open_member(&paths[3], Some(size))?,
        paths[3].display().to_string(),
    )?;
    array.wait_background();
    array.flush()?;
    let rebuild_secs = t.elapsed().as_secs_f64();
    let rebuilt = bases.len() as u64 * array.superblock().group_size;
    let rebuild_speed = mib_per_s(rebuilt, rebuild_secs);

    // Rebuild again with a sequential reader running.
    array.fail(3)?;
    array.remove(&paths[3].display().to_string())?;
    std::fs::remove_file(&paths[3])?;
    drop_caches();
    let t = Instant::now();
    array.add(
        open_member(&paths[3], Some(size))?,
        paths[3].display().to_string(),
    )?;
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (array, done, bases) = (Arc::clone(&array), Arc::clone(&done), bases.clone());
        std::thread::spawn(move || read_all(&array, &bases, Some(&done)))
    };
    array.wait_background();
    let busy_secs = t.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let busy_read = reader.join().map_err(|_| "reader panicked")??;
    let busy_rebuild = mib_per_s(rebuilt, busy_secs);
    array.mark_clean()?;

    println!(
        "member size                 {member_mib} MiB, {} MiB allocated per member",
        rebuilt >> 20
    );
    println!("dd bs=1M conv=fsync copy    {dd_speed:8.1} MiB/s");
    println!(
        "rebuild (idle)              {rebuild_speed:8.1} MiB/s   ratio to dd {:.2}",
        rebuild_speed / dd_speed
    );
    println!("sequential read (idle)      {idle_read:8.1} MiB/s");
    println!("rebuild (with reader)       {busy_rebuild:8.1} MiB/s");
    println!(
        "sequential read (rebuild)   {busy_read:8.1} MiB/s   ratio to idle {:.2}",
        busy_read / idle_read
    );
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir(Path::new(&dir));
    Ok(())
}
