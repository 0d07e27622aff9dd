//! `make install` / `make uninstall` into a temporary DESTDIR: the binary,
//! the mount(8) helper pointing at the installed binary, the docs, the
//! raidfs-monitor.service unit, the Prometheus rules and Grafana dashboard.

mod ecosystem_support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use ecosystem_support::*;

fn make(destdir: &Path, target: &str) -> Command {
    let mut cmd = Command::new("make");
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"))
        .arg("--no-print-directory")
        .arg(target)
        .arg(format!("DESTDIR={}", destdir.display()))
        .arg("PREFIX=/usr/local")
        // Install the binary this test suite built instead of a release build.
        .arg("NO_BUILD=1")
        .arg(format!("RAIDFS_BUILT={RAIDFS}"));
    cmd
}

#[test]
fn make_install_and_uninstall_in_a_destdir() {
    if which("make").is_none() {
        eprintln!("skipping: make is not installed");
        return;
    }
    let stage = tempfile::tempdir().unwrap();
    let dest = stage.path();
    check(&mut make(dest, "install"));

    let bin = dest.join("usr/local/bin/raidfs");
    let helper = dest.join("sbin/mount.raidfs");
    // mount(8) runs mount.fuse.raidfs for the type live mounts have (remount).
    let fuse_helper = dest.join("sbin/mount.fuse.raidfs");
    for (path, mode) in [(&bin, 0o755), (&helper, 0o755), (&fuse_helper, 0o755)] {
        let meta = std::fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(
            meta.permissions().mode() & 0o777,
            mode,
            "{}",
            path.display()
        );
    }
    assert!(dest.join("usr/local/share/doc/raidfs/fstab.md").is_file());
    assert!(dest.join("usr/local/share/doc/raidfs/nfs.md").is_file());
    assert!(dest.join("usr/local/share/doc/raidfs/monitor.md").is_file());

    // The monitor's unit runs the installed binary (without DESTDIR).
    let unit = dest.join("usr/local/lib/systemd/system/raidfs-monitor.service");
    let text = std::fs::read_to_string(&unit).unwrap_or_else(|e| panic!("{}: {e}", unit.display()));
    assert!(
        text.contains("\nExecStart=/usr/local/bin/raidfs monitor --syslog\n")
            && text.contains("\nType=simple\n")
            && text.contains("\nRestart=on-failure\n")
            && !text.contains('@'),
        "{text}"
    );
    if let Some(analyze) = which("systemd-analyze") {
        // The unit is well formed (its ExecStart must exist: the staged
        // binary stands in for the installed one).
        let staged = text.replace("/usr/local/bin/raidfs", &bin.display().to_string());
        let check_dir = tempfile::tempdir().unwrap();
        let copy = check_dir.path().join("raidfs-monitor.service");
        std::fs::write(&copy, staged).unwrap();
        check(Command::new(analyze).arg("verify").arg(&copy));
    }
    let logrotate = std::fs::read_to_string(dest.join("etc/logrotate.d/raidfs")).unwrap();
    assert!(logrotate.contains("/var/log/raidfs/*.log"), "{logrotate}");
    assert!(logrotate.contains("copytruncate"), "{logrotate}");
    let monitoring = [
        (
            "dist/prometheus/raidfs.rules.yml",
            "prometheus/raidfs.rules.yml",
        ),
        (
            "dist/prometheus/raidfs.rules.test.yml",
            "prometheus/raidfs.rules.test.yml",
        ),
        ("dist/grafana/raidfs.json", "grafana/raidfs.json"),
    ];
    let share = dest.join("usr/local/share/raidfs");
    for (source, installed) in monitoring {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join(source);
        let copy =
            std::fs::read(share.join(installed)).unwrap_or_else(|e| panic!("{installed}: {e}"));
        assert_eq!(copy, std::fs::read(&source).unwrap(), "{installed}");
    }
    // The rules' tests find the rules beside them.
    assert!(share
        .join("prometheus")
        .join(
            std::fs::read_to_string(share.join("prometheus/raidfs.rules.test.yml"))
                .unwrap()
                .lines()
                .find_map(|l| l.trim().strip_prefix("- ").filter(|f| f.ends_with(".yml")))
                .expect("rule_files entry")
        )
        .is_file());
    assert!(dest.join("usr/local/share/doc/raidfs/metrics.md").is_file());
    let man8 = dest.join("usr/local/share/man/man8");
    assert!(man8.join("raidfs.8").is_file());
    let completions = [
        "usr/local/share/bash-completion/completions/raidfs",
        "usr/local/share/zsh/site-functions/_raidfs",
        "usr/local/share/fish/vendor_completions.d/raidfs.fish",
    ];
    for script in completions {
        let text = std::fs::read_to_string(dest.join(script)).unwrap();
        assert!(text.contains("speed-limit"), "{script}: {text}");
    }
    check(
        Command::new("bash")
            .arg("-n")
            .arg(dest.join(completions[0])),
    );
    assert!(!has_symbols(&bin), "the installed binary is not stripped");

    // The helper names the installed binary (without DESTDIR) and is valid sh.
    let script = std::fs::read_to_string(&helper).unwrap();
    assert!(
        script.contains("${RAIDFS_BIN:-/usr/local/bin/raidfs}"),
        "{script}"
    );
    assert!(!script.contains("@RAIDFS@"));
    check(Command::new("sh").arg("-n").arg(&helper));
    assert_eq!(std::fs::read_to_string(&fuse_helper).unwrap(), script);

    // The installed pair works: a fake (-f) mount resolves a member glob.
    let out = check(Command::new(&bin).arg("--version"));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("raidfs"));
    let array = Array::new();
    let out = check(
        Command::new(&helper)
            .env("RAIDFS_BIN", &bin)
            .arg(format!("{}/*.img", array.dir.path().display()))
            .arg(array.mnt())
            .args(["-f", "-o", "rw,nofail"]),
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(said.contains("m2.img"), "{said}");

    check(&mut make(dest, "uninstall"));
    assert!(!bin.exists() && !helper.exists() && !fuse_helper.exists() && !unit.exists());
    assert!(!dest.join("usr/local/share/doc/raidfs").exists());
    assert!(!dest.join("etc/logrotate.d/raidfs").exists());
    assert!(!share.exists(), "{} is left", share.display());
    assert!(!man8.join("raidfs.8").exists() && !man8.join("raidfs-mount.8").exists());
    for script in completions {
        assert!(!dest.join(script).exists(), "{script}");
    }
}

/// Whether an ELF file has a symbol table (`.symtab`), which strip removes.
fn has_symbols(path: &Path) -> bool {
    let out = check(Command::new("readelf").arg("-S").arg("-W").arg(path));
    String::from_utf8_lossy(&out.stdout).contains(".symtab")
}

#[test]
fn man_raidfs_mount_renders_after_make_install() {
    if which("make").is_none() {
        eprintln!("skipping: make is not installed");
        return;
    }
    assert!(
        which("man").is_some(),
        "man is not installed (Debian: man-db groff-base; .ci/run installs them)"
    );
    let stage = tempfile::tempdir().unwrap();
    let dest = stage.path();
    check(&mut make(dest, "install"));
    let page = dest.join("usr/local/share/man/man8/raidfs-mount.8");
    let out = check(
        Command::new("man")
            .arg("-l")
            .arg(&page)
            .env("MANWIDTH", "200")
            .env("MAN_KEEP_FORMATTING", "0")
            .env("MANPAGER", "cat")
            .env("PAGER", "cat"),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "raidfs-mount",
        "auto_unmount",
        "direct_io",
        "deferred_writes=N",
        "queued_writes=N",
        "read_ahead_kb=N",
        "balance=POLICY",
        "rotational=0|1",
        "log=PATH",
    ] {
        assert!(
            text.contains(needle),
            "man raidfs-mount lacks {needle}:\n{text}"
        );
    }
    // Every visible subcommand has its page.
    for sub in raidfs::cli::command()
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
    {
        let page = dest.join(format!(
            "usr/local/share/man/man8/raidfs-{}.8",
            sub.get_name()
        ));
        assert!(page.is_file(), "{}", page.display());
    }
}

/// The scheduled-check units: installed with the binary's path, removed by
/// uninstall, and accepted by `systemd-analyze verify` for an instance.
#[test]
fn check_timer_units_are_installed_and_verify() {
    if which("make").is_none() {
        eprintln!("skipping: make is not installed");
        return;
    }
    const UNITS: [&str; 4] = [
        "raidfs-check@.service",
        "raidfs-check@.timer",
        "raidfs-check-continue@.service",
        "raidfs-check-continue@.timer",
    ];
    let stage = tempfile::tempdir().unwrap();
    let dest = stage.path();
    check(&mut make(dest, "install"));
    let unit_dir = dest.join("usr/local/lib/systemd/system");
    for unit in UNITS {
        let path = unit_dir.join(unit);
        let meta = std::fs::metadata(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(meta.permissions().mode() & 0o777, 0o644, "{unit}");
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(!text.contains("@RAIDFS@"), "{text}");
        assert!(!text.contains("@DOCDIR@"), "{text}");
    }
    let service = std::fs::read_to_string(unit_dir.join("raidfs-check@.service")).unwrap();
    assert!(
        service.contains("ExecStart=/usr/local/bin/raidfs check --wait --max-time 6h %f"),
        "{service}"
    );
    let timer = std::fs::read_to_string(unit_dir.join("raidfs-check@.timer")).unwrap();
    for want in [
        "OnCalendar=",
        "RandomizedDelaySec=",
        "Persistent=true",
        "WantedBy=timers.target",
    ] {
        assert!(timer.contains(want), "{want} missing in\n{timer}");
    }
    let resume = std::fs::read_to_string(unit_dir.join("raidfs-check-continue@.service")).unwrap();
    assert!(
        resume.contains("check --continue --wait --max-time 6h %f"),
        "{resume}"
    );
    check(&mut make(dest, "uninstall"));
    for unit in UNITS {
        assert!(!unit_dir.join(unit).exists(), "{unit} left behind");
    }

    // systemd-analyze checks the command exists, so verify an install whose
    // paths are real (no DESTDIR) in a scratch prefix.
    let Some(analyze) = which("systemd-analyze") else {
        eprintln!("skipping systemd-analyze verify: systemd-analyze is not installed");
        return;
    };
    let prefix = tempfile::tempdir().unwrap();
    let p = prefix.path();
    check(
        Command::new("make")
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["--no-print-directory", "install", "NO_BUILD=1"])
            .arg(format!("RAIDFS_BUILT={RAIDFS}"))
            .arg(format!("PREFIX={}", p.display()))
            .arg(format!("SBINDIR={}", p.join("sbin").display())),
    );
    let escaped = check(Command::new("systemd-escape").args(["--path", "/srv/array"]));
    let instance = String::from_utf8_lossy(&escaped.stdout).trim().to_string();
    assert_eq!(instance, "srv-array");
    for unit in UNITS {
        let named = unit.replace("@.", &format!("@{instance}."));
        let out = check(
            Command::new(&analyze)
                .arg("verify")
                .arg(p.join("lib/systemd/system").join(named)),
        );
        let said = String::from_utf8_lossy(&out.stderr);
        assert!(said.trim().is_empty(), "{unit}: {said}");
    }
}
