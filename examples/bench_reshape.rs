//! Reshape speed against rebuild speed on the same array, in the same run:
//! a RAID1 of three image files, filled but for the one free group a
//! reshape moves through, first rebuilds one member, then reshapes to RAID5
//! (`raidfs grow --level 5`). Both figures are member bytes of allocated
//! groups per second, as `raidfs status` shows their progress. Usage
//! (release build, a directory on the disk to measure):
//!
//!     cargo run --release --example bench_reshape -- [DIR] [MEMBER_MIB]

use raidfs::array::{create, open_member, Array, CreateSpec, GROUP_SHIFT};
use raidfs::geometry::{Geometry, Layout, Level};
use raidfs::member::Member;
use raidfs::superblock::GroupProfile;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

fn mib_per_s(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / (1 << 20) as f64
}

fn drop_caches() {
    let _ = std::fs::write("/proc/sys/vm/drop_caches", "3");
}

/// Allocated groups' member bytes (what rebuild and reshape walk).
fn allocated_bytes(array: &Array) -> u64 {
    array.groups().len() as u64 * array.superblock().group_size
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .cloned()
            .unwrap_or_else(|| "/var/tmp/raidfs-bench-reshape".into()),
    );
    let member_mib: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    std::fs::create_dir_all(&dir)?;
    let paths: Vec<PathBuf> = (0..3).map(|i| dir.join(format!("m{i}.img"))).collect();
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let size = member_mib << 20;
    let members: Vec<(Arc<dyn Member>, String)> = paths
        .iter()
        .map(|p| Ok((open_member(p, Some(size))?, p.display().to_string())))
        .collect::<Result<_, raidfs::array::ArrayError>>()?;
    let array = Arc::new(create(members, &CreateSpec::new(Level::Raid1))?);
    array.start_background();
    array.set_speed_limits(Some(0), Some(0));
    // Fill every group but one (the reshape's staging group).
    let chunk: Vec<u8> = (0..4 << 20).map(|i| (i * 7 % 251) as u8).collect();
    while array.free_group_count() > 1 {
        let g = array.allocate_group(GroupProfile::Data)?;
        let base = u64::from(g) << GROUP_SHIFT;
        let cap = array.group_capacity(GroupProfile::Data);
        let mut off = 0;
        while off < cap {
            let n = (chunk.len() as u64).min(cap - off) as usize;
            array.write(base + off, &chunk[..n])?;
            off += n as u64;
        }
    }
    array.flush()?;
    let walked = allocated_bytes(&array);

    // Rebuild slot 2 onto a fresh image.
    let name = paths[2].display().to_string();
    array.fail(2)?;
    array.remove(&name)?;
    std::fs::remove_file(&paths[2])?;
    drop_caches();
    let t = Instant::now();
    array.add(open_member(&paths[2], Some(size))?, name)?;
    array.wait_background();
    array.flush()?;
    let rebuild = mib_per_s(walked, t.elapsed().as_secs_f64());

    // Reshape the same groups to RAID5.
    let now = array.data_geometry();
    let to = Geometry::new(
        Level::Raid5,
        now.members,
        now.chunk,
        1,
        Layout::LeftSymmetric,
    )?;
    drop_caches();
    let t = Instant::now();
    array.start_reshape(to)?;
    array.wait_background();
    let secs = t.elapsed().as_secs_f64();
    if array.reshape_counts().is_some() {
        return Err("the reshape did not finish".into());
    }
    let reshape = mib_per_s(walked, secs);
    array.mark_clean()?;

    println!(
        "members                     3 x {member_mib} MiB, {} MiB allocated per member",
        walked >> 20
    );
    println!("rebuild (RAID1, one member) {rebuild:8.1} MiB/s");
    println!(
        "reshape (RAID1 -> RAID5)    {reshape:8.1} MiB/s   ratio to rebuild {:.2}",
        reshape / rebuild
    );
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let _ = std::fs::remove_dir(&dir);
    Ok(())
}
