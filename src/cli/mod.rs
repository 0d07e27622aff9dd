//! The `raidfs` command line: one file per subcommand, each with its clap
//! arguments and a `run` that returns the exit code.

pub mod bench;
pub mod bench_balance;
pub mod bench_floor;
pub mod config;
pub mod create;
pub mod detail;
pub mod examine;
pub mod fsck;
pub mod generate;
pub mod grow;
pub mod iostat;
pub mod manage;
pub mod metrics;
pub mod monitor;
pub mod mount;
pub mod mount_helper;
pub mod scrub;
pub mod status;
pub mod sync;
pub mod upgrade;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "raidfs",
    version,
    about = "RAID arrays of image files, mounted as a POSIX filesystem through FUSE"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create an array on member image files or block devices.
    Create(create::CreateArgs),
    /// Print a member's superblock, like `mdadm --examine`.
    Examine(examine::ExamineArgs),
    /// Benchmark the parity kernels and show which one is chosen.
    Bench(bench::BenchArgs),
    /// Assemble an array and mount its filesystem.
    #[command(override_usage = "raidfs mount [-f] [-o OPTIONS] MEMBER... MOUNTPOINT")]
    Mount(mount::MountArgs),
    /// Unmount a raidfs mount cleanly.
    Umount(mount::UmountArgs),
    /// Check (and optionally repair) an unmounted array's filesystem.
    Fsck(fsck::FsckArgs),
    /// Move an unmounted array's filesystem to the newest format (`--check`: only show it).
    Upgrade(upgrade::UpgradeArgs),
    /// Show mounted arrays, like /proc/mdstat.
    Status(status::StatusArgs),
    /// Show one mounted array in full, like `mdadm --detail`.
    Detail(detail::DetailArgs),
    /// Print mounted arrays' metrics in the Prometheus text format.
    Metrics(metrics::MetricsArgs),
    /// Show operations, bandwidth and latency per array and member, like `zpool iostat`.
    Iostat(iostat::IostatArgs),
    /// Watch every raidfs mount and raise events, like `mdadm --monitor`.
    Monitor(monitor::MonitorArgs),
    /// Mark a member of a mounted array faulty.
    Fail(manage::FailArgs),
    /// Take a faulty member or a spare out of a mounted array.
    Remove(manage::RemoveArgs),
    /// Add an image to a mounted array: it rebuilds a failed slot or waits as a spare.
    Add(manage::AddArgs),
    /// Copy a member of a mounted array onto a new image, then swap them.
    Replace(manage::ReplaceArgs),
    /// Scrub a mounted array, counting inconsistencies (`--stop` stops background work).
    Check(scrub::CheckArgs),
    /// Scrub a mounted array, rewriting redundancy that disagrees.
    Repair(scrub::RepairArgs),
    /// Change a mounted array's level, members or size while it runs (md's --grow).
    Grow(grow::GrowArgs),
    /// Show or set a mounted array's background speed limits.
    SpeedLimit(scrub::SpeedLimitArgs),
    /// Commit a mounted array's journal and flush every member now.
    Sync(sync::SyncArgs),
    /// The array configuration file (/etc/raidfs.ron): scan for arrays, show them.
    Config(config::ConfigArgs),
    /// mount(8)'s helper for `-t raidfs`; /sbin/mount.raidfs runs this.
    #[command(hide = true)]
    MountHelper(mount_helper::HelperArgs),
    /// Write the man pages into a directory (`make install` runs this).
    #[command(hide = true)]
    GenerateMan(generate::ManArgs),
    /// Print the completion script for a shell (`make install` runs this).
    #[command(hide = true)]
    Completions(generate::CompletionsArgs),
}

/// The whole command line's definition, for tests that check the docs.
pub fn command() -> clap::Command {
    <Cli as clap::CommandFactory>::command()
}

/// Entry point; returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    match cli.command {
        Command::Create(a) => create::run(a),
        Command::Examine(a) => examine::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Mount(a) => mount::run(a),
        Command::Umount(a) => mount::run_umount(a),
        Command::Fsck(a) => fsck::run(a),
        Command::Upgrade(a) => upgrade::run(a),
        Command::Status(a) => status::run(a),
        Command::Detail(a) => detail::run(a),
        Command::Metrics(a) => metrics::run(a),
        Command::Iostat(a) => iostat::run(a),
        Command::Monitor(a) => monitor::run(a),
        Command::Fail(a) => manage::run_fail(a),
        Command::Remove(a) => manage::run_remove(a),
        Command::Add(a) => manage::run_add(a),
        Command::Replace(a) => manage::run_replace(a),
        Command::Check(a) => scrub::run_check(a),
        Command::Repair(a) => scrub::run_repair(a),
        Command::Grow(a) => grow::run(a),
        Command::SpeedLimit(a) => scrub::run_speed_limit(a),
        Command::Sync(a) => sync::run(a),
        Command::Config(a) => config::run(a),
        Command::MountHelper(a) => mount_helper::run(a),
        Command::GenerateMan(a) => generate::run_man(a),
        Command::Completions(a) => generate::run_completions(a),
    }
}

/// Print `raidfs: error: MSG` to stderr and return exit code 1.
pub fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("raidfs: error: {msg}");
    1
}
