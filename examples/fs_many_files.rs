//! Measures one directory with 100,000 files on an in-memory store: create,
//! list (readdir in batches by cookie), stat every name, unmount + open,
//! delete. Run: `cargo run --release --example fs_many_files [COUNT]`.

use std::ffi::OsString;
use std::sync::Arc;
use std::time::Instant;

use raidfs::fs::teststore::MemStore;
use raidfs::fs::{Caller, FileSystem, FsOptions, ROOT_INO};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let count: usize = std::env::args()
        .nth(1)
        .map(|a| a.parse())
        .transpose()?
        .unwrap_or(100_000);
    let store = Arc::new(MemStore::new(6, 128 << 20, 64 * 1024));
    FileSystem::format(store.clone())?;
    let mut fs = FileSystem::open(store.clone(), FsOptions::default())?;
    let c = Caller::root();
    let dir = fs
        .mkdir(&c, ROOT_INO, &OsString::from("many"), 0o755, 0)?
        .ino;
    let name = |i: usize| OsString::from(format!("file-{i:07}"));

    let t = Instant::now();
    for i in 0..count {
        fs.mknod(&c, dir, &name(i), 0o100644, 0, 0)?;
    }
    fs.sync_all()?;
    report("create + sync", count, t);

    let t = Instant::now();
    let (mut cookie, mut listed) = (0, 0);
    loop {
        let batch = fs.readdir(dir, cookie, 1024)?;
        let Some(last) = batch.last() else { break };
        cookie = last.cookie;
        listed += batch.len();
    }
    report("readdir", listed, t);

    let t = Instant::now();
    for i in 0..count {
        let a = fs.lookup(&c, dir, &name(i))?;
        fs.getattr(a.ino)?;
    }
    report("lookup + getattr", count, t);

    let t = Instant::now();
    fs.unmount()?;
    fs = FileSystem::open(store.clone(), FsOptions::default())?;
    report("unmount + open", 1, t);

    let t = Instant::now();
    for i in 0..count {
        fs.unlink(&c, dir, &name(i))?;
    }
    fs.sync_all()?;
    report("unlink + sync", count, t);
    fs.unmount()?;
    Ok(())
}

fn report(what: &str, n: usize, t: Instant) {
    let secs = t.elapsed().as_secs_f64();
    println!(
        "{what:>18}: {n:>7} in {secs:7.3} s ({:>10.0} /s)",
        n as f64 / secs
    );
}
