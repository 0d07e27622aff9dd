//! The `raidfs` command line.

/// Entry point; returns the process exit code.
pub fn main() -> i32 {
    0
}
