//! `raidfs bench`.

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> i32 {
    super::fail("not yet built")
}
