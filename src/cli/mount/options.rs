//! `raidfs mount -o OPTIONS`: parsing the comma-separated option list.
//!
//! Besides raidfs's own options it accepts what mount(8), fstab and systemd
//! put in an option list: their bookkeeping options are dropped, and the
//! per-mount VFS flags (`nosuid`, `noexec`, `noatime`, ...) are collected in
//! [`VfsFlags`] and applied to the mount once it is up.

use std::path::PathBuf;
use std::time::Duration;

use crate::fuse::MountConfig;

/// Everything `-o` can set.
#[derive(Clone, Debug, Default)]
pub struct MountOptions {
    pub fuse: MountConfig,
    /// Assemble a dirty, degraded parity array anyway.
    pub force: bool,
    /// Clear the mount if the daemon dies without unmounting.
    pub auto_unmount: bool,
    pub log: Option<PathBuf>,
    /// Parity kernel to use instead of the benchmarked choice.
    pub parity: Option<String>,
    /// Read balancing policy for mirrors (sticky, round-robin, first, legacy).
    pub balance: Option<crate::array::ReadPolicy>,
    /// Whether image-file members behave like rotating disks (`rotational=0|1`).
    pub rotational: Option<bool>,
    /// Members to read from only when no other copy can serve
    /// (`write_mostly=MEMBER`, repeatable): paths, NBD URIs or slot numbers.
    pub write_mostly: Vec<String>,
    /// NBD members a stall should fail at once (`failfast=MEMBER`,
    /// repeatable): a 5 s request timeout and no reconnection.
    pub failfast: Vec<String>,
    /// Writes answered before they are done (`deferred_writes=N`, 0 for
    /// none); by default half the FUSE threads.
    pub deferred_writes: Option<usize>,
    /// Small writes that may wait in the write queue (`queued_writes=N`, 0
    /// for no queue); by default [`DEFAULT_QUEUED_WRITES`].
    pub queued_writes: Option<usize>,
    /// Most seconds between journal commits (`commit=SECS`): what a crash
    /// can lose of writes that were not fsync'd.
    pub commit_secs: Option<u64>,
    /// Bytes of unchanged inodes kept in memory (`metadata_cache=SIZE`);
    /// by default [`crate::fs::DEFAULT_METADATA_CACHE`].
    pub metadata_cache: Option<u64>,
    /// Per-mount flags asked for with the generic mount options.
    pub vfs: VfsFlags,
    /// What writes do while the host fails every member (`on_host_error=`).
    pub on_host_error: crate::array::OnHostError,
    /// Where to serve Prometheus metrics over HTTP (`metrics=IP:PORT`).
    pub metrics: Option<std::net::SocketAddr>,
}

/// Per-mount flags (`MS_NOSUID`, `MS_NOEXEC`, atime modes...) to set and to
/// clear on the mount after it is made. Empty when no generic option asked
/// for a change, and then the mount is left as FUSE made it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VfsFlags {
    pub set: u64,
    pub clear: u64,
}

/// The atime modes exclude each other: choosing one clears the others.
const ATIME_MODES: u64 = libc::MS_NOATIME | libc::MS_RELATIME | libc::MS_STRICTATIME;

impl VfsFlags {
    pub fn is_empty(&self) -> bool {
        self.set == 0 && self.clear == 0
    }

    fn turn_on(&mut self, flag: u64) {
        self.set |= flag;
        self.clear &= !flag;
    }

    fn turn_off(&mut self, flag: u64) {
        self.clear |= flag;
        self.set &= !flag;
    }

    /// The atime mode the filesystem applies on reads: FUSE leaves atime to
    /// it (relatime unless the mount asks for noatime or strictatime).
    pub fn atime_mode(&self) -> crate::fs::atime::AtimeMode {
        use crate::fs::atime::AtimeMode;
        if self.has(libc::MS_NOATIME) {
            AtimeMode::Never
        } else if self.has(libc::MS_STRICTATIME) {
            AtimeMode::Strict
        } else {
            AtimeMode::Relative
        }
    }

    /// Whether the mount asked for `flag` to be set.
    pub fn has(&self, flag: u64) -> bool {
        self.set & flag != 0
    }

    fn set_atime_mode(&mut self, mode: u64) {
        self.turn_off(ATIME_MODES & !mode);
        self.turn_on(mode);
    }

    /// The flags for a bind remount of a mount that now has `current`.
    pub fn applied_to(&self, current: u64) -> u64 {
        (current | self.set) & !self.clear
    }
}

/// How an option that is not raidfs's own is handled.
enum Generic {
    /// Bookkeeping of mount(8), fstab or systemd: nothing for raidfs to do.
    Ignored,
    /// A per-mount flag.
    Flag(fn(&mut VfsFlags)),
}

/// Options that mount(8), fstab(5) and systemd.mount(5) define. `sync`,
/// `dirsync` and `mand` are not here: raidfs cannot honour them, so they
/// stay errors rather than being silently dropped.
fn generic_option(key: &str, value: Option<&str>) -> Option<Generic> {
    use Generic::{Flag, Ignored};
    let ignored_with_value = ["comment", "uhelper", "helper"];
    if key.starts_with("x-") || key.starts_with("X-") || ignored_with_value.contains(&key) {
        return Some(Ignored);
    }
    if value.is_some() {
        return None;
    }
    Some(match key {
        "defaults" | "auto" | "noauto" | "_netdev" | "nofail" | "user" | "nouser" | "users"
        | "owner" | "group" | "async" | "nomand" | "silent" | "loud" | "lazytime"
        | "nolazytime" | "iversion" | "noiversion" => Ignored,
        "suid" => Flag(|f| f.turn_off(libc::MS_NOSUID)),
        "nosuid" => Flag(|f| f.turn_on(libc::MS_NOSUID)),
        "dev" => Flag(|f| f.turn_off(libc::MS_NODEV)),
        "nodev" => Flag(|f| f.turn_on(libc::MS_NODEV)),
        "exec" => Flag(|f| f.turn_off(libc::MS_NOEXEC)),
        "noexec" => Flag(|f| f.turn_on(libc::MS_NOEXEC)),
        "diratime" => Flag(|f| f.turn_off(libc::MS_NODIRATIME)),
        "nodiratime" => Flag(|f| f.turn_on(libc::MS_NODIRATIME)),
        "atime" | "norelatime" | "nostrictatime" => Flag(|f| f.set_atime_mode(0)),
        "noatime" => Flag(|f| f.set_atime_mode(libc::MS_NOATIME)),
        "relatime" => Flag(|f| f.set_atime_mode(libc::MS_RELATIME)),
        "strictatime" => Flag(|f| f.set_atime_mode(libc::MS_STRICTATIME)),
        _ => return None,
    })
}

/// The longest `commit=` interval: an hour of unsynced writes is already
/// more than anyone should stand to lose.
/// The largest `metadata_cache=`.
pub const MAX_METADATA_CACHE: u64 = 64 << 30;
pub const MAX_COMMIT_SECS: u64 = 3600;

/// Small writes waiting in the write queue by default (`queued_writes=`):
/// at most 64 copies of under 16 KiB each, a megabyte.
pub const DEFAULT_QUEUED_WRITES: usize = 64;

/// How long the write queue's thread stays awake for the next small write
/// once it has caught up, unless `busy_poll=0` asks that no thread poll: a
/// writer issuing one small write after another queues the next within
/// tens of microseconds, and a queue thread found asleep costs the answer
/// a wake-up. RAID5 4 KiB random writes, three rounds in the same minutes:
/// 43,802 against 37,630 IOPS (20 µs: 36,484; docs/performance.md, "The
/// FUSE floor").
pub const QUEUE_SPIN: std::time::Duration = std::time::Duration::from_micros(100);

/// The deepest write queue (`queued_writes=`): 4096 writes of under 16 KiB
/// are 64 MiB of copies.
pub const MAX_QUEUED_WRITES: usize = 4096;

/// raidfs's own options, as `mount --help`, the man page and the error for
/// an unknown option show them: the form, then what it does (docs/cli.md
/// has the whole story; a test checks every one is there and parses).
pub const OPTIONS: &[(&str, &str)] = &[
    ("ro", "read-only: no writes reach the members, no resync"),
    ("rw", "read-write (default)"),
    ("allow_other", "let users other than the mounting one in"),
    (
        "default_permissions",
        "the kernel checks permissions from the mode bits",
    ),
    (
        "force",
        "forced assembly of members that disagree about who failed",
    ),
    (
        "auto_unmount",
        "clear the mount if the daemon dies without unmounting",
    ),
    ("kernel_cache", "keep a file's page cache across opens"),
    (
        "writeback_cache",
        "let the kernel cache writes and send them in batches",
    ),
    (
        "direct_io",
        "no page cache for file data (every open as O_DIRECT)",
    ),
    (
        "io_uring",
        "serve requests over FUSE io_uring when the kernel offers it",
    ),
    (
        "attr_timeout=SECS",
        "kernel attribute cache lifetime (default 1)",
    ),
    (
        "entry_timeout=SECS",
        "kernel name cache lifetime (default 1)",
    ),
    (
        "threads=N",
        "request-serving threads, 1 to 256 (default: CPU count, 4 to 16)",
    ),
    (
        "busy_poll=USECS",
        "how long a FUSE thread polls for the next request before it sleeps, 0 to 10000 (default 50; 0: off, and the write queue's thread sleeps as soon as it has caught up)",
    ),
    (
        "busy_poll_mode=measure|always",
        "measure (default: poll a stream of quick requests only while that is faster) or always",
    ),
    (
        "deferred_writes=N",
        "writes answered before they are done, 0 to 256 (default: half the threads)",
    ),
    (
        "queued_writes=N",
        "writes under 16 KiB answered at once and done in order by a writer thread, up to N waiting, 0 to 4096 (default 64; 0, or deferred_writes=0, does them before the answer)",
    ),
    (
        "commit=SECS",
        "most seconds between journal commits, 1 to 3600 (default 5)",
    ),
    (
        "metadata_cache=SIZE",
        "memory for metadata beside the tree: half for unchanged inodes, half for changes waiting for a checkpoint, 0 to 64G (default 64M); the daemon's memory follows it, not the number of files",
    ),
    (
        "read_ahead_kb=N",
        "kernel readahead in KiB, 0 to 65536 (default 4096)",
    ),
    (
        "log=PATH",
        "daemon log file, or `syslog` (default: /var/log/raidfs/ARRAY.log)",
    ),
    (
        "parity=KERNEL",
        "parity kernel instead of the benchmarked one (see `raidfs bench`)",
    ),
    (
        "balance=POLICY",
        "how mirror reads choose a member: sticky (default), round-robin, first, legacy",
    ),
    (
        "rotational=0|1",
        "treat image-file members as SSDs (0) or rotating disks (1)",
    ),
    (
        "write_mostly=MEMBER",
        "read from MEMBER (path, NBD URI or slot) only when no other copy can serve; repeatable",
    ),
    (
        "failfast=MEMBER",
        "fail NBD member MEMBER (its URI) after a 5 s stall, without reconnecting; repeatable",
    ),
    (
        "on_host_error=fail|wait",
        "writes while the host fails every member: fail with EIO (default) or wait",
    ),
    (
        "metrics=IP:PORT",
        "serve Prometheus metrics over HTTP at this address (GET /metrics)",
    ),
];

/// The options of mount(8), fstab(5) and systemd.mount(5) that are taken.
pub const GENERIC_OPTIONS: &str = "defaults, nofail, noauto, _netdev, x-*, nosuid, nodev, \
    noexec, noatime, relatime, strictatime, nodiratime, ...";

/// The forms of every option, for an error.
pub fn known_options() -> String {
    let own: Vec<&str> = OPTIONS.iter().map(|(form, _)| *form).collect();
    format!(
        "{}; and the generic ones of mount(8) and systemd: {GENERIC_OPTIONS}",
        own.join(", ")
    )
}

/// The `-o` help of `raidfs mount --help` and its man page: one option a line.
pub fn long_help() -> String {
    let width = OPTIONS
        .iter()
        .map(|(form, _)| form.len())
        .max()
        .unwrap_or(0);
    let mut out = String::from("Mount options, comma-separated (repeatable; later ones win):\n\n");
    for (form, what) in OPTIONS {
        out.push_str(&format!("  {form:<width$}  {what}\n"));
    }
    out.push_str(&format!(
        "\nAlso the generic options of mount(8), fstab(5) and systemd: {GENERIC_OPTIONS}"
    ));
    out
}

/// Whether one option (no commas) is accepted by [`parse`].
pub fn is_accepted(option: &str) -> bool {
    parse(&[option.to_string()]).is_ok()
}

/// Parse every `-o` argument (each a comma-separated list) in order; later
/// options override earlier ones.
pub fn parse(lists: &[String]) -> Result<MountOptions, String> {
    let mut opts = MountOptions::default();
    for option in lists
        .iter()
        .flat_map(|list| list.split(','))
        .map(str::trim)
        .filter(|o| !o.is_empty())
    {
        let (key, value) = match option.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (option, None),
        };
        match (key, value) {
            ("ro", None) => opts.fuse.read_only = true,
            ("rw", None) => opts.fuse.read_only = false,
            ("allow_other", None) => opts.fuse.allow_other = true,
            ("default_permissions", None) => opts.fuse.default_permissions = true,
            ("force", None) => opts.force = true,
            ("auto_unmount", None) => opts.auto_unmount = true,
            ("kernel_cache", None) => opts.fuse.kernel_cache = true,
            ("writeback_cache", None) => opts.fuse.writeback_cache = true,
            ("direct_io", None) => opts.fuse.direct_io = true,
            ("io_uring", None) => opts.fuse.io_uring = true,
            ("attr_timeout", Some(v)) => opts.fuse.attr_timeout = seconds(key, v)?,
            ("entry_timeout", Some(v)) => opts.fuse.entry_timeout = seconds(key, v)?,
            ("threads", Some(v)) => {
                opts.fuse.threads = match v.parse::<usize>() {
                    Ok(n) if (1..=256).contains(&n) => n,
                    _ => {
                        return Err(format!(
                            "threads={v}: expected a number of threads from 1 to 256"
                        ))
                    }
                }
            }
            ("busy_poll", Some(v)) => {
                opts.fuse.busy_poll = match v.parse::<u64>() {
                    Ok(us) if us <= 10_000 => Duration::from_micros(us),
                    _ => {
                        return Err(format!(
                            "busy_poll={v}: expected microseconds from 0 (off) to 10000"
                        ))
                    }
                }
            }
            ("busy_poll_mode", Some(v)) => {
                opts.fuse.busy_poll_always = match v {
                    "measure" => false,
                    "always" => true,
                    _ => {
                        return Err(format!(
                            "busy_poll_mode={v}: expected `measure` or `always`"
                        ))
                    }
                }
            }
            ("deferred_writes", Some(v)) => {
                opts.deferred_writes = match v.parse::<usize>() {
                    Ok(n) if n <= 256 => Some(n),
                    _ => {
                        return Err(format!(
                            "deferred_writes={v}: expected a number of writes from 0 (off) to 256"
                        ))
                    }
                }
            }
            ("queued_writes", Some(v)) => {
                opts.queued_writes = match v.parse::<usize>() {
                    Ok(n) if n <= MAX_QUEUED_WRITES => Some(n),
                    _ => {
                        return Err(format!(
                            "queued_writes={v}: expected a number of writes from 0 (no queue) to {MAX_QUEUED_WRITES}"
                        ))
                    }
                }
            }
            ("commit", Some(v)) => {
                opts.commit_secs = match v.parse::<u64>() {
                    Ok(secs) if (1..=MAX_COMMIT_SECS).contains(&secs) => Some(secs),
                    _ => {
                        return Err(format!(
                            "commit={v}: expected seconds between journal commits, from 1 to {MAX_COMMIT_SECS}"
                        ))
                    }
                }
            }
            ("metadata_cache", Some(v)) => {
                opts.metadata_cache = match crate::cli::create::parse_size(v) {
                    Ok(bytes) if bytes <= MAX_METADATA_CACHE => Some(bytes),
                    Ok(_) => {
                        return Err(format!(
                            "metadata_cache={v}: at most 64G of metadata cache"
                        ))
                    }
                    Err(e) => return Err(format!("metadata_cache={v}: {e}")),
                }
            }
            ("read_ahead_kb", Some(v)) => {
                opts.fuse.read_ahead = match v.parse::<u32>() {
                    Ok(kib) if kib <= 65_536 => kib * 1024,
                    _ => {
                        return Err(format!(
                            "read_ahead_kb={v}: expected KiB from 0 (kernel default) to 65536"
                        ))
                    }
                }
            }
            ("log", Some(v)) if !v.is_empty() => opts.log = Some(PathBuf::from(v)),
            ("parity", Some(v)) if !v.is_empty() => opts.parity = Some(v.to_string()),
            ("balance", Some(v)) => {
                opts.balance = Some(v.parse().map_err(|e| format!("balance={v}: {e}"))?)
            }
            ("on_host_error", Some(v)) => opts.on_host_error = v.parse()?,
            ("metrics", Some(v)) => {
                opts.metrics = Some(crate::control::metrics_http::parse_address(v)?)
            }
            ("write_mostly", Some(v)) if !v.is_empty() => {
                if !opts.write_mostly.iter().any(|m| m == v) {
                    opts.write_mostly.push(v.to_string());
                }
            }
            ("failfast", Some(v)) if !v.is_empty() => {
                if !opts.failfast.iter().any(|m| m == v) {
                    opts.failfast.push(v.to_string());
                }
            }
            ("rotational", Some("0")) => opts.rotational = Some(false),
            ("rotational", Some("1")) => opts.rotational = Some(true),
            _ if generic_option(key, value).is_some() => {
                if let Some(Generic::Flag(apply)) = generic_option(key, value) {
                    apply(&mut opts.vfs);
                }
            }
            _ => {
                return Err(format!(
                    "unknown mount option '{option}' (known: {})",
                    known_options()
                ))
            }
        }
    }
    if opts.fuse.direct_io && opts.fuse.writeback_cache {
        // Under the writeback cache the kernel keeps a file's times itself
        // and a write around it would not move them (see the adapter's
        // `handle_flags`): the two cannot both be had.
        return Err(
            "direct_io and writeback_cache exclude each other: direct_io serves \
                    every open without the page cache, writeback_cache has the kernel \
                    cache writes"
                .to_string(),
        );
    }
    Ok(opts)
}

/// Set the per-mount flags on the mount at `mount_point` with a bind
/// remount, which changes only this mount's flags, not the filesystem.
pub fn apply_vfs_flags(mount_point: &std::path::Path, flags: VfsFlags) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    if flags.is_empty() {
        return Ok(());
    }
    let shown = mount_point.display();
    let c_path = std::ffi::CString::new(mount_point.as_os_str().as_bytes())
        .map_err(|_| format!("{shown}: NUL in path"))?;
    let current = current_mount_flags(mount_point)?;
    let wanted = flags.applied_to(current);
    if wanted == current {
        return Ok(());
    }
    // SAFETY: c_path is NUL-terminated; a remount reads no source, type or data.
    let rc = unsafe {
        libc::mount(
            std::ptr::null(),
            c_path.as_ptr(),
            std::ptr::null(),
            libc::MS_REMOUNT | libc::MS_BIND | wanted,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(format!(
            "setting the mount flags (nosuid, noexec, atime...) on {shown}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The `MS_*` flags the mount at `mount_point` has now.
pub fn current_mount_flags(mount_point: &std::path::Path) -> Result<u64, String> {
    use std::os::unix::ffi::OsStrExt;
    let shown = mount_point.display();
    let c_path = std::ffi::CString::new(mount_point.as_os_str().as_bytes())
        .map_err(|_| format!("{shown}: NUL in path"))?;
    // SAFETY: statvfs is plain data, filled by the call.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: c_path is NUL-terminated and st is a valid out pointer.
    if unsafe { libc::statvfs(c_path.as_ptr(), &mut st) } != 0 {
        return Err(format!("{shown}: {}", std::io::Error::last_os_error()));
    }
    Ok(mount_flags_from_statvfs(st.f_flag))
}

/// statvfs reports the per-mount flags with their own (ST_*) values.
fn mount_flags_from_statvfs(st_flags: libc::c_ulong) -> u64 {
    let pairs = [
        (libc::ST_RDONLY, libc::MS_RDONLY),
        (libc::ST_NOSUID, libc::MS_NOSUID),
        (libc::ST_NODEV, libc::MS_NODEV),
        (libc::ST_NOEXEC, libc::MS_NOEXEC),
        (libc::ST_NOATIME, libc::MS_NOATIME),
        (libc::ST_NODIRATIME, libc::MS_NODIRATIME),
        (libc::ST_RELATIME, libc::MS_RELATIME),
    ];
    pairs
        .iter()
        .filter(|(st, _)| st_flags & st != 0)
        .fold(0, |acc, (_, ms)| acc | ms)
}

fn seconds(key: &str, value: &str) -> Result<Duration, String> {
    match value.parse::<f64>() {
        Ok(secs) if secs.is_finite() && (0.0..=86_400.0).contains(&secs) => {
            Ok(Duration::from_secs_f64(secs))
        }
        _ => Err(format!("{key}={value}: expected seconds (e.g. 1 or 0.5)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_parsed_in_order() {
        let opts = parse(&[
            "ro,allow_other".into(),
            "attr_timeout=2.5,rw,log=/tmp/x.log,parity=avx2".into(),
        ])
        .unwrap();
        assert!(!opts.fuse.read_only);
        assert!(opts.fuse.allow_other);
        assert_eq!(opts.fuse.attr_timeout, Duration::from_millis(2500));
        assert_eq!(opts.log, Some(PathBuf::from("/tmp/x.log")));
        assert_eq!(opts.parity.as_deref(), Some("avx2"));
        assert!(!opts.force);
    }

    #[test]
    fn defaults_without_options() {
        let opts = parse(&[]).unwrap();
        assert!(!opts.fuse.read_only && !opts.fuse.allow_other && !opts.force);
        assert_eq!(opts.fuse.entry_timeout, Duration::from_secs(1));
        assert_eq!(opts.fuse.read_ahead, 4 << 20);
        let none = parse(&["read_ahead_kb=0".into()]).unwrap();
        assert_eq!(none.fuse.read_ahead, 0);
        let big = parse(&["read_ahead_kb=4096".into()]).unwrap();
        assert_eq!(big.fuse.read_ahead, 4 << 20);
        assert_eq!(opts.fuse.busy_poll, Duration::from_micros(50));
        let off = parse(&["busy_poll=0".into()]).unwrap();
        assert!(off.fuse.busy_poll.is_zero());
        let long = parse(&["busy_poll=200".into()]).unwrap();
        assert_eq!(long.fuse.busy_poll, Duration::from_micros(200));
        assert!(!opts.fuse.busy_poll_always);
        let always = parse(&["busy_poll_mode=always".into()]).unwrap();
        assert!(always.fuse.busy_poll_always);
        let err = parse(&["busy_poll_mode=sometimes".into()]).unwrap_err();
        assert!(err.contains("expected `measure` or `always`"), "{err}");
    }

    #[test]
    fn bad_options_are_refused_with_the_list() {
        let err = parse(&["ro,bogus".into()]).unwrap_err();
        assert!(
            err.contains("'bogus'") && err.contains("allow_other"),
            "{err}"
        );
        assert!(parse(&["attr_timeout=abc".into()]).is_err());
        assert!(parse(&["attr_timeout=-1".into()]).is_err());
        assert!(parse(&["ro=1".into()]).is_err());
        assert!(parse(&["log=".into()]).is_err());
        assert!(parse(&["threads=0".into()]).is_err());
        assert!(parse(&["sync".into()]).is_err(), "sync cannot be honoured");
        assert!(parse(&["nofail=1".into()]).is_err());
        assert!(parse(&["read_ahead_kb=x".into()]).is_err());
        assert!(parse(&["read_ahead_kb=70000".into()]).is_err());
        assert!(parse(&["direct_io,writeback_cache".into()]).is_err());
        assert!(parse(&["direct_io".into(), "writeback_cache".into()]).is_err());
        assert!(parse(&["deferred_writes=many".into()]).is_err());
        assert!(parse(&["deferred_writes=257".into()]).is_err());
        assert!(parse(&["busy_poll=10001".into()]).is_err());
        assert!(parse(&["busy_poll=-1".into()]).is_err());
        assert!(parse(&["busy_poll".into()]).is_err());
    }

    #[test]
    fn deferred_writes_is_a_count_and_zero_turns_it_off() {
        assert_eq!(parse(&[]).unwrap().deferred_writes, None);
        let opts = parse(&["deferred_writes=0".into()]).unwrap();
        assert_eq!(opts.deferred_writes, Some(0));
        let opts = parse(&["threads=8,deferred_writes=3".into()]).unwrap();
        assert_eq!(opts.deferred_writes, Some(3));
    }

    #[test]
    fn queued_writes_is_a_count_and_zero_turns_the_queue_off() {
        assert_eq!(parse(&[]).unwrap().queued_writes, None);
        assert_eq!(
            parse(&["queued_writes=0".into()]).unwrap().queued_writes,
            Some(0)
        );
        assert_eq!(
            parse(&["queued_writes=4096".into()]).unwrap().queued_writes,
            Some(4096)
        );
        assert!(parse(&["queued_writes=4097".into()]).is_err());
        assert!(parse(&["queued_writes=deep".into()]).is_err());
    }

    #[test]
    fn metadata_cache_is_a_size_up_to_64g() {
        let cache = |o: &str| parse(&[o.into()]).map(|p| p.metadata_cache);
        assert_eq!(parse(&[]).unwrap().metadata_cache, None);
        assert_eq!(cache("metadata_cache=16M"), Ok(Some(16 << 20)));
        assert_eq!(cache("metadata_cache=0"), Ok(Some(0)));
        for bad in [
            "metadata_cache=65G",
            "metadata_cache=lots",
            "metadata_cache=1Q",
        ] {
            let e = cache(bad).unwrap_err();
            assert!(e.starts_with("metadata_cache="), "{bad}: {e}");
        }
    }

    #[test]
    fn commit_is_seconds_from_one_to_an_hour() {
        assert_eq!(parse(&[]).unwrap().commit_secs, None);
        assert_eq!(parse(&["commit=1".into()]).unwrap().commit_secs, Some(1));
        assert_eq!(
            parse(&["commit=3600".into()]).unwrap().commit_secs,
            Some(3600)
        );
        for bad in [
            "commit=0",
            "commit=3601",
            "commit=abc",
            "commit=-1",
            "commit",
        ] {
            assert!(parse(&[bad.into()]).is_err(), "{bad} accepted");
        }
        let err = parse(&["commit=0".into()]).unwrap_err();
        assert!(err.contains("from 1 to 3600"), "{err}");
        // mount(8)'s helper keeps what `parse` accepts.
        assert!(is_accepted("commit=30"));
        assert!(!is_accepted("commit=0"));
    }

    #[test]
    fn mount8_and_systemd_options_are_dropped() {
        let opts = parse(&[
            "defaults,auto,noauto,_netdev,nofail,user,nouser,rw,async".into(),
            "x-systemd.requires=a.service,x-systemd.device-timeout=5s,X-mount.mkdir".into(),
            "comment=systemd.automount,threads=3".into(),
        ])
        .unwrap();
        assert!(opts.vfs.is_empty());
        assert_eq!(opts.fuse.threads, 3);
        assert!(!opts.fuse.read_only);
    }

    #[test]
    fn per_mount_flags_are_collected() {
        let opts = parse(&["nosuid,nodev,noexec,noatime,exec".into()]).unwrap();
        let f = opts.vfs;
        assert_eq!(f.set, libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME);
        assert_eq!(f.clear & libc::MS_NOEXEC, libc::MS_NOEXEC);
        assert_eq!(
            f.clear & (libc::MS_RELATIME | libc::MS_STRICTATIME),
            libc::MS_RELATIME | libc::MS_STRICTATIME
        );
        // FUSE mounts start nosuid,nodev,relatime.
        let current = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_RELATIME | libc::MS_NOEXEC;
        assert_eq!(
            f.applied_to(current),
            libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOATIME
        );
        let suid = parse(&["suid,dev".into()]).unwrap().vfs;
        assert_eq!(
            suid.applied_to(current),
            libc::MS_RELATIME | libc::MS_NOEXEC
        );
    }

    #[test]
    fn the_atime_mode_follows_the_last_atime_option() {
        use crate::fs::atime::AtimeMode;
        let mode = |o: &str| parse(&[o.to_string()]).unwrap().vfs.atime_mode();
        assert_eq!(mode("rw"), AtimeMode::Relative);
        assert_eq!(mode("noatime"), AtimeMode::Never);
        assert_eq!(mode("strictatime"), AtimeMode::Strict);
        assert_eq!(mode("noatime,relatime"), AtimeMode::Relative);
        assert_eq!(mode("strictatime,atime"), AtimeMode::Relative);
        let opts = parse(&["nodiratime".into()]).unwrap();
        assert!(opts.vfs.has(libc::MS_NODIRATIME));
    }

    #[test]
    fn every_documented_option_parses() {
        for (form, _) in OPTIONS {
            let example = match form.split_once('=') {
                None => form.to_string(),
                Some((key, value)) => {
                    let value = match value {
                        "SECS" | "N" | "USECS" => "1",
                        "SIZE" => "16M",
                        "PATH" => "/tmp/x.log",
                        "KERNEL" => "scalar",
                        "POLICY" => "round-robin",
                        "IP:PORT" => "127.0.0.1:9100",
                        alternatives => alternatives.split('|').next().unwrap_or_default(),
                    };
                    format!("{key}={value}")
                }
            };
            assert!(is_accepted(&example), "{example}");
        }
        assert!(long_help().contains("auto_unmount"));
        assert!(known_options().contains("read_ahead_kb=N"));
    }
}
