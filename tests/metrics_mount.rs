//! Observability of a real mount: `raidfs metrics` and the `-o metrics=`
//! HTTP endpoint, checked with the Prometheus client's own parser (Debian's
//! python3-prometheus-client); `raidfs iostat` while a writer runs; and the
//! damaged-data log: a block corrupted on every copy of a mirror reads as
//! EIO, `status -v` and `detail` name the file and offset, a remount still
//! does, and deleting the file clears it.

mod common;

use std::ffi::OsStr;
use std::fs;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cli::{check, detail_json, raidfs, raidfs_ok, stderr, Mirror};
use common::{fuse_available, DaemonGuard};
use serde_json::Value;

/// Parse Prometheus text with `prometheus_client.parser` and return, per
/// family, its type and samples as `{"type": T, "samples": [[name, labels, value]]}`.
const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
out = {}
for fam in text_string_to_metric_families(sys.stdin.read()):
    if fam.name in out:
        raise SystemExit("family %s appears twice" % fam.name)
    out[fam.name] = {"type": fam.type, "help": fam.documentation,
                     "samples": [[s.name, s.labels, s.value] for s in fam.samples]}
print(json.dumps(out))
"#;

fn parse_metrics(text: &str) -> Value {
    let mut child = Command::new("/usr/bin/python3")
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 (install python3-prometheus-client)");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("feed the parser");
    let out = child.wait_with_output().expect("parser ran");
    assert!(
        out.status.success(),
        "the Prometheus parser rejected the metrics: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("parser output")
}

/// The value of the sample `name` with `labels` (each must match) in `parsed`.
fn sample(parsed: &Value, family: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    parsed[family]["samples"]
        .as_array()?
        .iter()
        .find(|s| s[0] == name && labels.iter().all(|(k, v)| s[1][*k].as_str() == Some(*v)))
        .and_then(|s| s[2].as_f64())
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("address").port()
}

fn http_get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").expect("send request");
    let mut all = String::new();
    s.read_to_string(&mut all).expect("read response");
    let (head, body) = all.split_once("\r\n\r\n").expect("head and body");
    (head.to_string(), body.to_string())
}

fn mount(m: &Mirror, options: &str) {
    check(m.mount_with(options), &format!("mount -o {options}"));
}

#[test]
fn metrics_parse_and_are_served_over_http() {
    if !fuse_available() {
        return;
    }
    let m = Mirror::create();
    let _guard = DaemonGuard::new(&m.mnt);
    let port = free_port();
    mount(&m, &format!("metrics=127.0.0.1:{port}"));
    let data = common::pattern(7, 1 << 20);
    common::write_synced(&m.mnt.join("f"), &data).expect("write through the mount");
    assert_eq!(fs::read(m.mnt.join("f")).expect("read back"), data);

    let mnt = m.mnt.to_string_lossy().into_owned();
    let text = raidfs_ok(&[OsStr::new("metrics"), m.mnt.as_os_str()], Path::new("/"));
    let parsed = parse_metrics(&text);
    assert_eq!(parsed["raidfs_member_write_bytes"]["type"], "counter");
    assert_eq!(parsed["raidfs_array_degraded"]["type"], "gauge");
    for member in ["m0", "m1"] {
        let path = m
            .dir
            .path()
            .join(member)
            .canonicalize()
            .expect("member path");
        let path = path.to_string_lossy();
        let labels = [("mount", mnt.as_str()), ("member", &*path)];
        let written = sample(
            &parsed,
            "raidfs_member_write_bytes",
            "raidfs_member_write_bytes_total",
            &labels,
        )
        .unwrap_or_else(|| panic!("no write bytes for {path}:\n{text}"));
        assert!(
            written >= data.len() as f64,
            "{member} wrote {written} bytes"
        );
        let ops = sample(
            &parsed,
            "raidfs_member_write_ops",
            "raidfs_member_write_ops_total",
            &labels,
        )
        .expect("write ops");
        let secs = sample(
            &parsed,
            "raidfs_member_write_seconds",
            "raidfs_member_write_seconds_total",
            &labels,
        )
        .expect("write seconds");
        assert!(
            ops > 0.0 && secs > 0.0,
            "{member}: {ops} writes in {secs} s"
        );
        let state = [
            ("mount", mnt.as_str()),
            ("member", &*path),
            ("state", "active"),
        ];
        assert_eq!(
            sample(
                &parsed,
                "raidfs_member_state",
                "raidfs_member_state",
                &state
            ),
            Some(1.0)
        );
    }
    let at = [("mount", mnt.as_str())];
    assert_eq!(
        sample(
            &parsed,
            "raidfs_array_degraded",
            "raidfs_array_degraded",
            &at
        ),
        Some(0.0)
    );
    let idle = [("mount", mnt.as_str()), ("action", "idle")];
    assert_eq!(
        sample(
            &parsed,
            "raidfs_array_sync_action",
            "raidfs_array_sync_action",
            &idle
        ),
        Some(1.0)
    );
    let free = sample(
        &parsed,
        "raidfs_array_free_bytes",
        "raidfs_array_free_bytes",
        &at,
    )
    .expect("free");
    let size = sample(
        &parsed,
        "raidfs_array_fs_size_bytes",
        "raidfs_array_fs_size_bytes",
        &at,
    )
    .expect("size");
    assert!(free > 0.0 && free < size, "free {free} of {size}");
    assert_eq!(
        sample(
            &parsed,
            "raidfs_array_mismatches",
            "raidfs_array_mismatches_total",
            &at
        ),
        Some(0.0)
    );

    // Every mount's metrics, as the textfile collector takes them.
    let prom = m.dir.path().join("raidfs.prom");
    raidfs_ok(
        &[OsStr::new("metrics"), OsStr::new("-o"), prom.as_os_str()],
        Path::new("/"),
    );
    let all = parse_metrics(&fs::read_to_string(&prom).expect("written file"));
    assert!(sample(&all, "raidfs_array_degraded", "raidfs_array_degraded", &at).is_some());

    // The same over HTTP.
    let (head, body) = http_get(port, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200 OK"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    let served = parse_metrics(&body);
    let written = sample(
        &served,
        "raidfs_member_write_bytes",
        "raidfs_member_write_bytes_total",
        &at,
    )
    .expect("served member write bytes");
    assert!(written >= data.len() as f64);
    let (head, _) = http_get(port, "/nowhere");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");
    m.umount();
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the endpoint closes with the mount"
    );
}

#[test]
fn bad_metrics_addresses_fail_the_mount() {
    if !fuse_available() {
        return;
    }
    let m = Mirror::create();
    let _guard = DaemonGuard::new(&m.mnt);
    let out = m.mount_with("metrics=localhost");
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("expected IP:PORT"),
        "{}",
        stderr(&out)
    );
    let taken = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = taken.local_addr().expect("address").port();
    let out = m.mount_with(&format!("metrics=127.0.0.1:{port}"));
    assert!(!out.status.success(), "mounted on a port in use");
    assert!(
        stderr(&out).contains("cannot listen there"),
        "{}",
        stderr(&out)
    );
    assert!(raidfs::cli::mount::daemon_pid(&m.mnt).is_none());
}

/// The numbers of the row whose name column holds `name` in an iostat
/// table, with their K/M/G suffixes applied (latency columns left out).
fn iostat_row(table: &str, name: &str) -> Vec<f64> {
    let line = table
        .lines()
        .find(|l| l.len() > 28 && l[..28].contains(name))
        .unwrap_or_else(|| panic!("no row {name} in\n{table}"));
    let fields: Vec<&str> = line[28..].split_whitespace().collect();
    fields[..4]
        .iter()
        .map(|f| {
            let (digits, scale) = match f.chars().last() {
                Some('K') => (&f[..f.len() - 1], 1e3),
                Some('M') => (&f[..f.len() - 1], 1e6),
                Some('G') => (&f[..f.len() - 1], 1e9),
                _ => (&f[..], 1.0),
            };
            digits
                .parse::<f64>()
                .unwrap_or_else(|_| panic!("{f} in {line}"))
                * scale
        })
        .collect()
}

#[test]
fn iostat_shows_writes_per_interval() {
    if !fuse_available() {
        return;
    }
    let m = Mirror::create();
    let _guard = DaemonGuard::new(&m.mnt);
    mount(&m, "");
    let stop = Arc::new(AtomicBool::new(false));
    let synced = Arc::new(AtomicU64::new(0));
    let writer = {
        let (stop, path) = (Arc::clone(&stop), m.mnt.join("busy"));
        let synced = Arc::clone(&synced);
        std::thread::spawn(move || {
            let f = fs::File::create(&path).expect("create");
            let block = common::pattern(3, 64 << 10);
            let mut at = 0u64;
            while !stop.load(Ordering::Acquire) {
                f.write_all_at(&block, at % (8 << 20)).expect("write");
                // Unsynced writes may wait in memory for the next commit.
                f.sync_data().expect("fdatasync");
                synced.fetch_add(1, Ordering::AcqRel);
                at += block.len() as u64;
            }
        })
    };
    // The first report covers the time since the mount: some writes first.
    let deadline = Instant::now() + Duration::from_secs(30);
    while synced.load(Ordering::Acquire) < 4 {
        assert!(Instant::now() < deadline, "the writer wrote nothing");
        std::thread::sleep(Duration::from_millis(10));
    }
    let out = raidfs(
        &[
            OsStr::new("iostat"),
            OsStr::new("-v"),
            m.mnt.as_os_str(),
            OsStr::new("1"),
            OsStr::new("2"),
        ],
        Path::new("/"),
    );
    stop.store(true, Ordering::Release);
    writer.join().expect("writer");
    let out = check(out, "iostat");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let tables: Vec<&str> = text.split("\n\n").collect();
    assert_eq!(tables.len(), 2, "two reports:\n{text}");
    for table in &tables {
        let array = iostat_row(table, "(raid1)");
        assert!(
            array[1] > 0.0 && array[3] > 0.0,
            "writes and bytes per second:\n{table}"
        );
        for member in ["  m0 [0]", "  m1 [1]"] {
            let row = iostat_row(table, member);
            assert!(row[1] > 0.0, "{member} writes:\n{table}");
        }
    }
    assert!(tables[0].contains("operations") && tables[0].contains("latency"));
    m.umount();
}

/// Every (member, offset) holding `marker` at a block start.
fn find_copies(images: &[PathBuf], marker: &[u8]) -> Vec<(PathBuf, u64)> {
    let mut found = Vec::new();
    for path in images {
        let image = fs::read(path).expect("image");
        for (n, chunk) in image.chunks(4096).enumerate() {
            if chunk.starts_with(marker) {
                found.push((path.clone(), (n * 4096) as u64));
            }
        }
    }
    found
}

fn status_v(mnt: &Path) -> String {
    raidfs_ok(
        &[OsStr::new("status"), OsStr::new("-v"), mnt.as_os_str()],
        Path::new("/"),
    )
}

/// Removes the host-side damaged-data log of the array when the test ends.
struct LogFile(PathBuf);

impl Drop for LogFile {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

#[test]
fn damaged_files_are_listed_until_deleted() {
    if !fuse_available() {
        return;
    }
    let m = Mirror::create();
    let _guard = DaemonGuard::new(&m.mnt);
    mount(&m, "");
    let uuid = detail_json(&m.mnt)["uuid"]
        .as_str()
        .expect("uuid")
        .to_string();
    let _log = LogFile(PathBuf::from(format!(
        "/var/lib/raidfs/damaged/{uuid}.json"
    )));
    let mut data = Vec::new();
    for b in 0..8 {
        let mut block = common::pattern(b as u8 + 1, 4096);
        let mark = format!("damaged-test block {b} ");
        block[..mark.len()].copy_from_slice(mark.as_bytes());
        data.extend(block);
    }
    fs::create_dir(m.mnt.join("dir")).expect("mkdir");
    common::write_synced(&m.mnt.join("dir/victim"), &data).expect("write");
    m.umount();

    // Both copies of block 2 get garbage behind raidfs's back.
    let images = [m.dir.path().join("m0"), m.dir.path().join("m1")];
    let copies = find_copies(&images, b"damaged-test block 2 ");
    assert_eq!(copies.len(), 2, "one copy per mirror: {copies:?}");
    for (image, at) in &copies {
        let f = fs::OpenOptions::new()
            .write(true)
            .open(image)
            .expect("open image");
        f.write_all_at(&[0x5a; 64], at + 100).expect("corrupt");
        f.sync_all().expect("sync image");
    }

    mount(&m, "");
    assert!(status_v(&m.mnt).contains("errors: No known data errors"));
    let err = fs::read(m.mnt.join("dir/victim")).expect_err("a block with no good copy");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let expected = format!("{}/dir/victim (offset 8192, 4096 bytes)", m.mnt.display());
    let said = status_v(&m.mnt);
    assert!(said.contains("Permanent errors"), "{said}");
    assert!(said.contains(&expected), "{said}");
    let report = detail_json(&m.mnt);
    assert_eq!(report["damaged"][0]["path"], "/dir/victim", "{report:#}");
    assert_eq!(report["damaged"][0]["offset"], 8192);
    assert_eq!(report["damaged"][0]["length"], 4096);
    let detail = raidfs_ok(&[OsStr::new("detail"), m.mnt.as_os_str()], Path::new("/"));
    assert!(detail.contains(&expected), "{detail}");
    let text = raidfs_ok(&[OsStr::new("metrics"), m.mnt.as_os_str()], Path::new("/"));
    let mnt = m.mnt.to_string_lossy().into_owned();
    let at = [("mount", mnt.as_str())];
    assert_eq!(
        sample(
            &parse_metrics(&text),
            "raidfs_array_damaged_ranges",
            "raidfs_array_damaged_ranges",
            &at
        ),
        Some(1.0)
    );
    // A repair cannot bring it back: it stays listed.
    raidfs_ok(&[OsStr::new("repair"), m.mnt.as_os_str()], Path::new("/"));
    assert!(status_v(&m.mnt).contains(&expected));

    // A remount still knows, before anything reads the file.
    m.umount();
    mount(&m, "");
    let said = status_v(&m.mnt);
    assert!(said.contains(&expected), "after a remount: {said}");

    fs::remove_file(m.mnt.join("dir/victim")).expect("delete the damaged file");
    let said = status_v(&m.mnt);
    assert!(said.contains("errors: No known data errors"), "{said}");
    assert_eq!(detail_json(&m.mnt)["damaged"], serde_json::json!([]));
    m.umount();
}
