//! `cargo run --release --example bench_balance -- [--json] [--check]`: the
//! read-balancing benchmark (`raidfs bench balance`) as a standalone program.
//!
//! It compiles src/cli/bench_balance.rs in place; the small modules below give
//! that file the crate paths it uses (`crate::array`, `super::fail`, ...).

use clap::Parser;

mod array {
    pub use raidfs::array::*;
}
mod geometry {
    pub use raidfs::geometry::*;
}
mod member {
    pub use raidfs::member::*;
}
mod superblock {
    pub use raidfs::superblock::*;
}

#[path = "../src/cli/bench_balance.rs"]
mod bench_balance;

/// As `raidfs::cli::fail`: report and return exit code 1.
fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("bench_balance: error: {msg}");
    1
}

#[derive(Parser)]
#[command(
    name = "bench_balance",
    about = "Read balancing on simulated mirrors (the linux-raid thread's experiment)"
)]
struct Cli {
    #[command(flatten)]
    args: bench_balance::BalanceArgs,
}

fn main() {
    std::process::exit(bench_balance::run(Cli::parse().args));
}
