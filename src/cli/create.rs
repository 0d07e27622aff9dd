//! `raidfs create`.

#[derive(clap::Args)]
pub struct CreateArgs {}

pub fn run(_args: CreateArgs) -> i32 {
    super::fail("not yet built")
}
