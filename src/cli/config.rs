//! `/etc/raidfs.ron`: the arrays this machine knows, by UUID, with where
//! their members are (paths, directories or globs), as mdadm.conf does for
//! md. `mount.raidfs uuid=...` resolves through it. `raidfs config scan`
//! writes entries for the members it finds; `raidfs config show` prints
//! what each configured array resolves to now.
//!
//! The file is RON:
//!
//! ```text
//! (
//!     arrays: [
//!         (
//!             uuid: "9cf61be9-5058-4d46-b508-521058ab4f25",
//!             name: "home",                      // optional; `mount.raidfs home` finds it
//!             members: ["/srv/raid/home-*.img"], // files, directories, globs
//!             options: "threads=8",              // optional default -o options
//!             spares: 1,                         // optional: hot spares expected
//!         ),
//!     ],
//!     monitor: (                                 // optional: `raidfs monitor`
//!         mail: "root@localhost",                // each field optional
//!         program: "/usr/local/sbin/raidfs-event",
//!         delay: 60,
//!         syslog: true,
//!     ),
//! )
//! ```

use std::collections::BTreeMap;
use std::ffi::{CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::superblock::Superblock;

/// Where the configuration lives unless `RAIDFS_CONFIG` names another file.
pub const DEFAULT_CONFIG: &str = "/etc/raidfs.ron";

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub arrays: Vec<ArrayEntry>,
    /// `raidfs monitor`'s settings (mdadm.conf's MAILADDR, PROGRAM...);
    /// its command-line options win.
    #[serde(default, skip_serializing_if = "MonitorConfig::is_default")]
    pub monitor: MonitorConfig,
}

/// The `monitor: (...)` section; every field is optional.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitorConfig {
    /// Run for each event as `PROGRAM EVENT MOUNT [MEMBER]` ("": none).
    pub program: String,
    /// Mail events to this address through sendmail ("": none).
    pub mail: String,
    /// The mails' From: ("": `raidfs monitoring <root>`).
    pub mail_from: String,
    /// Seconds between passes.
    pub delay: f64,
    /// Log events to syslog.
    pub syslog: bool,
}

/// md's default polling interval.
pub const DEFAULT_MONITOR_DELAY: f64 = 60.0;

impl Default for MonitorConfig {
    fn default() -> MonitorConfig {
        MonitorConfig {
            program: String::new(),
            mail: String::new(),
            mail_from: String::new(),
            delay: DEFAULT_MONITOR_DELAY,
            syslog: false,
        }
    }
}

impl MonitorConfig {
    fn is_default(&self) -> bool {
        *self == MonitorConfig::default()
    }
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArrayEntry {
    /// The array UUID (`raidfs examine` shows it), with or without dashes.
    pub uuid: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub name: String,
    /// Where to look for members: files, directories or glob patterns.
    /// Only files whose superblock carries this UUID are used.
    pub members: Vec<String>,
    /// Mount options used before those given on the command line or in fstab.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub options: String,
    /// Hot spares the array should have: `raidfs monitor` raises
    /// SparesMissing when it has fewer (mdadm.conf's `spares=`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub spares: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

#[derive(clap::Args)]
pub struct ConfigArgs {
    /// Print JSON instead of the configuration file's text (scan) or one
    /// line per array (show).
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `config show --json`: one configured array and what it resolves to.
#[derive(Serialize)]
struct Shown {
    uuid: String,
    name: String,
    members: Vec<String>,
    /// Why the members could not be looked up, or null.
    error: Option<String>,
}

#[derive(clap::Subcommand)]
pub enum ConfigCommand {
    /// Print configuration entries for the arrays whose members are found at
    /// the given files, directories or glob patterns.
    Scan {
        /// Files, directories or quoted glob patterns to examine.
        #[arg(required = true)]
        paths: Vec<String>,
    },
    /// Print the members each configured array resolves to now.
    Show,
}

/// `$RAIDFS_CONFIG`, or [`DEFAULT_CONFIG`].
pub fn config_path() -> PathBuf {
    match std::env::var_os("RAIDFS_CONFIG") {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_CONFIG),
    }
}

pub fn parse(text: &str) -> Result<Config, String> {
    ron::from_str(text).map_err(|e| e.to_string())
}

pub fn load(path: &Path) -> Result<Config, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("reading {}: {e}", path.display()))?;
    let config = parse(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    for entry in &config.arrays {
        Uuid::parse_str(&entry.uuid)
            .map_err(|e| format!("{}: uuid \"{}\": {e}", path.display(), entry.uuid))?;
    }
    Ok(config)
}

impl Config {
    /// The entry for `uuid`, if configured.
    pub fn find(&self, uuid: Uuid) -> Option<&ArrayEntry> {
        self.arrays
            .iter()
            .find(|a| Uuid::parse_str(&a.uuid).ok() == Some(uuid))
    }

    /// The entries whose `name` is `name` (one, unless the file is ambiguous).
    pub fn named(&self, name: &str) -> Vec<&ArrayEntry> {
        self.arrays.iter().filter(|a| a.name == name).collect()
    }
}

/// What a member candidate's superblock says, if it has a readable one.
pub struct Found {
    pub path: PathBuf,
    pub array_uuid: Uuid,
    pub name: String,
}

/// Read the superblock of `path` without locking it (it may be in use).
pub fn probe(path: &Path) -> Option<Found> {
    let canonical = if crate::member::open::is_uri(path) {
        path.to_path_buf()
    } else {
        path.canonicalize().ok()?
    };
    let member = crate::member::open::peek(&canonical).ok()?;
    let (sb, _) = Superblock::read_from(member.as_ref()).ok()?;
    Some(Found {
        path: canonical,
        array_uuid: sb.array_uuid,
        name: sb.name,
    })
}

/// Whether `s` has shell glob characters.
pub fn is_glob(s: &str) -> bool {
    s.contains(['*', '?', '['])
}

/// Expand one member location: a glob to its (sorted) matches, a directory
/// to the files in it that carry a raidfs superblock, anything else (an
/// NBD URI among them) to itself.
pub fn expand(location: &str) -> Result<Vec<PathBuf>, String> {
    if crate::member::open::is_uri(Path::new(location)) {
        return Ok(vec![PathBuf::from(location)]);
    }
    if is_glob(location) {
        // A broad pattern (`/srv/raid/*`) may catch directories and the like.
        return Ok(glob(location)?
            .into_iter()
            .filter(|p| is_member_file(p))
            .collect());
    }
    let path = Path::new(location);
    if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|e| format!("{location}: {e}"))?;
        let mut members: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| probe(p).is_some())
            .collect();
        members.sort();
        return Ok(members);
    }
    Ok(vec![path.to_path_buf()])
}

/// A regular file or a block device: what can hold a member.
fn is_member_file(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() || m.file_type().is_block_device())
        .unwrap_or(false)
}

/// Shell-style glob (`*`, `?`, `[...]`) through libc's glob(3); sorted.
pub fn glob(pattern: &str) -> Result<Vec<PathBuf>, String> {
    let c_pattern = CString::new(pattern).map_err(|_| format!("{pattern}: NUL in pattern"))?;
    // SAFETY: glob_t is plain data that glob() fills in.
    let mut found: libc::glob_t = unsafe { std::mem::zeroed() };
    // SAFETY: c_pattern is NUL-terminated and found a valid glob_t.
    let rc = unsafe { libc::glob(c_pattern.as_ptr(), 0, None, &mut found) };
    let mut paths = Vec::new();
    if rc == 0 {
        for i in 0..found.gl_pathc {
            // SAFETY: glob() filled gl_pathv with gl_pathc NUL-terminated strings.
            let entry = unsafe { CStr::from_ptr(*found.gl_pathv.add(i)) };
            paths.push(PathBuf::from(std::ffi::OsStr::from_bytes(entry.to_bytes())));
        }
    }
    // SAFETY: found was initialised by glob(); globfree accepts it after any outcome.
    unsafe { libc::globfree(&mut found) };
    match rc {
        0 | libc::GLOB_NOMATCH => Ok(paths),
        _ => Err(format!(
            "{pattern}: cannot expand the pattern (glob error {rc})"
        )),
    }
}

/// Configuration entries for every array with members among `locations`.
pub fn scan(locations: &[String]) -> Result<Config, String> {
    let mut arrays: BTreeMap<Uuid, (String, Vec<PathBuf>)> = BTreeMap::new();
    for location in locations {
        for path in expand(location)? {
            if let Some(found) = probe(&path) {
                let (name, members) = arrays.entry(found.array_uuid).or_default();
                if name.is_empty() {
                    *name = found.name;
                }
                if !members.contains(&found.path) {
                    members.push(found.path);
                }
            }
        }
    }
    Ok(Config {
        arrays: arrays
            .into_iter()
            .map(|(uuid, (name, members))| ArrayEntry {
                uuid: uuid.hyphenated().to_string(),
                name,
                members: members.iter().map(|p| p.display().to_string()).collect(),
                options: String::new(),
                spares: 0,
            })
            .collect(),
        monitor: MonitorConfig::default(),
    })
}

/// The members of array `uuid` found at the entry's locations.
pub fn members_of(entry: &ArrayEntry, uuid: Uuid) -> Result<Vec<PathBuf>, String> {
    let mut members = Vec::new();
    for location in &entry.members {
        for path in expand(location)? {
            if let Some(found) = probe(&path) {
                if found.array_uuid == uuid && !members.contains(&found.path) {
                    members.push(found.path);
                }
            }
        }
    }
    Ok(members)
}

pub fn render(config: &Config) -> Result<String, String> {
    let pretty = ron::ser::PrettyConfig::new().struct_names(false);
    ron::ser::to_string_pretty(config, pretty).map_err(|e| e.to_string())
}

pub fn run(args: ConfigArgs) -> i32 {
    match args.command {
        ConfigCommand::Scan { paths } if args.json => match scan(&paths) {
            Ok(config) => print_json(&config),
            Err(msg) => super::fail(msg),
        },
        ConfigCommand::Show if args.json => show_json(),
        ConfigCommand::Scan { paths } => match scan(&paths).and_then(|c| render(&c)) {
            Ok(text) => {
                println!("// raidfs arrays found by `raidfs config scan`; see docs/fstab.md");
                println!("{text}");
                0
            }
            Err(msg) => super::fail(msg),
        },
        ConfigCommand::Show => show(),
    }
}

fn print_json(value: &impl Serialize) -> i32 {
    match serde_json::to_string_pretty(value) {
        Ok(text) => {
            println!("{text}");
            0
        }
        Err(e) => super::fail(format!("encoding JSON: {e}")),
    }
}

fn show_json() -> i32 {
    let path = config_path();
    let config = match load(&path) {
        Ok(c) => c,
        Err(msg) => return super::fail(msg),
    };
    let arrays: Vec<Shown> = config
        .arrays
        .iter()
        .map(|entry| {
            let resolved = Uuid::parse_str(&entry.uuid)
                .map_err(|e| format!("UUID {}: {e}", entry.uuid))
                .and_then(|uuid| members_of(entry, uuid));
            let (members, error) = match resolved {
                Ok(members) => (
                    members.iter().map(|m| m.display().to_string()).collect(),
                    None,
                ),
                Err(msg) => (Vec::new(), Some(msg)),
            };
            Shown {
                uuid: entry.uuid.clone(),
                name: entry.name.clone(),
                members,
                error,
            }
        })
        .collect();
    print_json(&serde_json::json!({
        "config": path.display().to_string(),
        "arrays": arrays,
    }))
}

fn show() -> i32 {
    let path = config_path();
    let config = match load(&path) {
        Ok(c) => c,
        Err(msg) => return super::fail(msg),
    };
    println!("# {}", path.display());
    for entry in &config.arrays {
        let Ok(uuid) = Uuid::parse_str(&entry.uuid) else {
            continue;
        };
        let label = if entry.name.is_empty() {
            String::new()
        } else {
            format!(" ({})", entry.name)
        };
        match members_of(entry, uuid) {
            Ok(members) if members.is_empty() => println!("{uuid}{label}: no members found"),
            Ok(members) => {
                let list: Vec<String> = members.iter().map(|m| m.display().to_string()).collect();
                println!("{uuid}{label}: {}", list.join(" "));
            }
            Err(msg) => println!("{uuid}{label}: {msg}"),
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nbd_uris_are_locations_of_their_own() {
        // `?` in the query is not a glob character here.
        let uri = "nbd+unix:///disk?socket=/run/nbd.sock";
        assert_eq!(expand(uri).unwrap(), vec![PathBuf::from(uri)]);
        let tcp = "nbd://host:10809/";
        assert_eq!(expand(tcp).unwrap(), vec![PathBuf::from(tcp)]);
    }

    #[test]
    fn config_parses_with_optional_fields() {
        let text = r#"(
            arrays: [
                (uuid: "9cf61be9-5058-4d46-b508-521058ab4f25", members: ["/srv/raid/*.img"]),
                (uuid: "9cf61be950584d46b508521058ab4f26", name: "home",
                 members: ["/a", "/b"], options: "threads=8"),
            ],
        )"#;
        let config = parse(text).unwrap();
        assert_eq!(config.arrays.len(), 2);
        assert_eq!(config.arrays[1].options, "threads=8");
        let uuid = Uuid::parse_str("9cf61be9-5058-4d46-b508-521058ab4f26").unwrap();
        assert_eq!(config.find(uuid).map(|a| a.name.as_str()), Some("home"));
    }

    #[test]
    fn the_monitor_section_is_optional_and_its_fields_too() {
        let plain = parse(r#"(arrays: [])"#).unwrap();
        assert_eq!(plain.monitor, MonitorConfig::default());
        let text = r#"(
            arrays: [(uuid: "9cf61be9-5058-4d46-b508-521058ab4f25", members: ["/a"], spares: 1)],
            monitor: (mail: "ops@example.com", delay: 300),
        )"#;
        let config = parse(text).unwrap();
        assert_eq!(config.arrays[0].spares, 1);
        assert_eq!(config.monitor.mail, "ops@example.com");
        assert_eq!(config.monitor.delay, 300.0);
        assert_eq!(config.monitor.program, "");
        assert!(!config.monitor.syslog);
        assert!(parse(r#"(monitor: (mailaddr: "x"))"#).is_err());
    }

    #[test]
    fn typos_in_the_config_are_errors() {
        assert!(parse(r#"(arrays: [(uuid: "x", member: [])])"#).is_err());
    }

    #[test]
    fn rendered_config_parses_back() {
        let config = Config {
            arrays: vec![ArrayEntry {
                uuid: "9cf61be9-5058-4d46-b508-521058ab4f25".into(),
                name: "x".into(),
                members: vec!["/srv/a.img".into()],
                options: String::new(),
                spares: 1,
            }],
            monitor: MonitorConfig {
                program: "/usr/local/sbin/raid-event".into(),
                ..MonitorConfig::default()
            },
        };
        assert_eq!(parse(&render(&config).unwrap()).unwrap(), config);
    }

    #[test]
    fn glob_expands_sorted_and_empty_on_no_match() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["b.img", "a.img", "c.txt"] {
            std::fs::write(dir.path().join(name), b"x").unwrap();
        }
        let pattern = format!("{}/*.img", dir.path().display());
        let found = glob(&pattern).unwrap();
        assert_eq!(
            found,
            vec![dir.path().join("a.img"), dir.path().join("b.img")]
        );
        let none = format!("{}/*.raw", dir.path().display());
        assert!(glob(&none).unwrap().is_empty());
    }
}
