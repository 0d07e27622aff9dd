//! `cargo run --release --example bench_balance -- [--json] [--check]`: the
//! read-balancing benchmark, the same as `raidfs bench balance`.

use clap::Parser;
use raidfs::cli::bench_balance::{run, BalanceArgs};

#[derive(Parser)]
#[command(
    name = "bench_balance",
    about = "Read balancing on simulated mirrors (the linux-raid thread's experiment)"
)]
struct Cli {
    #[command(flatten)]
    args: BalanceArgs,
}

fn main() {
    std::process::exit(run(Cli::parse().args));
}
