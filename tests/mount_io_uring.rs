//! `-o io_uring`: requests served over FUSE io_uring when the kernel offers
//! it, through `/dev/fuse` when it does not, with every byte kept either
//! way and the ring threads gone after the unmount.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::FileExt;
use std::path::Path;

use common::{fuse_available, mount_mem, pattern};
use raidfs::fuse::MountConfig;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// Puts the kernel's `enable_uring` back as it was.
struct Param(String);

impl Param {
    fn set(value: &str) -> Option<Param> {
        let old = fs::read_to_string(PARAM).ok()?;
        fs::write(PARAM, value).ok()?;
        Some(Param(old.trim().to_string()))
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let _ = fs::write(PARAM, &self.0);
    }
}

/// Context switches so far of this process's threads whose name starts
/// with `prefix`, and how many such threads there are.
fn switches(prefix: &str) -> (u64, usize) {
    let mut total = 0;
    let mut threads = 0;
    for task in fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !name.starts_with(prefix) {
            continue;
        }
        threads += 1;
        let status = fs::read_to_string(task.path().join("status")).unwrap_or_default();
        total += status
            .lines()
            .filter(|l| l.contains("ctxt_switches"))
            .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .sum::<u64>();
    }
    (total, threads)
}

/// Files from four threads at once, renamed, listed, read back and
/// removed, and a file larger than one request written and read in
/// requests of the largest size: the bytes and names must come back.
/// Returns the number of requests it made at least.
fn exercise(root: &Path) -> u64 {
    let dir = root.join("d");
    fs::create_dir(&dir).unwrap();
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let dir = &dir;
            s.spawn(move || {
                for i in 0..50u64 {
                    let seed = t * 50 + i;
                    fs::write(
                        dir.join(format!("f{t}-{i}")),
                        pattern(seed as u8, 3000 + i as usize),
                    )
                    .unwrap();
                }
            });
        }
    });
    for t in 0..4u64 {
        for i in (0..50u64).step_by(2) {
            fs::rename(dir.join(format!("f{t}-{i}")), dir.join(format!("g{t}-{i}"))).unwrap();
        }
    }
    let names: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let expected: BTreeSet<String> = (0..4u64)
        .flat_map(|t| {
            (0..50u64).map(move |i| format!("{}{t}-{i}", if i % 2 == 0 { "g" } else { "f" }))
        })
        .collect();
    assert_eq!(names, expected);
    for t in 0..4u64 {
        for i in 0..50u64 {
            let name = format!("{}{t}-{i}", if i % 2 == 0 { "g" } else { "f" });
            let bytes = fs::read(dir.join(&name)).unwrap();
            assert!(
                bytes == pattern((t * 50 + i) as u8, 3000 + i as usize),
                "{name} differs"
            );
            fs::remove_file(dir.join(&name)).unwrap();
        }
    }
    // 9 MiB in 1 MiB requests (the largest the mount takes) and one odd tail.
    let big = pattern(77, 9 * (1 << 20) + 12345);
    let file = fs::File::create(root.join("big")).unwrap();
    for (n, chunk) in big.chunks(1 << 20).enumerate() {
        file.write_all_at(chunk, (n << 20) as u64).unwrap();
    }
    file.sync_all().unwrap();
    drop(file);
    assert!(
        fs::read(root.join("big")).unwrap() == big,
        "the large file differs"
    );
    fs::remove_dir(&dir).unwrap();
    // Creates, writes, renames, reads, unlinks: well over one request each.
    200 * 4
}

#[test]
fn io_uring_serves_requests_when_offered_and_dev_fuse_otherwise() {
    if !fuse_available() {
        return;
    }
    if !Path::new(PARAM).exists() {
        eprintln!("skipping: this kernel has no FUSE over io_uring ({PARAM})");
        return;
    }
    let config = MountConfig {
        io_uring: true,
        threads: 4,
        ..MountConfig::default()
    };

    // Offered: the ring threads take the requests, not /dev/fuse's.
    let param = Param::set("Y").expect("set enable_uring");
    let (_, rings_before) = switches("fuser-ring");
    assert_eq!(rings_before, 0);
    let mount = mount_mem(&config);
    // The rings start with the session's threads, after the mount call
    // returns; until every CPU's queue has its entry, the kernel holds
    // requests back, so one answered request means they are up.
    fs::read_dir(mount.path())
        .expect("list the root")
        .for_each(drop);
    let (ring_start, rings) = switches("fuser-ring");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(rings >= cpus, "{rings} ring threads for {cpus} CPUs");
    let (dev_start, _) = switches("fuser-");
    let requests = exercise(mount.path());
    let (ring_end, _) = switches("fuser-ring");
    let (dev_end, _) = switches("fuser-");
    let ring = ring_end - ring_start;
    let dev = (dev_end - dev_start) - ring;
    assert!(
        ring >= requests,
        "ring threads switched {ring} times for {requests}+ requests"
    );
    // FORGET (after the unlinks) and INTERRUPT still come through
    // /dev/fuse; everything else goes to the rings.
    assert!(
        dev * 4 < ring,
        "/dev/fuse threads switched {dev} times, ring threads {ring}"
    );
    mount.unmount().expect("clean unmount");
    assert_eq!(
        switches("fuser-ring").1,
        0,
        "ring threads left after the unmount"
    );
    drop(param);

    // Not offered: the same through /dev/fuse, and no ring threads.
    let _param = Param::set("N").expect("clear enable_uring");
    let mount = mount_mem(&config);
    assert_eq!(switches("fuser-ring").1, 0);
    exercise(mount.path());
    mount.unmount().expect("clean unmount");
}
