//! `raidfs fsck`: an offline check of an unmounted array: every member's
//! superblock copies, then the filesystem (journal, trees, extents, free
//! space, link counts). Exit codes follow e2fsck: 0 clean, 1 problems were
//! repaired, 4 problems remain, 8 the check could not run.

use crate::array::{assemble_paths, AssembleOptions, OpenPolicy};
use crate::fs::{fsck, fsck_with, ArrayStore, Progress};
use crate::superblock::Superblock;
use serde::Serialize;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

/// `fsck --json`: what the text output says, one field each.
#[derive(Serialize)]
struct FsckJson<'a> {
    /// `clean`, `repaired` or `problems`.
    result: &'static str,
    exit_code: i32,
    /// Slots missing or faulty at assembly.
    degraded_slots: Vec<usize>,
    problems: Vec<&'a str>,
    notes: &'a [String],
    inodes: u64,
    directories: u64,
    journal_records: u64,
    used_bytes: u64,
    free_bytes: u64,
}

#[derive(clap::Args)]
pub struct FsckArgs {
    /// Repair what can be repaired (link counts, lost inodes, free space).
    #[arg(long)]
    pub repair: bool,
    /// Forced assembly (as `mount -o force`): start members that disagree
    /// about who failed from the freshest set that can serve, and a dirty
    /// degraded parity array.
    #[arg(long)]
    pub force: bool,
    /// Print the result as JSON (see docs/cli.md) instead of text; the exit
    /// status is the same.
    #[arg(long)]
    pub json: bool,
    /// Member image files, block devices or NBD URIs.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

const CLEAN: i32 = 0;
const REPAIRED: i32 = 1;
const UNCORRECTED: i32 = 4;
const OPERATIONAL: i32 = 8;

/// Problems in the superblock copies (one bad copy is survivable but reported).
fn superblock_problems(members: &[PathBuf]) -> Vec<String> {
    let mut problems = Vec::new();
    for path in members {
        let name = path.display().to_string();
        match crate::member::open::peek(path) {
            Ok(m) => match Superblock::read_from(m.as_ref()) {
                Ok((_, verdict)) => {
                    // Stale copies alone are what an interrupted update
                    // leaves; the next assembly rewrites them.
                    if verdict.has_damage() {
                        problems.push(format!(
                            "{name}: superblock copies not good: {}",
                            verdict.damaged()
                        ));
                    }
                }
                Err(e) => problems.push(e.to_string()),
            },
            Err(e) => problems.push(format!("{name}: {e}")),
        }
    }
    problems
}

pub fn run(args: FsckArgs) -> i32 {
    let sb_problems = superblock_problems(&args.members);
    let opts = AssembleOptions {
        force: args.force,
        read_only: !args.repair,
        ..Default::default()
    };
    if let Err(msg) = super::mount::check_members_free(&args.members) {
        super::fail(msg);
        return OPERATIONAL;
    }
    let policy = OpenPolicy {
        lock_wait: super::mount::OFFLINE_LOCK_WAIT,
        leave_out_unwritable: false,
    };
    let array = match assemble_paths(&args.members, opts, policy) {
        Ok(assembly) => {
            super::mount::tell_left_out(&assembly.left_out);
            super::mount::tell_notes(&assembly.notes);
            Arc::new(assembly.array)
        }
        Err(e) => {
            super::fail(format!("cannot assemble: {e}"));
            return OPERATIONAL;
        }
    };
    if array.is_degraded() && !args.json {
        println!(
            "array is degraded: {:?} missing or faulty",
            array.failed_slots()
        );
    }
    let store = Arc::new(ArrayStore::new(Arc::clone(&array)));
    let shown = (!args.json && std::io::stderr().is_terminal()).then(Steps::new);
    let outcome = match &shown {
        Some(steps) => fsck_with(store, args.repair, steps),
        None => fsck(store, args.repair),
    };
    if let Some(steps) = &shown {
        steps.finish();
    }
    let report = match outcome {
        Ok(r) => r,
        Err(e) => {
            super::fail(format!("filesystem check failed: {e}"));
            return OPERATIONAL;
        }
    };
    if args.repair && !sb_problems.is_empty() {
        // Rewriting the superblocks from the assembled state heals a bad copy.
        if let Err(e) = array.rewrite_superblocks() {
            super::fail(format!("could not rewrite superblocks: {e}"));
        }
    }
    let problems = sb_problems.len() + report.problems.len();
    let (result, code) = if problems == 0 {
        ("clean", CLEAN)
    } else if args.repair {
        ("repaired", REPAIRED)
    } else {
        ("problems", UNCORRECTED)
    };
    if args.json {
        let json = FsckJson {
            result,
            exit_code: code,
            degraded_slots: array.failed_slots(),
            problems: sb_problems
                .iter()
                .chain(&report.problems)
                .map(String::as_str)
                .collect(),
            notes: &report.notes,
            inodes: report.inodes,
            directories: report.directories,
            journal_records: report.journal_records,
            used_bytes: report.used_bytes,
            free_bytes: report.free_bytes,
        };
        return match serde_json::to_string_pretty(&json) {
            Ok(text) => {
                println!("{text}");
                code
            }
            Err(e) => {
                super::fail(format!("encoding JSON: {e}"));
                OPERATIONAL
            }
        };
    }
    for note in &report.notes {
        println!("note: {note}");
    }
    for p in sb_problems.iter().chain(&report.problems) {
        println!("problem: {p}");
    }
    println!(
        "{} inodes, {} directories, {} journal records replayed, {} bytes used, {} bytes free",
        report.inodes,
        report.directories,
        report.journal_records,
        report.used_bytes,
        report.free_bytes
    );
    match code {
        CLEAN => println!("clean"),
        REPAIRED => println!("{problems} problems repaired"),
        _ => println!("{problems} problems found; run with --repair to fix them"),
    }
    code
}

/// fsck's steps on a terminal (stderr): a bar (or a counter, when the
/// step's size is not known ahead) for the step under way, and a line for
/// each step done with what it went through and how long it took, so a
/// check of millions of files shows where it is.
struct Steps {
    bar: indicatif::ProgressBar,
    current: Mutex<Option<(&'static str, Instant)>>,
}

impl Steps {
    fn new() -> Steps {
        Steps {
            bar: indicatif::ProgressBar::new_spinner(),
            current: Mutex::new(None),
        }
    }

    /// The step under way ends: its line.
    fn end_step(&self) {
        if let Some((name, started)) = self.current.lock().take() {
            let done = self.bar.position();
            let counted = if done > 0 {
                format!(" ({done})")
            } else {
                String::new()
            };
            self.bar.println(format!(
                "fsck: {name}{counted}: {:.1} s",
                started.elapsed().as_secs_f64()
            ));
        }
    }

    fn finish(&self) {
        self.end_step();
        self.bar.finish_and_clear();
    }
}

impl Progress for Steps {
    fn step(&self, name: &'static str, total: Option<u64>) {
        self.end_step();
        let template = match total {
            Some(_) => "fsck: {msg} [{bar:30}] {pos}/{len} eta {eta}",
            None => "fsck: {msg} {spinner} {pos}",
        };
        self.bar.set_style(
            indicatif::ProgressStyle::with_template(template)
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        match total {
            Some(n) => self.bar.set_length(n),
            None => self.bar.unset_length(),
        }
        self.bar.set_position(0);
        self.bar.reset_eta();
        self.bar.set_message(name);
        self.bar.tick();
        *self.current.lock() = Some((name, Instant::now()));
    }

    fn advance(&self, n: u64) {
        self.bar.inc(n);
    }
}
