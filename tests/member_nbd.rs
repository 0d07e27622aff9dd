//! The NBD client against real servers on loopback: nbdkit's memory and
//! file plugins (with filters that impose block sizes, delay, fail or hide
//! features) and qemu-nbd (sparse reads answered with holes). Every test
//! starts its own server and checks what it reads back byte for byte.

mod common;

use common::nbd::{nbd_available, sparse_image, Listen, NbdServer};
use raidfs::member::nbd::{proto, NbdMember, NbdOptions};
use raidfs::member::Member;
use rand::{RngCore, SeedableRng};
use std::io::Read;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

fn open(uri: &str) -> NbdMember {
    NbdMember::connect(uri, &NbdOptions::default()).expect("connect to the export")
}

#[test]
fn reads_writes_flush_and_fua_round_trip() {
    if !nbd_available() {
        return;
    }
    for listen in [Listen::Unix, Listen::Tcp] {
        let server = NbdServer::nbdkit(listen, &["memory", "size=16M"]);
        let m = open(&server.uri);
        assert_eq!(m.len(), 16 << 20);
        assert_eq!(m.name(), server.uri);
        let e = m.export();
        assert!(e.go && e.structured, "{}", m.describe());
        for flag in [
            proto::FLAG_SEND_FLUSH,
            proto::FLAG_SEND_FUA,
            proto::FLAG_SEND_TRIM,
            proto::FLAG_SEND_WRITE_ZEROES,
        ] {
            assert!(e.has(flag), "flag {flag:#x} missing: {}", m.describe());
        }
        let mut model = vec![0u8; 16 << 20];
        for (i, (at, len)) in [
            (0usize, 4096usize),
            (12345, 777),
            (1 << 20, 300_000),
            ((16 << 20) - 5, 5),
        ]
        .into_iter()
        .enumerate()
        {
            let data = pattern(len, i as u64);
            m.write_at(&data, at as u64).expect("write");
            model[at..at + len].copy_from_slice(&data);
        }
        let durable = pattern(4096, 99);
        m.write_durable(&durable, 8 << 20).expect("write with FUA");
        model[8 << 20..(8 << 20) + 4096].copy_from_slice(&durable);
        let bufs = [pattern(1000, 7), pattern(5000, 8)];
        m.write_vectored_at(&[&bufs[0], &bufs[1]], 3 << 20)
            .expect("vectored write");
        model[3 << 20..(3 << 20) + 1000].copy_from_slice(&bufs[0]);
        model[(3 << 20) + 1000..(3 << 20) + 6000].copy_from_slice(&bufs[1]);
        m.sync().expect("flush");
        let mut back = vec![0u8; 16 << 20];
        m.read_at(&mut back, 0).expect("read everything");
        assert!(back == model, "what was read differs from what was written");
        let mut past = [0u8; 2];
        let err = m
            .read_at(&mut past, (16 << 20) - 1)
            .expect_err("past the end");
        assert!(err.to_string().contains("past the end"), "{err}");
    }
}

#[test]
fn zeroes_discard_and_trim_reach_the_file() {
    if !nbd_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    sparse_image(&image, 8 << 20);
    let server = NbdServer::file(Listen::Unix, &image);
    let m = open(&server.uri);
    let data = pattern(4 << 20, 1);
    m.write_at(&data, 0).expect("write");
    m.sync().expect("flush");
    let allocated = |p: &std::path::Path| {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(p).expect("stat image").blocks() * 512
    };
    assert!(allocated(&image) >= 4 << 20);
    // Unaligned edges are written as zeros, the middle becomes a hole.
    m.zero_range(100, (1 << 20) - 200).expect("zero range");
    assert!(m.can_discard());
    m.discard(1 << 20, 2 << 20).expect("discard");
    m.sync().expect("flush");
    let mut expect = data.clone();
    expect[100..(1 << 20) - 100].fill(0);
    expect[1 << 20..3 << 20].fill(0);
    let mut back = vec![0u8; 4 << 20];
    m.read_at(&mut back, 0).expect("read");
    assert!(back == expect, "zeroed ranges do not read as zeros");
    // The server read the same bytes into the file.
    let mut on_disk = vec![0u8; 4 << 20];
    std::fs::File::open(&image)
        .and_then(|mut f| f.read_exact(&mut on_disk))
        .expect("read image");
    assert!(on_disk == expect, "the image file differs");
    assert!(
        allocated(&image) <= 2 << 20,
        "discard gave no space back: {} bytes allocated",
        allocated(&image)
    );
    // TRIM is accepted (what a trimmed range reads as is the server's).
    m.trim(3 << 20, 1 << 20).expect("trim");
}

#[test]
fn without_write_zeroes_zeros_are_written_and_discard_is_refused() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(Listen::Unix, &["--filter=nozero", "memory", "size=4M"]);
    let m = open(&server.uri);
    assert!(
        !m.export().has(proto::FLAG_SEND_WRITE_ZEROES),
        "{}",
        m.describe()
    );
    m.write_at(&pattern(1 << 20, 3), 0).expect("write");
    m.zero_range(10, 500_000).expect("zeros written instead");
    let mut back = vec![1u8; 500_000];
    m.read_at(&mut back, 10).expect("read");
    assert!(back.iter().all(|&b| b == 0));
    assert!(!m.can_discard());
    let err = m.discard(0, 4096).expect_err("no discard");
    assert_eq!(err.kind(), std::io::ErrorKind::Unsupported);
}

#[test]
fn block_size_constraints_are_honoured() {
    if !nbd_available() {
        return;
    }
    // The server refuses (EINVAL) any request that breaks its constraints.
    let server = NbdServer::nbdkit(
        Listen::Unix,
        &[
            "--filter=blocksize-policy",
            "memory",
            "size=8M",
            "blocksize-minimum=512",
            "blocksize-preferred=4096",
            "blocksize-maximum=65536",
            "blocksize-error-policy=error",
        ],
    );
    let m = open(&server.uri);
    let e = m.export();
    assert_eq!(
        (e.min_block, e.pref_block, e.max_payload),
        (512, 4096, 65536)
    );
    let mut model = vec![0u8; 8 << 20];
    // Large and unaligned: split at 64 KiB, edges read-modify-written.
    for (i, (at, len)) in [
        (1000usize, 1_000_000usize),
        (0, 2 << 20),
        (4 << 20, 1),
        (5 << 20, 511),
    ]
    .into_iter()
    .enumerate()
    {
        let data = pattern(len, 10 + i as u64);
        m.write_at(&data, at as u64).expect("write");
        model[at..at + len].copy_from_slice(&data);
    }
    m.write_durable(&pattern(100, 20), 7 << 20)
        .expect("fua write");
    model[7 << 20..(7 << 20) + 100].copy_from_slice(&pattern(100, 20));
    m.zero_range(3, 200_000).expect("zero");
    model[3..200_003].fill(0);
    let mut back = vec![0u8; 8 << 20];
    m.read_at(&mut back, 0).expect("read");
    assert!(back == model, "what was read differs");
    let mut piece = vec![0u8; 333];
    m.read_at(&mut piece, 12_345).expect("unaligned read");
    assert_eq!(piece, model[12_345..12_678]);
}

#[test]
fn simple_replies_without_structured_ones() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(Listen::Unix, &["--no-sr", "memory", "size=4M"]);
    let m = open(&server.uri);
    assert!(!m.export().structured, "{}", m.describe());
    let data = pattern(3 << 20, 5);
    m.write_at(&data, 4096).expect("write");
    let mut back = vec![0u8; 3 << 20];
    m.read_at(&mut back, 4096).expect("read");
    assert!(back == data);
}

#[test]
fn sparse_reads_come_back_as_holes_and_data() {
    if !nbd_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("sparse.img");
    sparse_image(&image, 8 << 20);
    let data = pattern(100_000, 6);
    std::os::unix::fs::FileExt::write_all_at(
        &std::fs::OpenOptions::new()
            .write(true)
            .open(&image)
            .expect("open"),
        &data,
        3 << 20,
    )
    .expect("write into the image");
    let server = NbdServer::qemu(&image);
    let m = open(&server.uri);
    assert!(m.export().structured, "{}", m.describe());
    let mut back = vec![0xffu8; 8 << 20];
    m.read_at(&mut back, 0).expect("read");
    let mut expect = vec![0u8; 8 << 20];
    expect[3 << 20..(3 << 20) + 100_000].copy_from_slice(&data);
    assert!(back == expect, "holes or data read wrong");
}

#[test]
fn an_error_chunk_fails_the_request_with_the_servers_errno() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(
        Listen::Unix,
        &[
            "--filter=error",
            "memory",
            "size=4M",
            "error-pread=EIO",
            "error-pread-rate=1",
        ],
    );
    let m = open(&server.uri);
    let mut buf = vec![0u8; 4096];
    let err = m.read_at(&mut buf, 0).expect_err("the server fails reads");
    assert_eq!(
        raidfs::member::file::os_error_code(&err),
        Some(libc::EIO),
        "{err}"
    );
    assert!(err.to_string().contains(&server.uri), "{err}");
    // One failed request leaves the connection usable.
    m.write_at(&pattern(4096, 1), 0)
        .expect("write after a failed read");
    assert!(m.broken().is_none());
}

#[test]
fn many_requests_are_in_flight_at_once() {
    if !nbd_available() {
        return;
    }
    // Every read takes a second at the server.
    let server = NbdServer::nbdkit(
        Listen::Unix,
        &["--filter=delay", "memory", "size=16M", "delay-read=1"],
    );
    let m = Arc::new(open(&server.uri));
    let data = pattern(16 << 20, 8);
    m.write_at(&data, 0).expect("write");
    let started = Instant::now();
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let m = Arc::clone(&m);
            std::thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 20];
                m.read_at(&mut buf, (i as u64) << 21).map(|()| buf)
            })
        })
        .collect();
    for (i, t) in threads.into_iter().enumerate() {
        let buf = t.join().expect("reader thread").expect("read");
        assert!(buf == data[i << 21..(i << 21) + (1 << 20)]);
    }
    // One after another they would take 8 s.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(5), "8 reads took {took:?}");
}

/// A server over `image` whose reads take a minute, logging requests as
/// they arrive to `log`.
fn slow_reader_args(image: &std::path::Path, log: &std::path::Path) -> Vec<String> {
    vec![
        "--filter=log".into(),
        "--filter=delay".into(),
        "file".into(),
        format!("file={}", image.display()),
        "delay-read=60".into(),
        format!("logfile={}", log.display()),
    ]
}

/// Wait until the log filter has recorded a read arriving.
fn wait_for_read(log: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(log).is_ok_and(|l| l.contains(" Read id=")) {
        assert!(
            Instant::now() < deadline,
            "the read never reached the server"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn reader(m: &Arc<NbdMember>, len: usize) -> std::thread::JoinHandle<std::io::Result<Vec<u8>>> {
    let m = Arc::clone(m);
    std::thread::spawn(move || {
        let mut buf = vec![0u8; len];
        m.read_at(&mut buf, 0).map(|()| buf)
    })
}

#[test]
fn a_killed_server_fails_requests_in_flight_once_reconnecting_fails() {
    if !nbd_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    sparse_image(&image, 4 << 20);
    let log = dir.path().join("requests.log");
    let args = slow_reader_args(&image, &log);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = NbdServer::nbdkit(Listen::Tcp, &args);
    let m = Arc::new(open(&server.uri));
    let read = reader(&m, 4096);
    wait_for_read(&log);
    let killed = Instant::now();
    server.kill();
    let err = read
        .join()
        .expect("reader thread")
        .expect_err("the server died");
    // The reconnection attempts (3.1 s of backoff) find nothing listening.
    let took = killed.elapsed();
    assert!(took < Duration::from_secs(10), "the failure took {took:?}");
    let text = err.to_string();
    assert!(
        text.contains(&server.uri)
            && text.contains("closed the connection")
            && text.contains("reconnecting failed 5 times"),
        "{text}"
    );
    assert_eq!(m.reconnects(), 0);
    // The member stays failed: later requests fail at once.
    let started = Instant::now();
    let again = m.write_at(&[1u8; 512], 0).expect_err("still dead");
    assert!(started.elapsed() < Duration::from_secs(1));
    assert!(again.to_string().contains("reconnecting failed"), "{again}");
    assert!(m.broken().is_some());
}

#[test]
fn a_read_in_flight_survives_a_server_restart() {
    if !nbd_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    sparse_image(&image, 4 << 20);
    let log = dir.path().join("requests.log");
    let args = slow_reader_args(&image, &log);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut server = NbdServer::nbdkit(Listen::Unix, &args);
    let m = Arc::new(open(&server.uri));
    let data = pattern(1 << 20, 11);
    m.write_at(&data, 0).expect("write");
    m.sync().expect("flush");
    let read = reader(&m, 1 << 20);
    wait_for_read(&log);
    // The same export at the same address, reading at full speed now.
    let file = format!("file={}", image.display());
    server.restart_nbdkit(&["file", &file]);
    let back = read
        .join()
        .expect("reader thread")
        .expect("read after the restart");
    assert!(back == data, "the repeated read returned other bytes");
    assert_eq!(m.reconnects(), 1);
    assert!(m.broken().is_none());
    m.write_at(&[7u8; 4096], 8192)
        .expect("write on the new connection");
    m.sync().expect("flush on the new connection");
}

#[test]
fn an_idle_member_reconnects_but_not_over_unflushed_writes() {
    if !nbd_available() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let image = dir.path().join("disk.img");
    sparse_image(&image, 4 << 20);
    let file = format!("file={}", image.display());
    let mut server = NbdServer::nbdkit(Listen::Unix, &["file", &file]);
    let m = open(&server.uri);
    let data = pattern(100_000, 12);
    m.write_at(&data, 5000).expect("write");
    m.sync().expect("flush");
    server.restart_nbdkit(&["file", &file]);
    // Everything acknowledged was flushed: the next request reconnects.
    let mut back = vec![0u8; 100_000];
    m.read_at(&mut back, 5000).expect("read after the restart");
    assert!(back == data);
    assert_eq!(m.reconnects(), 1);
    // A write the server acknowledged but never flushed may die with it:
    // no reconnection then, the member fails.
    m.write_at(&data, 300_000).expect("write");
    server.restart_nbdkit(&["file", &file]);
    let err = m.read_at(&mut back, 5000).expect_err("unflushed writes");
    assert!(err.to_string().contains("since the last flush"), "{err}");
    assert_eq!(m.reconnects(), 1);
    assert!(
        m.sync().is_err(),
        "a flush cannot vouch for the lost writes"
    );
}

#[test]
fn a_hung_server_times_out_with_a_clear_error() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(Listen::Unix, &["memory", "size=4M"]);
    let options = NbdOptions {
        request_timeout: Duration::from_secs(1),
        ..NbdOptions::default()
    };
    let m = NbdMember::connect(&server.uri, &options).expect("connect");
    server.freeze();
    let started = Instant::now();
    let mut buf = vec![0u8; 4096];
    let err = m
        .read_at(&mut buf, 0)
        .expect_err("no reply from a stopped server");
    let took = started.elapsed();
    server.thaw();
    assert!(
        took >= Duration::from_secs(1) && took < Duration::from_secs(10),
        "timed out after {took:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&server.uri) && text.contains("no reply within 1 s"),
        "{text}"
    );
    assert_eq!(
        raidfs::member::file::os_error_code(&err),
        Some(libc::ETIMEDOUT)
    );
}

#[test]
fn a_silent_listener_fails_the_connect_in_time() {
    // Accepts connections (the kernel does) but never says NBDMAGIC.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    let port = listener.local_addr().expect("address").port();
    let uri = format!("nbd://127.0.0.1:{port}/x");
    let options = NbdOptions {
        connect_timeout: Duration::from_secs(1),
        ..NbdOptions::default()
    };
    let started = Instant::now();
    let err = NbdMember::connect(&uri, &options)
        .err()
        .expect("no handshake");
    assert!(started.elapsed() < Duration::from_secs(10));
    let text = err.to_string();
    assert!(
        text.contains(&uri) && text.contains("connect timeout"),
        "{text}"
    );
    drop(listener);
    // Nothing listens now: refused at once.
    let err = NbdMember::connect(&uri, &options).err().expect("refused");
    assert!(err.to_string().contains(&uri), "{err}");
}

#[test]
fn a_read_only_export_is_refused_for_a_writable_member() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(Listen::Unix, &["--readonly", "memory", "size=4M"]);
    let err = NbdMember::connect(&server.uri, &NbdOptions::default())
        .err()
        .expect("read-only export");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert_eq!(raidfs::member::file::os_error_code(&err), Some(libc::EROFS));
    let options = NbdOptions {
        read_only: true,
        ..NbdOptions::default()
    };
    let m = NbdMember::connect(&server.uri, &options).expect("read-only member");
    let mut buf = vec![1u8; 4096];
    m.read_at(&mut buf, 0).expect("read");
    assert!(buf.iter().all(|&b| b == 0));
    assert!(m.write_at(&buf, 0).is_err());
}

/// The requests nbdkit's log filter recorded as they arrived (their
/// completions are the lines with "...Command"), without the timestamp
/// and connection number.
fn requests(log: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(" id=") && l.ends_with(" ..."))
        .map(|l| {
            l.split_once("connection=")
                .map_or(l, |(_, r)| r)
                .to_string()
        })
        .collect()
}

#[test]
fn the_server_sees_the_commands_each_operation_promises() {
    if !nbd_available() {
        return;
    }
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("requests.log");
    let logfile = format!("logfile={}", log.display());
    let server = NbdServer::nbdkit(
        Listen::Unix,
        &["--filter=log", "memory", "size=64M", &logfile],
    );
    let m = open(&server.uri);
    let seen = |what: &str| {
        let all = requests(&log);
        assert!(
            all.iter().any(|l| l.contains(what)),
            "no request like {what:?} among:\n{}",
            all.join("\n")
        );
    };
    m.write_at(&[1u8; 4096], 0).expect("write");
    seen("Write id=1 offset=0x0 count=0x1000 fua=0");
    m.write_durable(&[2u8; 4096], 0x2000)
        .expect("durable write");
    seen("Write id=2 offset=0x2000 count=0x1000 fua=1");
    m.sync().expect("sync");
    seen("Flush id=3");
    m.discard(1 << 20, 1 << 20).expect("discard");
    seen("Zero id=4 offset=0x100000 count=0x100000 trim=1");
    m.trim(4 << 20, 1 << 20).expect("trim");
    seen("Trim id=5 offset=0x400000 count=0x100000");
    // 40 MiB in one call: the default maximum payload is 32 MiB.
    let mut big = vec![0u8; 40 << 20];
    m.read_at(&mut big, 0).expect("read");
    seen("Read id=6 offset=0x0 count=0x2000000");
    seen("Read id=7 offset=0x2000000 count=0x800000");
    assert_eq!(&big[..4096], &[1u8; 4096][..]);
    assert_eq!(&big[0x2000..0x3000], &[2u8; 4096][..]);
}

#[test]
fn a_server_without_fixed_newstyle_gets_export_name() {
    if !nbd_available() {
        return;
    }
    // Plain newstyle: only NBD_OPT_EXPORT_NAME, no options, no structured replies.
    let server = NbdServer::nbdkit(Listen::Unix, &["--mask-handshake=0", "memory", "size=4M"]);
    let m = open(&server.uri);
    let e = m.export();
    assert!(!e.go && !e.structured, "{}", m.describe());
    let data = pattern(100_000, 9);
    m.write_at(&data, 777).expect("write");
    let mut back = vec![0u8; 100_000];
    m.read_at(&mut back, 777).expect("read");
    assert!(back == data);
}

#[test]
fn an_oldstyle_server_is_refused_with_a_reason() {
    if !nbd_available() {
        return;
    }
    let server = NbdServer::nbdkit(Listen::Unix, &["--oldstyle", "memory", "size=4M"]);
    let err = NbdMember::connect(&server.uri, &NbdOptions::default())
        .err()
        .expect("oldstyle");
    assert!(err.to_string().contains("oldstyle"), "{err}");
}

#[test]
fn a_server_without_flush_is_synced_without_one() {
    if !nbd_available() {
        return;
    }
    let logs = tempfile::tempdir().expect("temp dir");
    let log = logs.path().join("requests.log");
    let logfile = format!("logfile={}", log.display());
    let server = NbdServer::nbdkit(
        Listen::Unix,
        &[
            "--filter=log",
            "eval",
            "get_size=echo 1048576",
            "pread=head -c $3 /dev/zero",
            "pwrite=cat >/dev/null",
            &logfile,
        ],
    );
    let m = open(&server.uri);
    assert!(!m.export().has(proto::FLAG_SEND_FLUSH), "{}", m.describe());
    assert!(m.describe().contains("flush no"));
    m.write_at(&[1u8; 512], 0).expect("write");
    m.sync().expect("sync has nothing to send");
    m.write_durable(&[1u8; 512], 512).expect("durable write");
    let all = requests(&log);
    assert!(
        !all.iter()
            .any(|l| l.contains("Flush") || l.contains("fua=1")),
        "{}",
        all.join("\n")
    );
}

#[test]
fn reconnecting_stays_within_the_request_timeout() {
    if !nbd_available() {
        return;
    }
    let mut server = NbdServer::nbdkit(Listen::Unix, &["memory", "size=4M"]);
    let options = NbdOptions {
        request_timeout: Duration::from_secs(1),
        ..NbdOptions::default()
    };
    let m = NbdMember::connect(&server.uri, &options).expect("connect");
    server.kill();
    let started = Instant::now();
    let mut buf = vec![0u8; 4096];
    let err = m.read_at(&mut buf, 0).expect_err("nobody listens");
    let took = started.elapsed();
    // 0.1 + 0.2 + 0.4 s of backoff fit in the second; 0.8 more do not.
    assert!(took < Duration::from_secs(3), "took {took:?}");
    assert!(
        err.to_string().contains("reconnecting failed 3 times"),
        "{err}"
    );
}
