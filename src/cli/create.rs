//! `raidfs create`: write a new array (and an empty filesystem) onto members.

use crate::array::{create_paths, CreateSpec, PathOptions};
use crate::geometry::{Layout, Level};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct CreateArgs {
    /// RAID level: 0, 1, 5, 6 or 10.
    #[arg(short, long, value_parser = parse_level)]
    pub level: Level,
    /// Chunk size, e.g. 64K, 512K, 1M.
    #[arg(short, long, default_value = "64K", value_parser = parse_size)]
    pub chunk: u64,
    /// Size of image files that do not exist yet (sparse), e.g. 256M, 10G.
    #[arg(short, long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// RAID5/6 parity layout (md's names: left-symmetric, left-asymmetric,
    /// right-symmetric, right-asymmetric).
    #[arg(long, default_value = "left-symmetric", value_parser = parse_layout)]
    pub layout: Layout,
    /// RAID10 near copies.
    #[arg(long, default_value_t = 2)]
    pub copies: usize,
    /// How redundancy is made consistent after a crash: `bitmap` (resync the
    /// regions the write-intent bitmap marks) or `ppl` (RAID5: also log
    /// partial parity, closing the write hole at some cost to small writes);
    /// `resync`, mdadm's word, is taken as `bitmap`.
    #[arg(long, default_value = "bitmap", value_parser = ["bitmap", "resync", "ppl"])]
    pub consistency_policy: String,
    /// Array name (up to 32 bytes).
    #[arg(short, long, default_value = "")]
    pub name: String,
    /// Write an older filesystem format, which older raidfs releases can
    /// still mount (`raidfs upgrade` moves it to the newest later).
    #[arg(long, value_name = "N", value_parser = parse_fs_format)]
    pub fs_format: Option<u32>,
    /// Overwrite members of other arrays and non-empty files.
    #[arg(short, long)]
    pub force: bool,
    /// Owner of the filesystem's root directory, as numeric `UID:GID`
    /// (default: the user running create, so a user's own array is theirs
    /// to write). Only root may give it to another user.
    #[arg(long, value_name = "UID:GID", value_parser = parse_owner)]
    pub owner: Option<(u32, u32)>,
    /// Reserve the image files' full size on the host now (fallocate), so
    /// the array never meets a full host filesystem later.
    #[arg(long)]
    pub preallocate: bool,
    /// Member image files, block devices or NBD URIs (nbd://HOST[:PORT]/EXPORT,
    /// nbd+unix:///EXPORT?socket=PATH), in slot order.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

pub(crate) fn parse_level(s: &str) -> Result<Level, String> {
    Level::parse(s).map_err(|e| e.to_string())
}

fn parse_fs_format(s: &str) -> Result<u32, String> {
    use crate::fs::{FORMAT_VERSION, OLDEST_FORMAT};
    match s.parse::<u32>() {
        Ok(v) if (OLDEST_FORMAT..=FORMAT_VERSION).contains(&v) => Ok(v),
        _ => Err(format!(
            "'{s}': filesystem formats run from {OLDEST_FORMAT} to {FORMAT_VERSION}"
        )),
    }
}

fn parse_owner(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("'{s}': give the owner as numeric UID:GID, e.g. 1000:1000");
    let (uid, gid) = s.split_once(':').ok_or_else(bad)?;
    Ok((
        uid.parse().map_err(|_| bad())?,
        gid.parse().map_err(|_| bad())?,
    ))
}

/// The root directory's owner: `--owner` if given, else the caller's
/// effective ids (what a file they created would get). Like chown(2), a
/// user other than root may name only themselves and a group of theirs.
fn root_owner(asked: Option<(u32, u32)>) -> Result<(u32, u32), String> {
    // SAFETY: geteuid and getegid have no preconditions and cannot fail.
    let (euid, egid) = unsafe { (libc::geteuid(), libc::getegid()) };
    let Some((uid, gid)) = asked else {
        return Ok((euid, egid));
    };
    if euid == 0 {
        return Ok((uid, gid));
    }
    if uid != euid {
        return Err(format!(
            "--owner {uid}:{gid}: only root may give the array to another user (you are uid {euid})"
        ));
    }
    if gid != egid && !own_groups().contains(&gid) {
        return Err(format!(
            "--owner {uid}:{gid}: you are not a member of group {gid}"
        ));
    }
    Ok((uid, gid))
}

/// This process's supplementary groups.
fn own_groups() -> Vec<u32> {
    // SAFETY: with a size of 0 getgroups only counts, writing nothing.
    let count = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    let mut groups = vec![0 as libc::gid_t; usize::try_from(count).unwrap_or(0)];
    // SAFETY: the buffer holds `count` gids; getgroups writes at most that many.
    let n = unsafe { libc::getgroups(count.max(0), groups.as_mut_ptr()) };
    groups.truncate(usize::try_from(n).unwrap_or(0));
    groups
}

fn parse_layout(s: &str) -> Result<Layout, String> {
    Layout::parse(s).map_err(|e| e.to_string())
}

/// Parse sizes like `4096`, `64K`, `256M`, `10G`, `1T` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (digits, unit) = s.split_at(s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len()));
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 4096, 64K, 256M, 10G)"))?;
    let shift = match unit
        .to_ascii_uppercase()
        .trim_end_matches("IB")
        .trim_end_matches('B')
    {
        "" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M, G or T)")),
    };
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("'{s}' is too large"))
}

pub fn run(args: CreateArgs) -> i32 {
    // A member failing while the array is written (a full host filesystem)
    // is reported through the log; show those errors as they happen.
    let _ = env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("error"))
        .format(|buf, record| {
            use std::io::Write;
            writeln!(buf, "{}", record.args())
        })
        .try_init();
    let root_owner = match root_owner(args.owner) {
        Ok(owner) => owner,
        Err(msg) => return super::fail(msg),
    };
    let spec = CreateSpec {
        level: args.level,
        layout: args.layout,
        chunk: args.chunk,
        copies: args.copies,
        name: args.name.clone(),
        ppl: args.consistency_policy == "ppl",
    };
    let options = PathOptions {
        size: args.size,
        force: args.force,
        preallocate: args.preallocate,
    };
    let created = match create_paths(&args.members, &spec, &options) {
        Ok(c) => c,
        Err(e) => return super::fail(e),
    };
    for warning in &created.warnings {
        eprintln!("raidfs: warning: {warning}");
    }
    let format = crate::fs::FormatOptions {
        version: args.fs_format,
        root_owner,
        ..Default::default()
    };
    let array = match crate::fs::format_array(std::sync::Arc::clone(&created.array), &format) {
        Ok(()) => created.keep(),
        Err(e) => {
            created.abandon();
            return super::fail(format!(
                "the filesystem could not be written: {e}; the images made for it were removed"
            ));
        }
    };
    let status = array.status();
    println!(
        "raidfs: created {} array {} on {} members, {} usable",
        status.level,
        status.uuid,
        status.members.len(),
        human(array.data_capacity())
    );
    0
}

/// Bytes as a short human-readable figure.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
