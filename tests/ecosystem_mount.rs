//! raidfs used the way filesystems are used: util-linux `mount -t raidfs`
//! and fstab lines through /sbin/mount.raidfs, `uuid=` resolved through a
//! configuration file, mount(8)/systemd options, plain `umount` and
//! `umount -l`, and the mount command a systemd-generated unit runs.

mod common;
mod ecosystem_support;

use std::fs;
use std::io::Write;
use std::path::Path;

use common::DaemonGuard;
use ecosystem_support::*;

fn write_fstab(array: &Array, line: &str) -> std::path::PathBuf {
    let path = array.path("fstab");
    fs::write(&path, format!("# test fstab\n{line}\n")).expect("write fstab");
    path
}

#[test]
fn fstab_entry_mounts_with_mount_dir_and_mount_a() {
    if !mount8_available() {
        return;
    }
    let helper = HelperGuard::new();
    let array = Array::new();
    let mnt = array.mnt();
    let _guard = DaemonGuard::new(&mnt);
    let fstab = write_fstab(
        &array,
        &format!(
            "{}/m*.img {} raidfs defaults,nofail,noexec,_netdev,x-systemd.requires-mounts-for={},{} 0 0",
            array.dir.path().display(),
            mnt.display(),
            array.dir.path().display(),
            array.log_option()
        ),
    );

    // `mount DIR` with the entry in a given fstab (mount -T FSTAB).
    check(helper.mount().arg("-T").arg(&fstab).arg(&mnt));
    let opts = mount_options(&mnt).expect("a raidfs mount on the mount point");
    assert!(
        opts.split(',').any(|o| o == "noexec"),
        "noexec not applied: {opts}"
    );
    assert!(
        array.state().contains("dirty"),
        "a mounted array is marked in use"
    );
    fs::write(mnt.join("hello.txt"), b"written through fstab mount\n").unwrap();

    // Plain umount: the kernel ends the session, the daemon closes the array.
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert!(mount_options(&mnt).is_none());
    assert_daemon_finished(&record, &mnt);
    assert_eq!(array.state(), "clean");

    // `mount -a` with the same fstab mounts it again; the data is there.
    check(helper.mount().arg("--fstab").arg(&fstab).arg("-a"));
    assert_eq!(
        fs::read(mnt.join("hello.txt")).unwrap(),
        b"written through fstab mount\n"
    );
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);
}

#[test]
fn uuid_spec_resolves_through_the_config_file() {
    if !mount8_available() {
        return;
    }
    let helper = HelperGuard::new();
    let array = Array::new();
    let mnt = array.mnt();
    let _guard = DaemonGuard::new(&mnt);

    // `raidfs config scan` writes the entry for the members it finds.
    let glob = format!("{}/*.img", array.dir.path().display());
    let out = check(raidfs().args(["config", "scan", &glob]));
    let config_path = array.path("raidfs.ron");
    fs::write(&config_path, &out.stdout).unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&array.uuid),
        "scan output lacks the UUID:\n{text}"
    );

    // A hand-written entry with a glob works the same.
    fs::write(
        &config_path,
        format!(
            "(arrays: [(uuid: \"{}\", name: \"test\", members: [\"{}\"], options: \"threads=2\")])",
            array.uuid, glob
        ),
    )
    .unwrap();
    check(
        helper
            .mount()
            .env("RAIDFS_CONFIG", &config_path)
            .args(["-t", "raidfs"])
            .arg(format!("uuid={}", array.uuid))
            .arg(&mnt)
            .args(["-o", &array.log_option()]),
    );
    fs::write(mnt.join("by-uuid"), b"uuid mount").unwrap();
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);

    // mount(8) resolves an upper-case UUID= tag through blkid itself, so that
    // form reaches raidfs only when the helper is called directly.
    check(
        std::process::Command::new(HELPER_PATH)
            .env("RAIDFS_BIN", RAIDFS)
            .env("RAIDFS_CONFIG", &config_path)
            .arg(format!("UUID={}", array.uuid.to_uppercase()))
            .arg(&mnt)
            .args(["-o", &format!("rw,{}", array.log_option())]),
    );
    assert_eq!(fs::read(mnt.join("by-uuid")).unwrap(), b"uuid mount");
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);

    // An unknown UUID fails as a mount failure (32) and mounts nothing.
    let out = run(helper
        .mount()
        .env("RAIDFS_CONFIG", &config_path)
        .args(["-t", "raidfs", "uuid=00000000-0000-4000-8000-000000000000"])
        .arg(&mnt));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no array with UUID"));
    assert!(mount_options(&mnt).is_none());
}

#[test]
fn member_lists_directories_and_unknown_options() {
    if !mount8_available() {
        return;
    }
    let helper = HelperGuard::new();
    let array = Array::new();
    let mnt = array.mnt();
    let _guard = DaemonGuard::new(&mnt);
    let list: Vec<String> = array
        .members()
        .iter()
        .map(|m| m.display().to_string())
        .collect();

    // An option raidfs does not know fails the mount...
    let out = run(helper
        .mount()
        .args(["-t", "raidfs", &list.join(",")])
        .arg(&mnt)
        .args(["-o", "bogus_option"]));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bogus_option"));
    assert!(mount_options(&mnt).is_none());

    // ...unless mount -s (sloppy) asks to drop it. Colon-separated list.
    check(
        helper
            .mount()
            .args(["-s", "-t", "raidfs", &list.join(":")])
            .arg(&mnt)
            .args(["-o", &format!("bogus_option,nosuid,{}", array.log_option())]),
    );
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);

    // A directory of members: files without a raidfs superblock are skipped.
    fs::write(array.path("notes.txt"), b"not a member").unwrap();
    check(
        helper
            .mount()
            .args(["-t", "raidfs"])
            .arg(array.dir.path())
            .arg(&mnt)
            .args(["-o", &array.log_option()]),
    );
    assert!(mount_options(&mnt).is_some());
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);
}

#[test]
fn lazy_umount_lets_the_daemon_finish_cleanly() {
    if !mount8_available() {
        return;
    }
    let helper = HelperGuard::new();
    let array = Array::new();
    let mnt = array.mnt();
    let _guard = DaemonGuard::new(&mnt);
    let spec = format!("{}/m?.img", array.dir.path().display());
    check(
        helper
            .mount()
            .args(["-t", "raidfs", &spec])
            .arg(&mnt)
            .args(["-o", &array.log_option()]),
    );
    let record = daemon(&mnt);
    let mut open = fs::File::create(mnt.join("open-during-detach")).unwrap();
    open.write_all(b"before ").unwrap();

    check(std::process::Command::new("umount").arg("-l").arg(&mnt));
    assert!(mount_options(&mnt).is_none(), "detached from the namespace");
    assert!(
        record.is_alive(),
        "the daemon serves the open file until it is closed"
    );
    open.write_all(b"after detach").unwrap();
    open.sync_all().unwrap();
    drop(open);

    assert_daemon_finished(&record, &mnt);
    assert_eq!(array.state(), "clean");

    // The write made after the detach reached the array.
    check(
        helper
            .mount()
            .args(["-t", "raidfs", "-o", "ro", &spec])
            .arg(&mnt),
    );
    assert_eq!(
        fs::read(mnt.join("open-during-detach")).unwrap(),
        b"before after detach"
    );
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);
}

/// What systemd does with an fstab line: systemd-fstab-generator writes a
/// mount unit, and the unit runs `mount WHAT WHERE -t TYPE -o OPTIONS`.
/// Without systemd as PID 1 here, run the generator on a test fstab and
/// then that command.
#[test]
fn systemd_generated_mount_unit_command_works() {
    if !mount8_available() {
        return;
    }
    let generator = Path::new("/lib/systemd/system-generators/systemd-fstab-generator");
    if !generator.exists() {
        eprintln!("skipping: systemd-fstab-generator is not installed");
        return;
    }
    let helper = HelperGuard::new();
    let array = Array::new();
    let mnt = array.mnt();
    let _guard = DaemonGuard::new(&mnt);
    let fstab = write_fstab(
        &array,
        &format!(
            "{}/m*.img {} raidfs defaults,nofail,x-systemd.requires-mounts-for={},{} 0 0",
            array.dir.path().display(),
            mnt.display(),
            array.dir.path().display(),
            array.log_option()
        ),
    );
    let units = array.path("units");
    fs::create_dir(&units).unwrap();
    check(
        std::process::Command::new(generator)
            .env("SYSTEMD_FSTAB", &fstab)
            .env("SYSTEMD_LOG_LEVEL", "warning")
            .args([&units, &units, &units]),
    );
    // The unit is the one whose Where= is our mount point (its file name is
    // the systemd-escaped path).
    let unit = fs::read_dir(&units)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".mount"))
        .filter_map(|e| fs::read_to_string(e.path()).ok())
        .find(|text| {
            text.lines()
                .any(|l| l == format!("Where={}", mnt.display()))
        })
        .unwrap_or_else(|| panic!("no mount unit for {} in {}", mnt.display(), units.display()));
    let field = |key: &str| {
        unit.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or_else(|| panic!("{key}= missing in\n{unit}"))
            .to_string()
    };
    assert_eq!(field("Type"), "raidfs");
    assert!(
        unit.contains(&format!("RequiresMountsFor={}", array.dir.path().display())),
        "{unit}"
    );
    check(helper.mount().arg(field("What")).arg(field("Where")).args([
        "-t",
        &field("Type"),
        "-o",
        &field("Options"),
    ]));
    assert!(mount_options(&mnt).is_some());
    let record = daemon(&mnt);
    check(std::process::Command::new("umount").arg(&mnt));
    assert_daemon_finished(&record, &mnt);
}

/// Each mount shows its array's identity as its source and type
/// fuse.raidfs: mount(8) sees an fstab line as mounted (a second `mount -a`
/// does nothing), findmnt lists the mounts by type and source, and
/// `mount -o remount,ro|rw` goes through mount.fuse.raidfs to the daemon.
#[test]
fn mount_a_twice_findmnt_and_remount() {
    if !mount8_available() {
        return;
    }
    let helper = HelperGuard::new();
    let named = Array::new();
    let unnamed = Array::new();
    let (named_mnt, unnamed_mnt) = (named.mnt(), unnamed.mnt());
    let _named_guard = DaemonGuard::new(&named_mnt);
    let _unnamed_guard = DaemonGuard::new(&unnamed_mnt);
    let name = format!("eco-{}", std::process::id());
    let config = named.path("raidfs.ron");
    fs::write(
        &config,
        format!(
            "(arrays: [(uuid: \"{}\", name: \"{name}\", members: [\"{}/*.img\"]), (uuid: \"{}\", members: [\"{}/*.img\"])])",
            named.uuid,
            named.dir.path().display(),
            unnamed.uuid,
            unnamed.dir.path().display()
        ),
    )
    .unwrap();
    // One line by name with type raidfs, one by uuid= with type fuse.raidfs.
    let fstab = write_fstab(
        &named,
        &format!(
            "{name} {} raidfs {} 0 0\nuuid={} {} fuse.raidfs {} 0 0",
            named_mnt.display(),
            named.log_option(),
            unnamed.uuid,
            unnamed_mnt.display(),
            unnamed.log_option()
        ),
    );
    let mount_all = || {
        check(
            helper
                .mount()
                .env("RAIDFS_CONFIG", &config)
                .arg("--fstab")
                .arg(&fstab)
                .arg("-a"),
        )
    };
    // Silent on success, as mount(8) helpers are (fstests compares output).
    let first = mount_all();
    assert!(
        first.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&first.stdout)
    );
    mount_all();
    let out = check(std::process::Command::new("findmnt").args([
        "-rn",
        "-t",
        "fuse.raidfs",
        "-o",
        "SOURCE,TARGET",
    ]));
    let listed = String::from_utf8_lossy(&out.stdout);
    for (source, mnt) in [
        (name.clone(), &named_mnt),
        (format!("uuid={}", unnamed.uuid), &unnamed_mnt),
    ] {
        let on_mnt: Vec<&str> = listed
            .lines()
            .filter(|l| l.ends_with(&format!(" {}", mnt.display())))
            .collect();
        assert_eq!(
            on_mnt,
            vec![format!("{source} {}", mnt.display())],
            "one mount from {source}; findmnt says:\n{listed}"
        );
    }

    // As mount(8) mounts any filesystem for root: suid and dev unless told.
    let opts = mount_options(&named_mnt).expect("mounted");
    assert!(
        !opts.split(',').any(|o| o == "nosuid" || o == "nodev"),
        "{opts}"
    );

    // remount,ro: the kernel refuses writes; remount,rw takes them again.
    fs::write(named_mnt.join("before"), b"written before ro").unwrap();
    check(helper.mount().args(["-o", "remount,ro"]).arg(&named_mnt));
    let opts = mount_options(&named_mnt).expect("still mounted");
    assert!(opts.split(',').any(|o| o == "ro"), "{opts}");
    let refused = fs::write(named_mnt.join("while-ro"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    assert_eq!(
        fs::read(named_mnt.join("before")).unwrap(),
        b"written before ro"
    );
    check(helper.mount().args(["-o", "remount,rw"]).arg(&named_mnt));
    let opts = mount_options(&named_mnt).expect("still mounted");
    assert!(opts.split(',').any(|o| o == "rw"), "{opts}");
    fs::write(named_mnt.join("after"), b"written after rw").unwrap();

    // Not while a file is open for writing, as for any filesystem.
    {
        let _writer = fs::OpenOptions::new()
            .append(true)
            .open(named_mnt.join("after"))
            .unwrap();
        let out = run(helper.mount().args(["-o", "remount,ro"]).arg(&named_mnt));
        assert_eq!(out.status.code(), Some(32), "{out:?}");
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.contains("open for writing"), "{said}");
    }

    // A second mount of a mounted array is a bind mount of the first (one
    // daemon); `ro` there makes only that mount read-only, and the array
    // stays up until the last of the two is unmounted.
    let second = named.path("second");
    fs::create_dir(&second).unwrap();
    let _second_guard = DaemonGuard::new(&second);
    check(
        helper
            .mount()
            .env("RAIDFS_CONFIG", &config)
            .args(["-t", "fuse.raidfs", "-o", "ro", &name])
            .arg(&second),
    );
    assert_eq!(fs::read(second.join("after")).unwrap(), b"written after rw");
    let refused = fs::write(second.join("via-second"), b"x").unwrap_err();
    assert_eq!(refused.raw_os_error(), Some(libc::EROFS), "{refused}");
    let record = daemon(&named_mnt);
    check(std::process::Command::new("umount").arg(&named_mnt));
    assert_eq!(fs::read(second.join("after")).unwrap(), b"written after rw");
    assert!(named.state().contains("dirty"), "the array is still in use");
    check(std::process::Command::new("umount").arg(&second));
    assert_daemon_finished(&record, &named_mnt);
    assert_eq!(named.state(), "clean");

    let record = daemon(&unnamed_mnt);
    check(std::process::Command::new("umount").arg(&unnamed_mnt));
    assert_daemon_finished(&record, &unnamed_mnt);
    assert_eq!(unnamed.state(), "clean");

    // A mount assembled read-only cannot become read-write in place.
    check(
        helper
            .mount()
            .env("RAIDFS_CONFIG", &config)
            .args(["-t", "raidfs", "-o", &format!("ro,{}", named.log_option())])
            .arg(&name)
            .arg(&named_mnt),
    );
    assert_eq!(
        fs::read(named_mnt.join("after")).unwrap(),
        b"written after rw"
    );
    let out = run(helper.mount().args(["-o", "remount,rw"]).arg(&named_mnt));
    assert_eq!(out.status.code(), Some(32), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("assembled read-only"), "{said}");
    let opts = mount_options(&named_mnt).expect("still mounted");
    assert!(opts.split(',').any(|o| o == "ro"), "{opts}");
    let record = daemon(&named_mnt);
    check(std::process::Command::new("umount").arg(&named_mnt));
    assert_daemon_finished(&record, &named_mnt);
}
