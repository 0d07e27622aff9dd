//! `raidfs mount` and `raidfs umount`.

#[derive(clap::Args)]
pub struct MountArgs {}

#[derive(clap::Args)]
pub struct UmountArgs {}

pub fn run(_args: MountArgs) -> i32 {
    super::fail("not yet built")
}

pub fn run_umount(_args: UmountArgs) -> i32 {
    super::fail("not yet built")
}
