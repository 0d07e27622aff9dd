//! The `raidfs` command line: one file per subcommand, each with its clap
//! arguments and a `run` that returns the exit code.

pub mod bench;
pub mod config;
pub mod create;
pub mod examine;
pub mod fsck;
pub mod mount;
pub mod mount_helper;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "raidfs", version, about = "RAID arrays of image files, mounted as a POSIX filesystem through FUSE")]
struct Cli {
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
    Mount(mount::MountArgs),
    /// Unmount a raidfs mount cleanly.
    Umount(mount::UmountArgs),
    /// Check (and optionally repair) an unmounted array's filesystem.
    Fsck(fsck::FsckArgs),
    /// The array configuration file (/etc/raidfs.ron): scan for arrays, show them.
    Config(config::ConfigArgs),
    /// mount(8)'s helper for `-t raidfs`; /sbin/mount.raidfs runs this.
    #[command(hide = true)]
    MountHelper(mount_helper::HelperArgs),
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
        Command::Config(a) => config::run(a),
        Command::MountHelper(a) => mount_helper::run(a),
    }
}

/// Print `raidfs: error: MSG` to stderr and return exit code 1.
pub fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("raidfs: error: {msg}");
    1
}
