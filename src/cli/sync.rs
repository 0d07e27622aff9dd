//! `raidfs sync MOUNT`: commit the journal and flush every member of a
//! mounted array now, like `btrfs filesystem sync`. sync(1) cannot do this
//! on a FUSE mount (the kernel sends no syncfs request to a /dev/fuse
//! filesystem), so this asks the daemon through its control socket.

use crate::cli::manage::run_request;
use crate::control::Request;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct SyncArgs {
    /// The mount point.
    pub mount_point: PathBuf,
}

pub fn run(args: SyncArgs) -> i32 {
    run_request(&args.mount_point, Request::Sync, false, &[])
}
