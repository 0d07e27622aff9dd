//! Offline check and repair of a filesystem on a store that is not mounted.
//!
//! Loading already verifies the header copies, the checkpoint and every
//! journal record's checksums. On top of that fsck checks the directory tree
//! (entries point to live inodes, ".." agrees with the entry that names a
//! directory, every inode is reachable or an orphan), link counts, extents
//! (inside Data groups, block aligned, no overlap between or within files)
//! and the counters. With `repair` it fixes what it found and writes a fresh
//! checkpoint.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use super::core::{build_allocator, load_showing};
use super::dir::Dir;
use super::inode::{Inode, Time};
use super::layout::{encode, write_header, FS_FEATURES};
use super::meta::Meta;
use super::meta_tree::MetaTree;
use super::progress::{Progress, Silent};
use super::store::BlockStore;
use super::{FileKind, FsError, FsResult, ROOT_INO};

#[derive(Debug, Default, Clone)]
pub struct FsckReport {
    /// Inconsistencies (with `repair`, the ones that were fixed).
    pub problems: Vec<String>,
    /// Things worth knowing that are not inconsistencies (an orphan awaiting
    /// release, an empty checkpoint slot).
    pub notes: Vec<String>,
    pub repaired: bool,
    pub inodes: u64,
    pub directories: u64,
    pub journal_records: u64,
    pub used_bytes: u64,
    /// Free bytes as statfs (`df`) counts them: free space in the data
    /// groups plus the data capacity of the groups not yet allocated.
    pub free_bytes: u64,
}

impl FsckReport {
    pub fn is_clean(&self) -> bool {
        self.problems.is_empty()
    }
}

pub fn fsck(store: Arc<dyn BlockStore>, repair: bool) -> FsResult<FsckReport> {
    fsck_with(store, repair, &Silent)
}

/// [`fsck`], telling `progress` of each step.
pub fn fsck_with(
    store: Arc<dyn BlockStore>,
    repair: bool,
    progress: &dyn Progress,
) -> FsResult<FsckReport> {
    let loaded = load_showing(&store, progress)?;
    if repair {
        FS_FEATURES
            .refuse_write(&loaded.journal.header.features)
            .map_err(FsError::Feature)?;
    }
    let mut report = FsckReport {
        journal_records: loaded.replayed,
        ..Default::default()
    };
    let mut header_bad = false;
    for note in loaded.notes {
        if note.starts_with("header") {
            header_bad = true;
            report.problems.push(note);
        } else {
            report.notes.push(note);
        }
    }
    let mut meta = loaded.meta;
    let checks: [(&'static str, Check); 7] = [
        ("checking directory cookies", |_, m, r| check_dir_maps(m, r)),
        ("checking directory entries", |_, m, r| check_entries(m, r)),
        ("checking that every inode is reachable", |_, m, r| {
            check_reachability(m, r)
        }),
        ("checking link counts", |_, m, r| check_link_counts(m, r)),
        ("checking extents", check_extents),
        ("checking data checksums", |_, m, r| check_checksums(m, r)),
        ("checking counters", |_, m, r| check_counters(m, r)),
    ];
    for (name, check) in checks {
        progress.step(name, None);
        check(&store, &mut meta, &mut report);
    }
    report.inodes = meta.inodes.len() as u64;
    report.directories = meta.dirs.len() as u64;
    if repair && !report.problems.is_empty() {
        let mut journal = loaded.journal;
        if header_bad {
            journal.header.generation += 1;
            write_header(store.as_ref(), journal.meta_group, &journal.header)?;
        }
        progress.step("writing the repaired metadata", None);
        match &loaded.tree {
            // A new tree beside the one loaded, which stays whole until
            // the new root is durable.
            Some(tree) => {
                let mut nodes = Vec::new();
                crate::fs::tree::walk(
                    store.as_ref(),
                    &journal.header.uuid,
                    tree.lock().root(),
                    &mut |addr, _| {
                        nodes.push(addr);
                        Ok(())
                    },
                )?;
                MetaTree::write_fresh(Arc::clone(&store), &mut journal, &meta, &[], &nodes)?;
            }
            None => journal.checkpoint(store.as_ref(), &encode(&meta.image()?)?)?,
        }
        report.repaired = true;
    }
    Ok(report)
}

/// One of fsck's checks over the loaded metadata.
type Check = fn(&Arc<dyn BlockStore>, &mut Meta, &mut FsckReport);

fn check_dir_maps(meta: &mut Meta, report: &mut FsckReport) {
    let stray: Vec<u64> = meta
        .dirs
        .keys()
        .filter(|ino| !meta.inodes.get(ino).is_some_and(Inode::is_dir))
        .copied()
        .collect();
    for ino in stray {
        report.problems.push(format!(
            "directory contents kept for {ino}, which is not a live directory"
        ));
        meta.dirs.remove(&ino);
    }
    let missing: Vec<u64> = meta
        .inodes
        .values()
        .filter(|i| i.is_dir() && !meta.dirs.contains_key(&i.ino))
        .map(|i| i.ino)
        .collect();
    for ino in missing {
        report
            .problems
            .push(format!("directory {ino} has no contents record"));
        meta.dirs.insert(ino, Dir::default());
    }
}

/// Entries must name live inodes, and a directory only once, from its "..".
fn check_entries(meta: &mut Meta, report: &mut FsckReport) {
    let mut named_dirs: BTreeMap<u64, u64> = BTreeMap::new();
    let mut dir_inos: Vec<u64> = meta.dirs.keys().copied().collect();
    dir_inos.sort();
    for dir in dir_inos {
        let entries: Vec<(Vec<u8>, u64)> = meta.dirs[&dir]
            .iter()
            .map(|(n, s)| (n.to_vec(), s.ino))
            .collect();
        for (name, ino) in entries {
            let shown = String::from_utf8_lossy(&name).into_owned();
            let Some(child) = meta.inodes.get(&ino) else {
                report.problems.push(format!(
                    "entry {shown:?} in directory {dir} points to missing inode {ino}"
                ));
                remove_entry(meta, dir, &name);
                continue;
            };
            if child.is_dir() {
                if ino == ROOT_INO || named_dirs.contains_key(&ino) {
                    report.problems.push(format!(
                        "directory {ino} has a second name {shown:?} in {dir}"
                    ));
                    remove_entry(meta, dir, &name);
                    continue;
                }
                named_dirs.insert(ino, dir);
                if child.parent != dir {
                    report.problems.push(format!(
                        "directory {ino} says its parent is {} but is named in {dir}",
                        child.parent
                    ));
                    if let Some(c) = meta.inodes.get_mut(&ino) {
                        c.parent = dir;
                    }
                }
            }
        }
    }
    if let Some(root) = meta.inodes.get_mut(&ROOT_INO) {
        if root.parent != ROOT_INO {
            report
                .problems
                .push("root directory's \"..\" is not itself".into());
            root.parent = ROOT_INO;
        }
    }
}

fn remove_entry(meta: &mut Meta, dir: u64, name: &[u8]) {
    if let Some(d) = meta.dirs.get_mut(&dir) {
        d.remove(name);
    }
}

fn reachable(meta: &Meta) -> BTreeSet<u64> {
    let mut seen = BTreeSet::from([ROOT_INO]);
    let mut queue = VecDeque::from([ROOT_INO]);
    while let Some(dir) = queue.pop_front() {
        let Some(d) = meta.dirs.get(&dir) else {
            continue;
        };
        for (_, slot) in d.iter() {
            if seen.insert(slot.ino) && meta.dirs.contains_key(&slot.ino) {
                queue.push_back(slot.ino);
            }
        }
    }
    seen
}

/// Unreachable inodes with names are moved to /lost+found; nameless ones
/// are orphans (unlinked while open) and are freed at the next mount.
fn check_reachability(meta: &mut Meta, report: &mut FsckReport) {
    let mut seen = reachable(meta);
    let mut unreachable: Vec<u64> = meta
        .inodes
        .keys()
        .filter(|i| !seen.contains(i))
        .copied()
        .collect();
    unreachable.sort();
    for ino in unreachable {
        if seen.contains(&ino) {
            continue;
        }
        if meta.inodes[&ino].nlink == 0 {
            report.notes.push(format!(
                "orphan inode {ino} (unlinked while open) will be freed at the next mount"
            ));
            continue;
        }
        report.problems.push(format!(
            "inode {ino} is not reachable from the root; moved to /lost+found"
        ));
        let lost = lost_and_found(meta);
        let name = format!("#{ino}").into_bytes();
        if let Some(d) = meta.dirs.get_mut(&lost) {
            d.insert(&name, ino);
        }
        if let Some(i) = meta.inodes.get_mut(&ino) {
            if i.is_dir() {
                i.parent = lost;
            }
        }
        seen = reachable(meta);
    }
}

fn lost_and_found(meta: &mut Meta) -> u64 {
    if let Some(slot) = meta.dirs.get(&ROOT_INO).and_then(|d| d.get(b"lost+found")) {
        if meta.dirs.contains_key(&slot.ino) {
            return slot.ino;
        }
    }
    let ino = meta.next_ino;
    meta.next_ino += 1;
    let generation = meta.next_gen;
    meta.next_gen += 1;
    let mut inode = Inode::new(ino, generation, FileKind::Dir, 0o700, 0, 0);
    inode.parent = ROOT_INO;
    inode.nlink = 2;
    meta.inodes.insert(ino, inode);
    meta.dirs.insert(ino, Dir::default());
    if let Some(root) = meta.dirs.get_mut(&ROOT_INO) {
        root.insert(b"lost+found", ino);
    }
    ino
}

fn check_link_counts(meta: &mut Meta, report: &mut FsckReport) {
    let mut expected: BTreeMap<u64, u32> = BTreeMap::new();
    for (&dir, d) in &meta.dirs {
        *expected.entry(dir).or_default() += 2;
        for (_, slot) in d.iter() {
            if meta.dirs.contains_key(&slot.ino) {
                *expected.entry(dir).or_default() += 1;
            } else {
                *expected.entry(slot.ino).or_default() += 1;
            }
        }
    }
    let seen = reachable(meta);
    for inode in meta.inodes.values_mut() {
        if !seen.contains(&inode.ino) {
            continue;
        }
        let want = expected.get(&inode.ino).copied().unwrap_or(0);
        if inode.nlink != want {
            report.problems.push(format!(
                "inode {} has link count {} but {} names",
                inode.ino, inode.nlink, want
            ));
            inode.nlink = want;
            inode.ctime = Time::now();
        }
    }
}

fn check_extents(store: &Arc<dyn BlockStore>, meta: &mut Meta, report: &mut FsckReport) {
    for inode in meta.inodes.values_mut() {
        if inode.kind != FileKind::File && !inode.extents.is_empty() {
            report.problems.push(format!(
                "inode {} is a {:?} but has data extents",
                inode.ino, inode.kind
            ));
            inode.extents.take_all();
        }
    }
    let groups = store.groups();
    loop {
        let (alloc, problems) = build_allocator(&groups, meta);
        if problems.is_empty() {
            report.used_bytes = alloc.total_bytes() - alloc.free_bytes();
            let (free_groups, group_capacity) = store.free_groups();
            report.free_bytes = alloc.free_bytes() + free_groups.saturating_mul(group_capacity);
            let runs: u64 = alloc.free_runs().iter().map(|r| r.2).sum();
            let used: u64 = meta
                .inodes
                .values()
                .map(|i| i.extents.allocated_bytes())
                .sum();
            if runs != alloc.free_bytes() || used + runs != alloc.total_bytes() {
                report.problems.push(format!(
                    "free space accounting: used {used} + free {runs} != capacity {}",
                    alloc.total_bytes()
                ));
            }
            return;
        }
        // Drop the first offending extent and look again: the later of two
        // overlapping claims loses, as it is the one build_allocator reports.
        let first = &problems[0];
        report.problems.push(first.clone());
        if !drop_reported_extent(meta, first) {
            report.problems.extend(problems.into_iter().skip(1));
            return;
        }
    }
}

/// Parse "inode N offset M: ..." and drop that extent.
fn drop_reported_extent(meta: &mut Meta, problem: &str) -> bool {
    let mut words = problem.split_whitespace();
    let (Some("inode"), Some(ino), Some("offset"), Some(off)) =
        (words.next(), words.next(), words.next(), words.next())
    else {
        return false;
    };
    let (Ok(ino), Ok(off)) = (ino.parse::<u64>(), off.trim_end_matches(':').parse::<u64>()) else {
        return false;
    };
    meta.inodes
        .get_mut(&ino)
        .and_then(|i| i.extents.drop_at(off))
        .is_some()
}

fn check_counters(meta: &mut Meta, report: &mut FsckReport) {
    let max_ino = meta.inodes.keys().max().copied().unwrap_or(ROOT_INO);
    if meta.next_ino <= max_ino {
        report.problems.push(format!(
            "next inode number {} is not above the largest in use {max_ino}",
            meta.next_ino
        ));
        meta.next_ino = max_ino + 1;
    }
    let max_gen = meta
        .inodes
        .values()
        .map(|i| i.generation)
        .max()
        .unwrap_or(0);
    if meta.next_gen <= max_gen {
        report.problems.push(format!(
            "next generation {} is not above the largest in use {max_gen}",
            meta.next_gen
        ));
        meta.next_gen = max_gen + 1;
    }
    for inode in meta.inodes.values() {
        if inode.kind == FileKind::Symlink && inode.target.is_empty() {
            report
                .problems
                .push(format!("symlink {} has an empty target", inode.ino));
        }
    }
}

/// Every checksum must belong to a block some file maps (the extents were
/// settled by `check_extents`); checksums of blocks no file uses are dropped.
fn check_checksums(meta: &mut Meta, report: &mut FsckReport) {
    let mut extents: Vec<(u64, u64)> = meta
        .inodes
        .values()
        .flat_map(|i| i.extents.iter().map(|(_, e)| (e.addr, e.len)))
        .collect();
    extents.sort_unstable();
    let mapped = |addr: u64| {
        let i = extents.partition_point(|&(a, _)| a <= addr);
        i > 0 && addr < extents[i - 1].0 + extents[i - 1].1
    };
    // fsck loads the whole map.
    let Ok(mut csums) = meta.csums.whole_mut() else {
        report
            .problems
            .push("the data block checksums were not loaded whole".into());
        return;
    };
    let stray: Vec<u64> = csums.addrs().into_iter().filter(|a| !mapped(*a)).collect();
    if stray.is_empty() {
        return;
    }
    report.problems.push(format!(
        "{} data block checksums kept for blocks no file uses",
        stray.len()
    ));
    for addr in stray {
        csums.remove(addr, super::inode::BLOCK_SIZE);
    }
}
