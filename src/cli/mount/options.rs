//! `raidfs mount -o OPTIONS`: parsing the comma-separated option list.

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
}

pub const KNOWN_OPTIONS: &str =
    "ro, rw, allow_other, default_permissions, force, auto_unmount, kernel_cache, \
    writeback_cache, attr_timeout=SECS, entry_timeout=SECS, threads=N, read_ahead_kb=N, log=PATH, \
    parity=KERNEL";

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
            _ => {
                return Err(format!(
                    "unknown mount option '{option}' (known: {KNOWN_OPTIONS})"
                ))
            }
        }
    }
    Ok(opts)
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
        assert_eq!(opts.fuse.read_ahead, 1 << 20);
        let none = parse(&["read_ahead_kb=0".into()]).unwrap();
        assert_eq!(none.fuse.read_ahead, 0);
        let big = parse(&["read_ahead_kb=4096".into()]).unwrap();
        assert_eq!(big.fuse.read_ahead, 4 << 20);
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
        assert!(parse(&["read_ahead_kb=x".into()]).is_err());
        assert!(parse(&["read_ahead_kb=70000".into()]).is_err());
    }
}
