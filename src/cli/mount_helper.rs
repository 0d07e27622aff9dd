//! `mount.raidfs`: the helper util-linux mount(8) runs for `-t raidfs` (and
//! so for fstab lines and systemd mount units), with mount(8)'s calling
//! convention `SPEC DIR [-sfnv] [-N NS] [-o OPTS]`.
//!
//! mount(8) runs it as `mount.raidfs` for type `raidfs` and as
//! `mount.fuse.raidfs` for type `fuse.raidfs`, the type raidfs mounts have
//! in the mount table (so `mount -o remount` of a live mount comes here).
//!
//! SPEC names the members: a list separated by `,` or `:`, each a file, a
//! directory (the raidfs members in it), a glob or an NBD URI (a list
//! with URIs is separated by `,`); or the array itself,
//! `uuid=UUID` (also `UUID=UUID` when called directly) or its name, looked
//! up in the configuration file ([`super::config`]). A mount made from a
//! SPEC that names the array shows that SPEC as its source
//! ([`super::mount::identity`]). The mount itself is `raidfs mount`, or,
//! for an array already mounted elsewhere, a bind mount of that mount
//! ([`super::mount::second`]);
//! `remount` goes to the running daemon ([`super::mount::remount`]).

use std::path::PathBuf;

use super::config;
use super::mount::identity::Identity;
use super::mount::{self, options, remount, second, MountArgs};

/// mount(8)'s exit codes for helpers.
const EXIT_USAGE: i32 = 1;
const EXIT_MOUNT_FAILED: i32 = 32;

#[derive(clap::Args)]
pub struct HelperArgs {
    /// SPEC DIR [-sfnv] [-N NAMESPACE] [-o OPTIONS] [-t TYPE], as mount(8) passes them.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
    pub args: Vec<String>,
}

/// The helper's command line, parsed.
#[derive(Debug, Default, PartialEq)]
pub struct Invocation {
    pub spec: String,
    pub dir: PathBuf,
    /// `-s`: drop options raidfs does not know instead of failing.
    pub sloppy: bool,
    /// `-f`: resolve and check everything, mount nothing.
    pub fake: bool,
    /// `-v`: say what is mounted from where.
    pub verbose: bool,
    /// `-N`: the mount namespace (a pid or a /proc/PID/ns/mnt path).
    pub namespace: Option<String>,
    pub options: Vec<String>,
}

pub fn parse_invocation(args: &[String]) -> Result<Invocation, String> {
    let mut inv = Invocation::default();
    let mut positional = Vec::new();
    let mut iter = args.iter();
    let mut only_positional = false;
    while let Some(arg) = iter.next() {
        let Some(flags) = arg
            .strip_prefix('-')
            .filter(|f| !f.is_empty() && !only_positional)
        else {
            positional.push(arg.clone());
            continue;
        };
        if flags == "-" {
            only_positional = true;
            continue;
        }
        for (i, c) in flags.char_indices() {
            match c {
                's' => inv.sloppy = true,
                'f' => inv.fake = true,
                'v' => inv.verbose = true,
                // There is no mtab to skip: the kernel's table is the only one.
                'n' => {}
                'o' | 'N' | 't' => {
                    let attached = &flags[i + c.len_utf8()..];
                    let value = if attached.is_empty() {
                        iter.next()
                            .cloned()
                            .ok_or_else(|| format!("option -{c} needs a value"))?
                    } else {
                        attached.to_string()
                    };
                    match c {
                        'o' => inv.options.push(value),
                        'N' => inv.namespace = Some(value),
                        // The type is raidfs, or we would not have been called.
                        _ => {}
                    }
                    break;
                }
                other => return Err(format!("unknown flag -{other}")),
            }
        }
    }
    let [spec, dir] = <[String; 2]>::try_from(positional).map_err(|p| {
        format!(
            "expected SPEC and DIR, got {} argument(s) (usage: mount.raidfs SPEC DIR [-sfnv] [-N NS] [-o OPTIONS])",
            p.len()
        )
    })?;
    inv.spec = spec;
    inv.dir = PathBuf::from(dir);
    Ok(inv)
}

/// The members a SPEC names and the options its configuration entry adds.
#[derive(Debug)]
pub struct Resolved {
    pub members: Vec<PathBuf>,
    pub options: Vec<String>,
    /// What the mount shows as its source, when SPEC names the array.
    pub source: Option<String>,
}

pub fn resolve_spec(spec: &str) -> Result<Resolved, String> {
    match Identity::of_spec(spec)? {
        Some(identity @ Identity::Uuid(uuid)) => {
            return Ok(Resolved {
                source: Some(identity.source()),
                ..resolve_uuid(uuid)?
            })
        }
        Some(identity @ Identity::Name(_)) => {
            return Ok(Resolved {
                source: Some(identity.source()),
                ..resolve_name(spec)?
            })
        }
        None => {}
    }
    // A path that exists is one location even if its name has `:` or `,`;
    // an NBD URI keeps its `:`s (URIs are separated from the rest by `,`).
    let locations: Vec<&str> = if std::path::Path::new(spec).exists() {
        vec![spec]
    } else {
        spec.split(',')
            .flat_map(|part| {
                if crate::member::open::is_uri(std::path::Path::new(part)) {
                    vec![part]
                } else {
                    part.split(':').collect()
                }
            })
            .filter(|s| !s.is_empty())
            .collect()
    };
    let mut members = Vec::new();
    for location in locations {
        let found = config::expand(location)?;
        if found.is_empty() {
            return Err(format!("{location}: no members found there"));
        }
        for m in found {
            if !members.contains(&m) {
                members.push(m);
            }
        }
    }
    if members.is_empty() {
        return Err(format!("{spec}: names no members"));
    }
    Ok(Resolved {
        members,
        options: Vec::new(),
        source: None,
    })
}

/// An array name: the configuration entry that carries it.
fn resolve_name(name: &str) -> Result<Resolved, String> {
    let path = config::config_path();
    let config = config::load(&path).map_err(|e| format!("{name}: {e}"))?;
    let uuid = match config.named(name).as_slice() {
        [entry] => uuid::Uuid::parse_str(&entry.uuid)
            .map_err(|e| format!("{}: uuid \"{}\": {e}", path.display(), entry.uuid))?,
        [] => {
            return Err(format!(
                "{name}: not a member path, and no array named {name:?} in {} (`raidfs config scan` prints entries with their names)",
                path.display()
            ))
        }
        _ => {
            return Err(format!(
                "{name}: more than one array is named {name:?} in {}; mount it by uuid=",
                path.display()
            ))
        }
    };
    resolve_uuid(uuid)
}

fn resolve_uuid(uuid: uuid::Uuid) -> Result<Resolved, String> {
    let path = config::config_path();
    let config = config::load(&path)?;
    let entry = config.find(uuid).ok_or_else(|| {
        format!(
            "no array with UUID {uuid} in {} (`raidfs config scan` prints entries)",
            path.display()
        )
    })?;
    let members = config::members_of(entry, uuid)?;
    if members.is_empty() {
        return Err(format!(
            "no member of array {uuid} found at {}",
            entry.members.join(", ")
        ));
    }
    let options = if entry.options.is_empty() {
        Vec::new()
    } else {
        vec![entry.options.clone()]
    };
    Ok(Resolved {
        members,
        options,
        source: None,
    })
}

/// mount(8) mounts a filesystem suid and dev unless told `nosuid` or
/// `nodev`, and passes a helper only the flags that are set, so an fstab
/// line's `suid`/`dev` (or `defaults`) never reaches it. A FUSE mount starts
/// nosuid,nodev; like mount.fuse3, a helper run by root therefore asks for
/// suid and dev unless the options turn them off. For anyone else mount(8)
/// itself passes nosuid,nodev (a `user` mount).
fn mount8_defaults() -> Vec<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // First, so that a `nosuid` or `nodev` given anywhere wins.
        vec!["suid,dev".to_string()]
    } else {
        Vec::new()
    }
}

/// With `-s`, options raidfs does not accept are dropped with a warning.
fn sloppy_filter(lists: Vec<String>) -> Vec<String> {
    let mut kept = Vec::new();
    for option in lists
        .iter()
        .flat_map(|l| l.split(','))
        .filter(|o| !o.is_empty())
    {
        if options::is_accepted(option) {
            kept.push(option.to_string());
        } else {
            eprintln!("mount.raidfs: ignoring unknown option '{option}' (-s)");
        }
    }
    vec![kept.join(",")]
}

/// Enter the mount namespace `ns` (a pid or a namespace file path).
fn enter_namespace(ns: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let path = if ns.chars().all(|c| c.is_ascii_digit()) {
        format!("/proc/{ns}/ns/mnt")
    } else {
        ns.to_string()
    };
    let file = std::fs::File::open(&path).map_err(|e| format!("namespace {path}: {e}"))?;
    // SAFETY: the fd is an open namespace file; this process has one thread.
    if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNS) } != 0 {
        return Err(format!(
            "entering the mount namespace {path}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

pub fn run(args: HelperArgs) -> i32 {
    let inv = match parse_invocation(&args.args) {
        Ok(inv) => inv,
        Err(msg) => {
            eprintln!("mount.raidfs: {msg}");
            return EXIT_USAGE;
        }
    };
    match mount_spec(inv) {
        Ok(0) => 0,
        Ok(_) => EXIT_MOUNT_FAILED,
        Err(msg) => {
            eprintln!("mount.raidfs: {msg}");
            EXIT_MOUNT_FAILED
        }
    }
}

fn mount_spec(inv: Invocation) -> Result<i32, String> {
    if let Some(ns) = &inv.namespace {
        enter_namespace(ns)?;
    }
    if remount::is_remount(&inv.options) {
        return remount::run(&inv.dir, &inv.options, inv.fake, inv.verbose).map(|()| 0);
    }
    let resolved = resolve_spec(&inv.spec)?;
    let mut lists = mount8_defaults();
    lists.extend(resolved.options);
    lists.extend(inv.options);
    if inv.sloppy {
        lists = sloppy_filter(lists);
    }
    let parsed = options::parse(&lists)?;
    let existing = second::existing_mount(&resolved.members);
    if inv.verbose || inv.fake {
        let members: Vec<String> = resolved
            .members
            .iter()
            .map(|m| m.display().to_string())
            .collect();
        eprintln!(
            "mount.raidfs: {} -> members {} on {} (options: {})",
            inv.spec,
            members.join(" "),
            inv.dir.display(),
            lists.join(",")
        );
    }
    if let (Some(existing), true) = (&existing, inv.verbose || inv.fake) {
        eprintln!(
            "mount.raidfs: the array is mounted at {}; {} becomes a second mount of it",
            existing.display(),
            inv.dir.display()
        );
    }
    if inv.fake {
        return Ok(0);
    }
    if let Some(existing) = existing {
        second::bind(&existing, &inv.dir, &parsed)?;
        return Ok(0);
    }
    let mut paths = resolved.members;
    paths.push(inv.dir);
    Ok(mount::run(MountArgs {
        foreground: false,
        options: lists,
        paths,
        source: resolved.source,
        quiet: !inv.verbose,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn mount8_calling_convention() {
        let inv = parse_invocation(&args(&[
            "/srv/*.img",
            "/mnt/x",
            "-sv",
            "-n",
            "-o",
            "rw,nosuid",
            "-N",
            "1234",
            "-t",
            "raidfs",
        ]))
        .unwrap();
        assert_eq!(inv.spec, "/srv/*.img");
        assert_eq!(inv.dir, PathBuf::from("/mnt/x"));
        assert!(inv.sloppy && inv.verbose && !inv.fake);
        assert_eq!(inv.options, vec!["rw,nosuid".to_string()]);
        assert_eq!(inv.namespace.as_deref(), Some("1234"));
        let attached = parse_invocation(&args(&["a", "b", "-fordefaults"])).unwrap();
        assert!(attached.fake);
        assert_eq!(attached.options, vec!["rdefaults".to_string()]);
    }

    #[test]
    fn bad_invocations_are_refused() {
        assert!(parse_invocation(&args(&["only-spec"])).is_err());
        assert!(parse_invocation(&args(&["a", "b", "c"])).is_err());
        assert!(parse_invocation(&args(&["a", "b", "-o"])).is_err());
        assert!(parse_invocation(&args(&["a", "b", "-x"])).is_err());
    }

    #[test]
    fn member_lists_split_on_commas_and_colons() {
        let dir = tempfile::tempdir().unwrap();
        let p = |n: &str| dir.path().join(n);
        for n in ["a", "b", "c"] {
            std::fs::write(p(n), b"").unwrap();
        }
        let spec = format!(
            "{},{}:{}",
            p("a").display(),
            p("b").display(),
            p("c").display()
        );
        let resolved = resolve_spec(&spec).unwrap();
        assert_eq!(resolved.members, vec![p("a"), p("b"), p("c")]);
        let missing = format!("{}/*.img", dir.path().display());
        assert!(resolve_spec(&missing).is_err());
    }

    #[test]
    fn nbd_uris_in_a_member_list_keep_their_colons() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"").unwrap();
        let tcp = "nbd://10.0.0.2:10809/disk";
        let unix = "nbd+unix:///disk?socket=/run/nbd.sock";
        let spec = format!("{},{tcp},{unix}", a.display());
        let resolved = resolve_spec(&spec).unwrap();
        assert_eq!(
            resolved.members,
            vec![a, PathBuf::from(tcp), PathBuf::from(unix)]
        );
    }
}
