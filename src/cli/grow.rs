//! `raidfs grow`: change a mounted array's geometry (md's `--grow`): its
//! level, and members added to restripe onto; the array moves group by
//! group in the background and stays mounted and writable throughout. With
//! `--size`, members made larger give their new space to the array.

use crate::array::SizeTarget;
use crate::cli::manage::run_request;
use crate::control::Request;
use crate::geometry::Level;
use std::path::PathBuf;

/// `--size`: `max`, or a size such as 64M.
fn parse_grow_size(s: &str) -> Result<SizeTarget, String> {
    if s.eq_ignore_ascii_case("max") {
        return Ok(SizeTarget::Max);
    }
    crate::cli::create::parse_size(s).map(SizeTarget::Bytes)
}

#[derive(clap::Args)]
pub struct GrowArgs {
    /// The new RAID level: 5 from RAID1 of three or more members or from
    /// RAID6; 6 from RAID5 when the array holds as much per group as RAID6.
    #[arg(short, long, value_parser = super::create::parse_level)]
    pub level: Option<Level>,
    /// Image files or block devices to add as members (created sparse if
    /// missing); the data is restriped over all of them (RAID1: one more
    /// copy each).
    #[arg(short, long, num_args = 1.., value_name = "IMAGE")]
    pub add: Vec<PathBuf>,
    /// Without --add: how much of each member the array uses, `max` for
    /// all of it (members whose images or devices were made larger give
    /// the new space), or a size such as 8G. With --add: the size of an
    /// added image that does not exist yet (default: what the array needs
    /// per member), e.g. 64M.
    #[arg(long, value_parser = parse_grow_size, value_name = "max|SIZE")]
    pub size: Option<SizeTarget>,
    /// Overwrite an added image that belongs to another array.
    #[arg(short, long, requires = "add")]
    pub force: bool,
    /// Wait for the reshape to finish, showing its progress.
    #[arg(long)]
    pub wait: bool,
    /// Pause the running reshape; `raidfs grow MOUNT` without `--level`
    /// goes on with it, and so does the next mount.
    #[arg(long, conflicts_with_all = ["wait", "level", "add", "size"])]
    pub stop: bool,
    /// The mount point.
    pub mount_point: PathBuf,
}

pub fn run(args: GrowArgs) -> i32 {
    if args.stop {
        return run_request(&args.mount_point, Request::Stop, false, &[]);
    }
    if args.add.is_empty() {
        if let Some(target) = args.size {
            if args.level.is_some() {
                return super::fail(
                    "--size changes how much of the members the array uses; give --level on its own",
                );
            }
            return run_request(
                &args.mount_point,
                Request::Grow {
                    level: None,
                    add: Vec::new(),
                    size: None,
                    force: false,
                    member_size: Some(target),
                },
                false,
                &[],
            );
        }
    }
    let size =
        match args.size {
            None => None,
            Some(SizeTarget::Bytes(n)) => Some(n),
            Some(SizeTarget::Max) => return super::fail(
                "--size max grows the array onto its members' new space and goes without --add; \
                 with --add, --size is the size of the new images",
            ),
        };
    let mut add = Vec::with_capacity(args.add.len());
    for image in &args.add {
        match crate::cli::manage::image_arg(image) {
            Ok(p) => add.push(p),
            Err(msg) => return super::fail(msg),
        }
    }
    run_request(
        &args.mount_point,
        Request::Grow {
            level: args.level,
            add,
            size,
            force: args.force,
            member_size: None,
        },
        args.wait,
        // A mirror that only gains copies rebuilds them instead.
        &["reshape", "recovery"],
    )
}
