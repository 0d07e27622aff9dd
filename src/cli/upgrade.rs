//! `raidfs upgrade`: move an unmounted array's filesystem to the newest
//! format this release writes, or (`--check`) say which format it has and
//! what upgrading would bring. A filesystem never changes format on its own,
//! because older raidfs releases refuse a newer format.

use crate::array::{assemble_paths, AssembleOptions, OpenPolicy};
use crate::fs::upgrade::{plan, upgrade};
use crate::fs::ArrayStore;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct UpgradeArgs {
    /// Only show the current format and what upgrading would bring.
    #[arg(long)]
    pub check: bool,
    /// Member image files, block devices or NBD URIs of the unmounted array.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub fn run(args: UpgradeArgs) -> i32 {
    let opts = AssembleOptions {
        read_only: args.check,
        ..Default::default()
    };
    if let Err(msg) = super::mount::check_members_free(&args.members) {
        return super::fail(msg);
    }
    let policy = OpenPolicy {
        lock_wait: super::mount::OFFLINE_LOCK_WAIT,
        leave_out_unwritable: false,
    };
    let array = match assemble_paths(&args.members, opts, policy) {
        Ok(assembly) => {
            super::mount::tell_left_out(&assembly.left_out);
            super::mount::tell_notes(&assembly.notes);
            Arc::new(assembly.array)
        }
        Err(e) => return super::fail(format!("cannot assemble: {e}")),
    };
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    let planned = match plan(store.as_ref()) {
        Ok(p) => p,
        Err(e) => return super::fail(format!("cannot read the filesystem header: {e}")),
    };
    if !planned.is_needed() {
        println!(
            "filesystem format {} is current; nothing to do",
            planned.from
        );
        return 0;
    }
    if args.check {
        if planned.from == planned.to {
            println!(
                "filesystem format {} without this release's features; `raidfs upgrade` would add:",
                planned.from
            );
        } else {
            println!(
                "filesystem format {}; `raidfs upgrade` would move it to format {}:",
                planned.from, planned.to
            );
        }
        for gain in &planned.gains {
            println!("  {gain}");
        }
        println!("raidfs releases older than this one would then refuse it");
        return 0;
    }
    match upgrade(store) {
        Ok(done) => {
            if done.from == done.to {
                println!("filesystem format {} upgraded:", done.from);
            } else {
                println!(
                    "filesystem upgraded from format {} to format {}:",
                    done.from, done.to
                );
            }
            for gain in &done.gains {
                println!("  {gain}");
            }
            0
        }
        Err(e) => super::fail(format!(
            "upgrade failed: {e} (the filesystem keeps format {})",
            planned.from
        )),
    }
}
