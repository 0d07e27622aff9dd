//! `raidfs fsck`.

#[derive(clap::Args)]
pub struct FsckArgs {}

pub fn run(_args: FsckArgs) -> i32 {
    super::fail("not yet built")
}
