//! README's quick start runs as written on a fresh Debian machine as root
//! (which has no `sudo`): its commands are checked for that, and the demo
//! is run on the binary this suite built (the README's release build is the
//! same code).

mod ecosystem_support;

use std::process::Command;

use ecosystem_support::*;

/// The shell blocks of README's "Quick start" section.
fn quick_start_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Quick start"))
        .expect("a Quick start section");
    section
        .split("```sh\n")
        .skip(1)
        .filter_map(|block| block.split("\n```").next())
        .flat_map(|block| block.lines().map(str::to_string).collect::<Vec<_>>())
        .collect()
}

#[test]
fn the_quick_start_needs_no_sudo() {
    let commands = quick_start_commands();
    assert_eq!(
        commands,
        [
            "cargo build --release && scripts/demo",
            "cargo test --locked"
        ],
        "README's quick start changed: keep this test's run of it in step"
    );
    for command in &commands {
        assert!(!command.contains("sudo"), "{command}");
    }
}

#[test]
fn the_demo_runs_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(
        Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/demo"))
            .arg(dir.path())
            .env("RAIDFS", RAIDFS),
    );
    let said = String::from_utf8_lossy(&out.stdout);
    // The demo's mounts log to the system log directory; take those logs back.
    for log in said
        .split("(log: ")
        .skip(1)
        .filter_map(|rest| rest.split(')').next())
    {
        let _ = std::fs::remove_file(log);
    }
    // The demo unmounts on failure (its trap); make sure anyway.
    let mnt = dir.path().join("mnt");
    if mount_options(&mnt).is_some() {
        let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    }
    assert!(
        out.status.success(),
        "scripts/demo failed: {}\n{said}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("random.bin intact after remount"), "{said}");
}
