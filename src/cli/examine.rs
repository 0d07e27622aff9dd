//! `raidfs examine`.

#[derive(clap::Args)]
pub struct ExamineArgs {}

pub fn run(_args: ExamineArgs) -> i32 {
    super::fail("not yet built")
}
