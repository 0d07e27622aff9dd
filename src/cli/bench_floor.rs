//! `raidfs bench fuse-floor`: mount the FUSE floor, a filesystem that
//! stores no data, with the session `raidfs mount -o ...` would give an
//! array, and serve it until it is unmounted. A benchmark run on it is the
//! most any daemon reaches through FUSE here (see `fuse::floor`).

use std::path::PathBuf;

use super::mount::options;

#[derive(clap::Args, Clone, Debug)]
pub struct FloorArgs {
    /// Directory to mount the floor on.
    pub mount_point: PathBuf,
    /// Mount options, as for `raidfs mount` (those of the FUSE session
    /// count: threads, busy_poll, direct_io, kernel_cache, writeback_cache,
    /// read_ahead_kb, allow_other, ...).
    #[arg(short = 'o', value_name = "OPTIONS")]
    pub options: Vec<String>,
}

pub fn run(args: FloorArgs) -> i32 {
    let config = match options::parse(&args.options) {
        Ok(opts) => opts.fuse,
        Err(e) => return super::fail(format!("bench fuse-floor: {e}")),
    };
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let owner = unsafe { (libc::geteuid(), libc::getegid()) };
    let handle = match crate::fuse::mount_floor(&args.mount_point, &config, owner) {
        Ok(handle) => handle,
        Err(e) => return super::fail(format!("bench fuse-floor: {e}")),
    };
    eprintln!(
        "raidfs bench fuse-floor: serving {} (writes are dropped, reads return zeros: \
         for benchmarks only); `umount {}` ends it",
        args.mount_point.display(),
        args.mount_point.display()
    );
    match handle.wait() {
        Ok(()) => 0,
        Err(e) => super::fail(format!("bench fuse-floor: {e}")),
    }
}
