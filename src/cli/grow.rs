//! `raidfs grow`: change a mounted array's geometry (md's `--grow`). Today
//! the level, on the same members; the array moves group by group in the
//! background and stays mounted and writable throughout.

use crate::cli::manage::run_request;
use crate::control::Request;
use crate::geometry::Level;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct GrowArgs {
    /// The new RAID level: 5 from RAID1 of three or more members or from
    /// RAID6; 6 from RAID5 when the array holds as much per group as RAID6.
    #[arg(short, long, value_parser = super::create::parse_level)]
    pub level: Option<Level>,
    /// Wait for the reshape to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Pause the running reshape; `raidfs grow MOUNT` without `--level`
    /// goes on with it, and so does the next mount.
    #[arg(long, conflicts_with_all = ["wait", "level"])]
    pub stop: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

pub fn run(args: GrowArgs) -> i32 {
    if args.stop {
        return run_request(&args.mount_point, Request::Stop, false, &[]);
    }
    run_request(
        &args.mount_point,
        Request::Grow { level: args.level },
        args.wait,
        &["reshape"],
    )
}
