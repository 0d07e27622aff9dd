//! The simulated world of one run: the filesystem over the array engine over
//! fault-injecting in-memory members, the schedule's actions carried out on
//! it, and the checks against the reference model after every power cut,
//! remount and scrub.
//!
//! Faults are kept within what the array promises: a fault that removes
//! redundancy (a failed, pulled or rotted member) is injected only while
//! the damage already outstanding leaves room for it, so that every loss
//! the checks find is raidfs's, never the schedule's.

use super::model::{Knowledge, Model, Name, NodeId, DIRS};
use super::schedule::{Action, Fault, FsOp};
use raidfs::array::{assemble, create, Array, AssembleOptions, CreateSpec, SyncAction};
use raidfs::fs::{
    fsck, ArrayStore, Caller, FallocateMode, FileKind, FormatOptions, FsError, FsOptions,
    RenameFlags, SetAttr, ROOT_INO,
};
use raidfs::geometry::{Geometry, Layout, Level};
use raidfs::member::faulty::{FaultyMember, Ops};
use raidfs::member::Member;
use raidfs::superblock::DEFAULT_DATA_OFFSET;
use raidfs::volume::Volume;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::sync::Arc;

pub const MEMBER_SIZE: u64 = 48 << 20;
const CHUNK: u64 = 16 << 10;
/// A file never grows past this (the array must hold the whole model).
const MAX_FILE: u64 = 768 << 10;
/// The model's bytes at most; writes past it are skipped.
const MAX_TOTAL: usize = 12 << 20;
const MAX_MEMBERS: usize = 7;

/// The array a seed runs on.
#[derive(Clone, Copy, Debug)]
pub struct Config {
    pub level: Level,
    pub members: usize,
    pub ppl: bool,
    /// `-o metadata_cache`: every other round of eight seeds keeps no clean
    /// inode, so every inode not changed since the last checkpoint is
    /// read from the metadata tree.
    pub metadata_cache: u64,
}

impl Config {
    pub fn for_seed(seed: u64) -> Config {
        const CONFIGS: [(Level, usize, bool); 8] = [
            (Level::Raid5, 4, false),
            (Level::Raid5, 4, true),
            (Level::Raid6, 5, false),
            (Level::Raid1, 2, false),
            (Level::Raid1, 3, false),
            (Level::Raid10, 4, false),
            (Level::Raid5, 3, true),
            (Level::Raid6, 4, false),
        ];
        let (level, members, ppl) = CONFIGS[(seed % CONFIGS.len() as u64) as usize];
        Config {
            level,
            members,
            ppl,
            metadata_cache: if (seed / CONFIGS.len() as u64) % 2 == 1 {
                0
            } else {
                raidfs::fs::DEFAULT_METADATA_CACHE
            },
        }
    }
}

/// Why a run failed.
#[derive(Debug)]
pub struct Failure(pub String);

type Check<T = ()> = Result<T, Failure>;

fn fail<T>(why: impl Into<String>) -> Check<T> {
    Err(Failure(why.into()))
}

/// Counts of what a run did.
#[derive(Clone, Debug, Default)]
pub struct Tally {
    pub ops: u64,
    pub faults: BTreeMap<&'static str, u64>,
    pub checks: u64,
}

/// A fault of the host that lasts until action `until`.
struct HostFault {
    until: usize,
    members: Vec<String>,
}

pub struct World {
    pub cfg: Config,
    seed: u64,
    /// The array's members by name; `members[i]` has name `names[i]`.
    members: Vec<FaultyMember>,
    names: Vec<String>,
    next_member: usize,
    volume: Option<Volume>,
    know: Knowledge,
    inos: BTreeMap<NodeId, u64>,
    dir_inos: Vec<u64>,
    /// Members taken out (failed or pulled), by name, to come back later.
    out: Vec<String>,
    /// Members whose bytes were flipped since the last repair.
    rotted: Vec<String>,
    host_fault: Option<HostFault>,
    /// Operations refused while a host fault lasted.
    pub tally: Tally,
    /// What the run did, shared with the watchdog (which prints it when
    /// an action hangs).
    pub trace: Arc<parking_lot::Mutex<Vec<String>>>,
    /// Actions begun, for the watchdog.
    pub heartbeat: Arc<std::sync::atomic::AtomicUsize>,
}

fn n(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn root() -> Caller {
    Caller::root()
}

/// Deterministic bytes for a write.
fn bytes(seed: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    StdRng::seed_from_u64(u64::from(seed)).fill(&mut v[..]);
    v
}

fn fs_opts(cfg: &Config) -> FsOptions {
    FsOptions {
        // Commits come from fsync and sync, so a power cut loses what they did not cover.
        commit_interval_secs: 3600,
        metadata_cache: cfg.metadata_cache,
        ..FsOptions::default()
    }
}

impl World {
    pub fn new(
        seed: u64,
        trace: Arc<parking_lot::Mutex<Vec<String>>>,
        heartbeat: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Check<World> {
        let cfg = Config::for_seed(seed);
        let mut w = World {
            cfg,
            seed,
            members: Vec::new(),
            names: Vec::new(),
            next_member: 0,
            volume: None,
            know: Knowledge::default(),
            inos: BTreeMap::new(),
            dir_inos: Vec::new(),
            out: Vec::new(),
            rotted: Vec::new(),
            host_fault: None,
            tally: Tally::default(),
            trace,
            heartbeat,
        };
        for _ in 0..cfg.members {
            w.new_member()?;
        }
        let spec = CreateSpec {
            level: cfg.level,
            layout: Layout::LeftSymmetric,
            chunk: CHUNK,
            copies: if cfg.level == Level::Raid1 {
                cfg.members
            } else if cfg.level == Level::Raid10 {
                2
            } else {
                1
            },
            name: format!("sim{seed}"),
            ppl: cfg.ppl,
        };
        let handles = w.handles();
        let array = create(handles, &spec).map_err(|e| Failure(format!("create: {e}")))?;
        raidfs::fs::format_array(Arc::new(array), &FormatOptions::default())
            .map_err(|e| Failure(format!("format: {e}")))?;
        w.open(false)?;
        let fs = w.fs();
        w.dir_inos = vec![ROOT_INO];
        for (i, dir) in DIRS.iter().enumerate().skip(1) {
            let (parent, leaf) = match dir.rsplit_once('/') {
                Some((p, l)) => (DIRS.iter().position(|d| *d == p).unwrap_or(0), l),
                None => (0, *dir),
            };
            let ino = fs
                .mkdir(&root(), w.dir_inos[parent], n(leaf), 0o755, 0)
                .map_err(|e| Failure(format!("mkdir {dir}: {e}")))?
                .ino;
            debug_assert_eq!(w.dir_inos.len(), i);
            w.dir_inos.push(ino);
        }
        fs.sync_all()
            .map_err(|e| Failure(format!("first sync: {e}")))?;
        w.know.synced();
        Ok(w)
    }

    fn new_member(&mut self) -> Check<(FaultyMember, String)> {
        let name = format!("s{}m{}", self.seed, self.next_member);
        self.next_member += 1;
        let m = FaultyMember::memory(MEMBER_SIZE, &name)
            .map_err(|e| Failure(format!("memory member: {e}")))?;
        self.members.push(m.clone());
        self.names.push(name.clone());
        Ok((m, name))
    }

    fn member(&self, name: &str) -> Option<&FaultyMember> {
        let i = self.names.iter().position(|n| n == name)?;
        self.members.get(i)
    }

    fn handles(&self) -> Vec<(Arc<dyn Member>, String)> {
        self.members
            .iter()
            .zip(&self.names)
            .map(|(m, n)| (Arc::new(m.clone()) as Arc<dyn Member>, n.clone()))
            .collect()
    }

    fn note(&mut self, what: String) {
        self.trace.lock().push(what);
    }

    pub fn array(&self) -> &Arc<Array> {
        self.volume.as_ref().expect("open volume").array()
    }

    fn fs(&self) -> Arc<raidfs::fs::FileSystem> {
        Arc::clone(self.volume.as_ref().expect("open volume").fs())
    }

    /// Assemble the members (those of the array: not removed ones) and open
    /// the volume on them.
    fn open(&mut self, force: bool) -> Check {
        let in_array = self.array_members();
        let opts = AssembleOptions {
            force,
            ..AssembleOptions::default()
        };
        let assembly = assemble(in_array, opts).map_err(|e| Failure(format!("assemble: {e}")))?;
        let array = Arc::new(assembly.array);
        let volume = Volume::open(array, fs_opts(&self.cfg))
            .map_err(|e| Failure(format!("open volume: {e}")))?;
        self.volume = Some(volume);
        Ok(())
    }

    /// Every member the world has that is not out of the array.
    fn array_members(&self) -> Vec<(Arc<dyn Member>, String)> {
        self.handles()
            .into_iter()
            .filter(|(_, name)| !self.out.contains(name))
            .collect()
    }

    /// How many more members the array can lose now: its least tolerant
    /// group, less the damage outstanding (members out, failed or rotted).
    fn spare_tolerance(&self) -> usize {
        let array = self.array();
        let mut tolerance = array.metadata_geometry().tolerance();
        for (g, _) in array.groups() {
            if let Some(geo) = array.group_geometry(g) {
                tolerance = tolerance.min(geo.tolerance());
            }
        }
        let failed = array.failed_slots().len();
        let rebuilding = array
            .status()
            .members
            .iter()
            .filter(|m| m.state != raidfs::array::MemberState::Active)
            .count();
        let damage = failed.max(rebuilding) + self.rotted.len();
        tolerance.saturating_sub(damage)
    }

    fn busy(&self) -> bool {
        self.array().sync_progress().is_some() || self.array().is_reshaping()
    }

    /// Wait for the background work (rebuild, resync, reshape, scrub).
    fn settle(&mut self) -> Check {
        for _ in 0..16 {
            self.array().wait_background();
            if !self.busy() {
                return Ok(());
            }
            if self.array().is_reshaping() && self.array().sync_progress().is_none() {
                // A reshape that could not run while degraded resumes now.
                let _ = self.array().resume_reshape();
            }
        }
        if self.busy() {
            return fail("background work does not end");
        }
        Ok(())
    }

    // ---- the filesystem operations ----

    fn ino(&self, id: NodeId) -> Option<u64> {
        self.inos.get(&id).copied()
    }

    fn host_faulty(&self) -> bool {
        self.host_fault.is_some()
    }

    /// An operation failed: allowed only while the host fails (the array
    /// suspended or short of space); what it touched is then uncertain.
    fn refused(&mut self, what: &str, e: FsError, names: &[Name], nodes: &[NodeId]) -> Check {
        if !self.host_faulty() {
            return fail(format!("{what}: {e} (no host fault active)"));
        }
        self.note(format!("  refused: {what}: {e}"));
        self.know.uncertain_names.extend(names.iter().cloned());
        self.know.uncertain_nodes.extend(nodes.iter().copied());
        Ok(())
    }

    pub fn op(&mut self, op: &FsOp) -> Check {
        self.tally.ops += 1;
        let fs = self.fs();
        let c = root();
        match *op {
            FsOp::Create { dir, name } => {
                let key: Name = (dir, format!("f{name}"));
                if self.know.now.names.contains_key(&key)
                    || self.know.uncertain_names.contains(&key)
                {
                    return Ok(());
                }
                match fs.mknod(&c, self.dir_inos[dir as usize], n(&key.1), 0o100644, 0, 0) {
                    Ok(attr) => {
                        let id = self.know.now.new_node();
                        self.know.now.names.insert(key.clone(), id);
                        self.know.saw(&key);
                        self.inos.insert(id, attr.ino);
                    }
                    Err(e) => self.refused("create", e, &[key], &[])?,
                }
            }
            FsOp::Write {
                pick,
                off,
                len,
                seed,
            } => {
                let Some((key, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let off = off % MAX_FILE;
                let len = (len as u64).min(MAX_FILE - off) as usize;
                if len == 0 || self.know.now.total_bytes() + len > MAX_TOTAL {
                    return Ok(());
                }
                let data = bytes(seed, len);
                match fs.write(ino, off, &data) {
                    Ok(done) if done == len => self.know.now.write(id, off, &data),
                    Ok(done) => return fail(format!("write of {len} to {key:?} wrote {done}")),
                    Err(e) => self.refused("write", e, &[], &[id])?,
                }
            }
            FsOp::Burst { pick, count, seed } => {
                // Many small aligned writes: the stripe cache and the log.
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let mut r = StdRng::seed_from_u64(u64::from(seed));
                for i in 0..count {
                    let block = r.gen_range(0..MAX_FILE / 4096);
                    let data = bytes(seed.wrapping_add(u32::from(i)), 4096);
                    match fs.write(ino, block * 4096, &data) {
                        Ok(_) => self.know.now.write(id, block * 4096, &data),
                        Err(e) => return self.refused("burst write", e, &[], &[id]),
                    }
                }
            }
            FsOp::Truncate { pick, size } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let size = size % MAX_FILE;
                let set = SetAttr {
                    size: Some(size),
                    ..Default::default()
                };
                match fs.setattr(&c, ino, &set) {
                    Ok(_) => self.know.now.resize(id, size),
                    Err(e) => self.refused("truncate", e, &[], &[id])?,
                }
            }
            FsOp::Fallocate {
                pick,
                off,
                len,
                keep_size,
            } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let off = off % MAX_FILE;
                let len = len.clamp(1, MAX_FILE - off);
                let mode = FallocateMode {
                    keep_size,
                    punch_hole: false,
                };
                match fs.fallocate(ino, off, len, mode) {
                    Ok(()) => {
                        let size = self.know.now.nodes[&id].data.len() as u64;
                        if !keep_size && off + len > size {
                            self.know.now.resize(id, off + len);
                        }
                    }
                    Err(e) => self.refused("fallocate", e, &[], &[id])?,
                }
            }
            FsOp::Punch { pick, off, len } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let off = off % MAX_FILE;
                let len = len.clamp(1, MAX_FILE - off);
                let mode = FallocateMode {
                    keep_size: true,
                    punch_hole: true,
                };
                match fs.fallocate(ino, off, len, mode) {
                    Ok(()) => self.know.now.zero(id, off, len),
                    Err(e) => self.refused("punch", e, &[], &[id])?,
                }
            }
            FsOp::Rename { pick, dir, name } => {
                let Some((from, _, _)) = self.target(pick) else {
                    return Ok(());
                };
                let to: Name = (dir, format!("f{name}"));
                if from == to || self.know.uncertain_names.contains(&to) {
                    return Ok(());
                }
                let result = fs.rename(
                    &c,
                    self.dir_inos[from.0 as usize],
                    n(&from.1),
                    self.dir_inos[to.0 as usize],
                    n(&to.1),
                    RenameFlags::default(),
                );
                match result {
                    Ok(()) => {
                        let id = self.know.now.names[&from];
                        if self.know.now.names.get(&to) == Some(&id) {
                            // Both names are links of one inode: POSIX renames nothing.
                            return Ok(());
                        }
                        self.know.now.unlink(&to);
                        self.know.now.names.remove(&from);
                        self.know.now.names.insert(to.clone(), id);
                        self.know.saw(&to);
                    }
                    Err(e) => self.refused("rename", e, &[from, to], &[])?,
                }
            }
            FsOp::Link { pick, dir, name } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let to: Name = (dir, format!("f{name}"));
                if self.know.now.names.contains_key(&to) || self.know.uncertain_names.contains(&to)
                {
                    return Ok(());
                }
                match fs.link(&c, ino, self.dir_inos[dir as usize], n(&to.1)) {
                    Ok(_) => {
                        self.know.now.names.insert(to.clone(), id);
                        self.know.saw(&to);
                    }
                    Err(e) => self.refused("link", e, &[to], &[])?,
                }
            }
            FsOp::Unlink { pick } => {
                let Some((key, _, _)) = self.target(pick) else {
                    return Ok(());
                };
                match fs.unlink(&c, self.dir_inos[key.0 as usize], n(&key.1)) {
                    Ok(()) => self.know.now.unlink(&key),
                    Err(e) => self.refused("unlink", e, &[key], &[])?,
                }
            }
            FsOp::SetXattr {
                pick,
                key,
                len,
                seed,
            } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let name = format!("user.k{key}");
                let value = bytes(seed, len as usize);
                match fs.setxattr(&c, ino, n(&name), &value, 0) {
                    Ok(()) => {
                        if let Some(node) = self.know.now.nodes.get_mut(&id) {
                            node.xattrs.insert(name, value);
                        }
                    }
                    Err(e) => self.refused("setxattr", e, &[], &[id])?,
                }
            }
            FsOp::RemoveXattr { pick, key } => {
                let Some((_, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                let name = format!("user.k{key}");
                let had = self.know.now.nodes[&id].xattrs.contains_key(&name);
                match fs.removexattr(&c, ino, n(&name)) {
                    Ok(()) if had => {
                        if let Some(node) = self.know.now.nodes.get_mut(&id) {
                            node.xattrs.remove(&name);
                        }
                    }
                    Ok(()) => return fail(format!("removexattr of missing {name} succeeded")),
                    Err(FsError::NoAttr) if !had => {}
                    Err(e) => self.refused("removexattr", e, &[], &[id])?,
                }
            }
            FsOp::Fsync { pick } => {
                let Some((_, _, ino)) = self.target(pick) else {
                    return Ok(());
                };
                match fs.fsync(ino, false) {
                    Ok(()) => self.after_sync()?,
                    Err(e) => self.refused("fsync", e, &[], &[])?,
                }
            }
            FsOp::Sync => match fs.sync_all() {
                Ok(()) => self.after_sync()?,
                Err(e) => self.refused("sync", e, &[], &[])?,
            },
            FsOp::Verify { pick } => {
                let Some((key, id, ino)) = self.target(pick) else {
                    return Ok(());
                };
                if self.know.uncertain_nodes.contains(&id) {
                    return Ok(());
                }
                let want = &self.know.now.nodes[&id].data;
                match fs.read(ino, 0, want.len() + 4096) {
                    Ok(got) if got == *want => {}
                    Ok(got) => {
                        return fail(format!(
                            "{key:?} reads {} bytes, first difference at {:?}; the model has {}",
                            got.len(),
                            first_difference(&got, want),
                            want.len()
                        ))
                    }
                    Err(e) if self.host_faulty() => self.note(format!("  read refused: {e}")),
                    Err(e) => return fail(format!("read of {key:?}: {e}")),
                }
            }
        }
        Ok(())
    }

    /// An fsync or sync returned: what was uncertain is read back first, so
    /// the durable snapshot is exactly what the filesystem holds.
    fn after_sync(&mut self) -> Check {
        if !self.know.is_certain() {
            if self.host_faulty() {
                self.know.synced();
                return Ok(());
            }
            self.adopt_uncertain()?;
        }
        self.know.synced();
        Ok(())
    }

    /// The `pick`th name with its node and inode.
    fn target(&self, pick: u32) -> Option<(Name, NodeId, u64)> {
        let key = self.know.now.pick(pick)?;
        let id = self.know.now.node_of(&key)?;
        let ino = self.ino(id)?;
        Some((key, id, ino))
    }

    /// Read back what failed operations left uncertain.
    fn adopt_uncertain(&mut self) -> Check {
        let fs = self.fs();
        let names = std::mem::take(&mut self.know.uncertain_names);
        let nodes = std::mem::take(&mut self.know.uncertain_nodes);
        let mut by_ino: BTreeMap<u64, NodeId> =
            self.inos.iter().map(|(id, ino)| (*ino, *id)).collect();
        for key in names {
            match fs.lookup(&root(), self.dir_inos[key.0 as usize], n(&key.1)) {
                Ok(attr) => {
                    let id = match by_ino.get(&attr.ino) {
                        Some(&id) => id,
                        None => {
                            let id = self.know.now.new_node();
                            self.inos.insert(id, attr.ino);
                            by_ino.insert(attr.ino, id);
                            self.read_node(&fs, id, attr.ino)?;
                            id
                        }
                    };
                    self.know.now.names.remove(&key);
                    self.know.now.names.insert(key.clone(), id);
                    self.know.saw(&key);
                }
                Err(FsError::NotFound) => self.know.now.unlink(&key),
                Err(e) => return fail(format!("lookup of uncertain {key:?}: {e}")),
            }
        }
        // Nodes no name holds any more are gone.
        let live: std::collections::BTreeSet<NodeId> =
            self.know.now.names.values().copied().collect();
        self.know.now.nodes.retain(|id, _| live.contains(id));
        for id in nodes {
            if let Some(ino) = self.ino(id).filter(|_| live.contains(&id)) {
                self.read_node(&fs, id, ino)?;
            }
        }
        Ok(())
    }

    fn read_node(&mut self, fs: &raidfs::fs::FileSystem, id: NodeId, ino: u64) -> Check {
        let attr = fs
            .getattr(ino)
            .map_err(|e| Failure(format!("getattr {ino}: {e}")))?;
        let data = fs
            .read(ino, 0, attr.size as usize)
            .map_err(|e| Failure(format!("read back of inode {ino}: {e}")))?;
        let xattrs = read_xattrs(fs, ino)?;
        let node = self.know.now.nodes.entry(id).or_default();
        node.data = data;
        node.xattrs = xattrs;
        Ok(())
    }

    // ---- the faults ----

    pub fn fault(&mut self, f: &Fault, index: usize) -> Check {
        match *f {
            Fault::Fail { pick } => {
                if self.spare_tolerance() == 0 || self.busy() || self.host_faulty() {
                    return Ok(());
                }
                let slot = pick as usize % self.array().member_count();
                let Some(name) = self.slot_name(slot) else {
                    return Ok(());
                };
                self.count("fail");
                self.note(format!("  fail slot {slot} ({name})"));
                self.array()
                    .fail(slot)
                    .map_err(|e| Failure(format!("fail slot {slot}: {e}")))?;
                // A hot spare may have taken the slot over already.
                if self.array().slot_of(&name).is_some() {
                    self.array()
                        .remove(&name)
                        .map_err(|e| Failure(format!("remove {name}: {e}")))?;
                }
                self.out.push(name);
            }
            Fault::Pull { pick } => {
                // The member goes away: its next I/O fails and the array fails it.
                if self.spare_tolerance() == 0 || self.busy() || self.host_faulty() {
                    return Ok(());
                }
                let slot = pick as usize % self.array().member_count();
                let Some(name) = self.slot_name(slot) else {
                    return Ok(());
                };
                self.count("pull");
                self.note(format!("  pull {name}"));
                if let Some(m) = self.member(&name) {
                    m.pull();
                }
                self.out.push(name);
            }
            Fault::Return { fresh } => {
                // A member taken out comes back: re-added (bitmap) or a new disk.
                if self.host_faulty() || self.busy() || self.out.is_empty() {
                    return Ok(());
                }
                let name = self.out.remove(0);
                let failed = self.array().failed_slots();
                let slot = self.array().slot_of(&name);
                match slot {
                    Some(s) if !failed.contains(&s) => {
                        // Pulled but no I/O reached it yet: it never left.
                        if let Some(m) = self.member(&name) {
                            m.reinsert();
                        }
                        self.note(format!("  {name} back before the array noticed"));
                        return Ok(());
                    }
                    Some(_) => {
                        self.array()
                            .remove(&name)
                            .map_err(|e| Failure(format!("remove failed {name}: {e}")))?;
                    }
                    None => {}
                }
                let (member, new_name) = if fresh {
                    self.count("replace-disk");
                    self.forget_member(&name);
                    self.new_member()?
                } else {
                    self.count("re-add");
                    let m = self
                        .member(&name)
                        .cloned()
                        .ok_or_else(|| Failure(format!("no member {name}")))?;
                    m.heal();
                    (m, name.clone())
                };
                self.note(format!("  add {new_name}"));
                let outcome = self
                    .array()
                    .add(Arc::new(member), new_name.clone())
                    .map_err(|e| Failure(format!("add {new_name}: {e}")))?;
                self.note(format!("    {outcome:?}"));
                self.rotted.retain(|r| *r != name);
            }
            Fault::Replace { pick } => {
                if self.busy() || self.host_faulty() || !self.array().failed_slots().is_empty() {
                    return Ok(());
                }
                let slot = pick as usize % self.array().member_count();
                let Some(old) = self.slot_name(slot) else {
                    return Ok(());
                };
                self.count("replace");
                let (member, name) = self.new_member()?;
                self.note(format!("  replace slot {slot} ({old}) with {name}"));
                self.array()
                    .replace(slot, Arc::new(member), name)
                    .map_err(|e| Failure(format!("replace slot {slot}: {e}")))?;
                self.settle()?;
                if self.array().slot_of(&old).is_none() {
                    self.forget_member(&old);
                    self.rotted.retain(|r| *r != old);
                }
            }
            Fault::AddSpare => {
                if self.host_faulty()
                    || !self.array().spares().is_empty()
                    || self.names.len() > MAX_MEMBERS
                {
                    return Ok(());
                }
                self.count("spare");
                let (member, name) = self.new_member()?;
                self.note(format!("  add spare {name}"));
                self.array()
                    .add(Arc::new(member), name)
                    .map_err(|e| Failure(format!("add spare: {e}")))?;
            }
            Fault::Grow { to_raid6 } => {
                let now = self.array().data_geometry();
                // The partial parity log is laid out for its members: such an
                // array refuses new ones (checked by its own test).
                if self.cfg.ppl
                    || self.busy()
                    || self.host_faulty()
                    || !self.array().failed_slots().is_empty()
                    || !self.out.is_empty()
                    || now.members >= MAX_MEMBERS
                    || !self.array().spares().is_empty()
                {
                    return Ok(());
                }
                let (level, copies) = match (now.level, to_raid6) {
                    (Level::Raid5, true) => (Level::Raid6, 1),
                    (Level::Raid1, _) => (Level::Raid1, now.members + 1),
                    (Level::Raid10, _) => return Ok(()),
                    (level, _) => (level, now.copies),
                };
                let Ok(target) =
                    Geometry::new(level, now.members + 1, now.chunk, copies, now.layout)
                else {
                    return Ok(());
                };
                self.count(if level != now.level {
                    "level-change"
                } else {
                    "grow"
                });
                let (member, name) = self.new_member()?;
                self.note(format!(
                    "  grow to {level} on {} members, adding {name}",
                    now.members + 1
                ));
                self.array()
                    .start_reshape_adding(target, vec![(Arc::new(member) as Arc<dyn Member>, name)])
                    .map_err(|e| Failure(format!("grow: {e}")))?;
            }
            Fault::Rot { pick, at, len } => {
                if self.spare_tolerance() == 0 || self.busy() || self.host_faulty() {
                    return Ok(());
                }
                let slot = pick as usize % self.array().member_count();
                let Some(name) = self.slot_name(slot) else {
                    return Ok(());
                };
                let Some(m) = self.member(&name).cloned() else {
                    return Ok(());
                };
                let span = m.len() - DEFAULT_DATA_OFFSET - (4 << 20);
                let at = DEFAULT_DATA_OFFSET + at % span;
                let mut buf = vec![0u8; len as usize + 1];
                if m.read_at(&mut buf, at).is_err() {
                    return Ok(());
                }
                buf.iter_mut().for_each(|b| *b ^= 0x5a);
                self.count("bit-rot");
                self.note(format!("  rot {} bytes of {name} at {at}", buf.len()));
                m.write_at(&buf, at)
                    .and_then(|_| m.sync())
                    .map_err(|e| Failure(format!("rot: {e}")))?;
                self.rotted.push(name);
            }
            Fault::HostFull { all, pick, lasts } => {
                if self.host_faulty() || self.busy() || !self.out.is_empty() {
                    return Ok(());
                }
                let count = self.array().member_count();
                let slots: Vec<usize> = if all {
                    (0..count).collect()
                } else {
                    vec![pick as usize % count]
                };
                self.count(if all {
                    "host-full-all"
                } else {
                    "host-full-one"
                });
                self.note(format!(
                    "  host full for members {slots:?} for {lasts} actions"
                ));
                self.host_errors(
                    &slots,
                    std::io::ErrorKind::StorageFull,
                    index + lasts as usize,
                )?;
            }
            Fault::HostEio { lasts } => {
                if self.host_faulty() || self.busy() || !self.out.is_empty() {
                    return Ok(());
                }
                let count = self.array().member_count();
                self.count("host-eio");
                self.note(format!("  host fails every member for {lasts} actions"));
                self.host_errors(
                    &(0..count).collect::<Vec<_>>(),
                    std::io::ErrorKind::Other,
                    index + lasts as usize,
                )?;
            }
            Fault::PowerCut { seed } => {
                if !self.may_power_cut() {
                    return Ok(());
                }
                self.count("power-cut");
                self.power_cut(seed)?;
            }
            Fault::Scrub { repair } => {
                if self.busy() || self.host_faulty() || !self.array().failed_slots().is_empty() {
                    return Ok(());
                }
                self.count(if repair { "repair" } else { "check" });
                self.scrub(repair)?;
            }
            Fault::Remount => {
                if self.host_faulty() {
                    return Ok(());
                }
                self.count("remount");
                self.remount()?;
            }
            Fault::Settle => {
                if !self.host_faulty() {
                    self.settle()?;
                }
            }
        }
        Ok(())
    }

    fn count(&mut self, kind: &'static str) {
        *self.tally.faults.entry(kind).or_default() += 1;
    }

    fn slot_name(&self, slot: usize) -> Option<String> {
        let status = self.array().status();
        let m = status.members.iter().find(|m| m.slot == slot)?;
        (m.state == raidfs::array::MemberState::Active && self.member(&m.name).is_some())
            .then(|| m.name.clone())
    }

    fn forget_member(&mut self, name: &str) {
        if let Some(i) = self.names.iter().position(|n| n == name) {
            self.names.remove(i);
            self.members.remove(i);
        }
    }

    fn host_errors(&mut self, slots: &[usize], kind: std::io::ErrorKind, until: usize) -> Check {
        let status = self.array().status();
        let mut members = Vec::new();
        for &slot in slots {
            let Some(st) = status.members.iter().find(|m| m.slot == slot) else {
                continue;
            };
            let Some(m) = self.member(&st.name) else {
                continue;
            };
            m.set_fault_kind(kind);
            m.fail_after(0, Ops::WRITES);
            members.push(st.name.clone());
        }
        self.host_fault = Some(HostFault { until, members });
        Ok(())
    }

    /// End a host fault whose time is up; the array resumes by itself.
    pub fn tick(&mut self, index: usize) -> Check {
        let Some(h) = &self.host_fault else {
            return Ok(());
        };
        if index < h.until {
            return Ok(());
        }
        let names = h.members.clone();
        self.host_fault = None;
        for name in names {
            if let Some(m) = self.member(&name) {
                m.heal();
            }
        }
        self.note("  host recovered".into());
        // The watcher probes every second; a suspended array resumes then.
        for _ in 0..100 {
            if self.array().suspension().is_none() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        if let Some(s) = self.array().suspension() {
            return fail(format!(
                "the array stays suspended after the host recovered: {s:?}"
            ));
        }
        if self.fs().is_read_only() {
            return fail("the filesystem turned read-only during a host fault and stays so");
        }
        // Writes kept for later must go out now; what was uncertain is read back.
        match self.fs().sync_all() {
            Ok(()) => self.after_sync(),
            Err(e) => fail(format!("sync after the host recovered: {e}")),
        }
    }

    fn may_power_cut(&self) -> bool {
        if self.host_faulty() {
            // A power cut during a host fault: allowed, the images are what the host kept.
            return self.array().failed_slots().is_empty() && self.out.is_empty();
        }
        let degraded = self.array().status().degraded || !self.out.is_empty();
        // A dirty degraded RAID5 without the log has the write hole: md and
        // raidfs refuse to assemble it without --force, and it may lose data.
        // RAID6 missing one member too: md refuses it ("cannot start dirty
        // degraded array"), and so does raidfs.
        !degraded || self.cfg.ppl || matches!(self.array().level(), Level::Raid1 | Level::Raid10)
    }

    /// Cut the power: every member keeps its synced data and a random part
    /// of the rest, torn at sectors; then assemble, fsck and check.
    fn power_cut(&mut self, seed: u64) -> Check {
        self.note(format!("  power cut ({seed})"));
        for m in &self.members {
            m.hold_writes();
        }
        let mut images = Vec::new();
        for (i, m) in self.members.iter().enumerate() {
            let image = m
                .crash_image_random(seed.wrapping_mul(31).wrapping_add(i as u64))
                .map_err(|e| Failure(format!("crash image: {e}")))?;
            images.push(FaultyMember::new(image));
        }
        for m in &self.members {
            m.release_writes();
        }
        if let Some(volume) = self.volume.take() {
            // The old daemon is gone: nothing of it reaches the new images.
            for m in &self.members {
                m.pull();
            }
            let array = Arc::clone(volume.array());
            volume.abandon();
            array.stop_background();
        }
        self.members = images;
        self.host_fault = None;
        // Pulled members came back with the power; failed ones stay out.
        let pulled: Vec<String> = self.out.clone();
        self.reopen_after_crash()?;
        for name in pulled {
            self.note(format!("  {name} is still out"));
        }
        Ok(())
    }

    fn reopen_after_crash(&mut self) -> Check {
        self.fsck_offline()?;
        self.open(false)?;
        self.check_after_crash()?;
        self.settle()?;
        self.check_redundancy()
    }

    /// fsck of the members as they are, through a read-only assembly.
    fn fsck_offline(&mut self) -> Check {
        self.tally.checks += 1;
        let opts = AssembleOptions {
            read_only: true,
            ..AssembleOptions::default()
        };
        let array = assemble(self.array_members(), opts)
            .map_err(|e| Failure(format!("read-only assemble for fsck: {e}")))?
            .array;
        let store = Arc::new(ArrayStore::new(Arc::new(array)));
        let report = fsck(store, false).map_err(|e| Failure(format!("fsck cannot load: {e}")))?;
        if !report.is_clean() {
            return fail(format!("fsck: {:?}", report.problems));
        }
        Ok(())
    }

    /// After a power cut: what the last fsync or sync covered is there byte
    /// for byte, no name is there that never existed since, every file
    /// reads whole; then the model becomes what survived.
    fn check_after_crash(&mut self) -> Check {
        self.tally.checks += 1;
        let fs = self.fs();
        let found = self.scan(&fs)?;
        if let Some(durable) = &self.know.durable {
            for (key, id) in &durable.names {
                let Some((_, node)) = found.names.get(key).map(|fid| (fid, &found.nodes[fid]))
                else {
                    return fail(format!(
                        "{key:?} was synced and is gone after the power cut"
                    ));
                };
                let want = &durable.nodes[id];
                if node.data != want.data {
                    return fail(format!(
                        "{key:?} after the power cut: {} bytes, the synced model {} (first difference at {:?})",
                        node.data.len(),
                        want.data.len(),
                        first_difference(&node.data, &want.data)
                    ));
                }
                if node.xattrs != want.xattrs {
                    return fail(format!(
                        "{key:?} xattrs after the power cut: {:?} against {:?}",
                        node.xattrs.keys(),
                        want.xattrs.keys()
                    ));
                }
            }
            // Links of one synced node stay links of one node.
            for (a, ida) in &durable.names {
                for (b, idb) in &durable.names {
                    if ida == idb && found.names.get(a) != found.names.get(b) {
                        return fail(format!("{a:?} and {b:?} were links of one file and are not after the power cut"));
                    }
                }
            }
        }
        for key in found.names.keys() {
            if !self.know.may_exist(key) {
                return fail(format!(
                    "{key:?} exists after the power cut but never existed since the last sync"
                ));
            }
        }
        self.adopt_found(found);
        Ok(())
    }

    /// Make what the filesystem holds the model (and durable: it is what a
    /// power cut left, and a remount commits it).
    fn adopt_found(&mut self, found: Found) {
        self.inos = found.inos;
        self.know = Knowledge::default();
        self.know.now = found.model;
        self.know.synced();
        let _ = found.nodes;
    }

    /// Everything in the filesystem, read whole.
    fn scan(&self, fs: &raidfs::fs::FileSystem) -> Check<Found> {
        let mut model = Model::default();
        let mut inos = BTreeMap::new();
        let mut by_ino: BTreeMap<u64, NodeId> = BTreeMap::new();
        let mut names = BTreeMap::new();
        for (d, &dir) in self.dir_inos.iter().enumerate() {
            let mut cookie = 0;
            loop {
                let entries = fs
                    .readdir(dir, cookie, 64)
                    .map_err(|e| Failure(format!("readdir of {}: {e}", DIRS[d])))?;
                if entries.is_empty() {
                    break;
                }
                for e in entries {
                    cookie = e.cookie;
                    let name = String::from_utf8_lossy(&e.name).into_owned();
                    if name == "." || name == ".." || e.kind == FileKind::Dir {
                        continue;
                    }
                    let key: Name = (d as u8, name.clone());
                    let id = match by_ino.get(&e.ino) {
                        Some(&id) => id,
                        None => {
                            let id = model.new_node();
                            by_ino.insert(e.ino, id);
                            inos.insert(id, e.ino);
                            let attr = fs
                                .getattr(e.ino)
                                .map_err(|err| Failure(format!("getattr of {key:?}: {err}")))?;
                            let data = fs.read(e.ino, 0, attr.size as usize).map_err(|err| {
                                Failure(format!("{key:?} does not read back: {err}"))
                            })?;
                            if data.len() as u64 != attr.size {
                                return fail(format!(
                                    "{key:?} reads {} bytes of {}",
                                    data.len(),
                                    attr.size
                                ));
                            }
                            let node = model.nodes.get_mut(&id).expect("new node");
                            node.data = data;
                            node.xattrs = read_xattrs(fs, e.ino)?;
                            id
                        }
                    };
                    model.names.insert(key.clone(), id);
                    names.insert(key, id);
                }
            }
        }
        let nodes = model.nodes.clone();
        Ok(Found {
            model,
            inos,
            names,
            nodes,
        })
    }

    /// Close cleanly and open again: everything answered is there exactly.
    pub fn remount(&mut self) -> Check {
        self.settle()?;
        if let Some(volume) = self.volume.take() {
            volume.close().map_err(|e| Failure(format!("close: {e}")))?;
        }
        self.note("  remount".into());
        self.fsck_offline()?;
        self.open(false)?;
        self.check_exact()?;
        self.settle()?;
        self.check_redundancy()
    }

    /// The filesystem holds exactly the model.
    pub fn check_exact(&mut self) -> Check {
        self.tally.checks += 1;
        if !self.know.is_certain() {
            self.adopt_uncertain()?;
        }
        let fs = self.fs();
        let found = self.scan(&fs)?;
        let now = &self.know.now;
        let found_keys: Vec<&Name> = found.names.keys().collect();
        let model_keys: Vec<&Name> = now.names.keys().collect();
        if found_keys != model_keys {
            return fail(format!(
                "names: the filesystem has {found_keys:?}, the model {model_keys:?}"
            ));
        }
        for (key, id) in &now.names {
            let node = &found.nodes[&found.names[key]];
            let want = &now.nodes[id];
            if node.data != want.data {
                return fail(format!(
                    "{key:?}: {} bytes, the model {} (first difference at {:?})",
                    node.data.len(),
                    want.data.len(),
                    first_difference(&node.data, &want.data)
                ));
            }
            if node.xattrs != want.xattrs {
                return fail(format!("{key:?} xattrs differ"));
            }
        }
        self.inos = found.inos;
        // Node ids of the scan replace the model's; keep the model's
        // contents under them.
        let mut model = found.model;
        for (key, id) in &now.names {
            let fid = found.names[key];
            model.nodes.insert(fid, now.nodes[id].clone());
        }
        let durable_same = self.know.durable.is_some();
        self.know.now = model;
        if durable_same {
            self.know.synced();
        }
        Ok(())
    }

    /// A check of the whole array: parity and mirrors agree. Rotted bytes
    /// are repaired first (a check would count them).
    fn check_redundancy(&mut self) -> Check {
        self.tally.checks += 1;
        if !self.array().failed_slots().is_empty() || !self.out.is_empty() {
            return Ok(());
        }
        if !self.rotted.is_empty() {
            self.scrub(true)?;
        }
        self.scrub(false)
    }

    fn scrub(&mut self, repair: bool) -> Check {
        self.array()
            .start_check(repair)
            .map_err(|e| Failure(format!("start scrub: {e}")))?;
        self.settle()?;
        let result = self.array().last_sync_result();
        let Some(r) = result else {
            return fail("a scrub left no result");
        };
        if !matches!(r.action, SyncAction::Check | SyncAction::Repair) || !r.completed {
            return fail(format!("scrub did not complete: {r:?}"));
        }
        self.note(format!("  {} found {} mismatches", r.action, r.mismatches));
        if repair {
            self.rotted.clear();
            // The repair judged by checksums: every file reads back as the model says.
            return self.check_exact();
        }
        if r.mismatches > 0 && self.rotted.is_empty() {
            return fail(format!(
                "a check found {} mismatched bytes with no rot outstanding",
                r.mismatches
            ));
        }
        Ok(())
    }

    /// The end of a run: heal the host, bring members back, settle, sync,
    /// remount and check everything.
    pub fn finish(&mut self) -> Check {
        self.tick(usize::MAX)?;
        while !self.out.is_empty() {
            let before = self.out.len();
            self.settle()?;
            self.fault(&Fault::Return { fresh: false }, usize::MAX)?;
            if self.out.len() == before {
                return fail("a member taken out cannot come back");
            }
        }
        self.settle()?;
        let fs = self.fs();
        fs.sync_all()
            .map_err(|e| Failure(format!("final sync: {e}")))?;
        self.after_sync()?;
        self.remount()?;
        if let Some(volume) = self.volume.take() {
            volume
                .close()
                .map_err(|e| Failure(format!("final close: {e}")))?;
        }
        Ok(())
    }

    /// Drop the world without closing (after a failure): leave the threads.
    pub fn abandon(mut self) {
        if let Some(v) = self.volume.take() {
            v.abandon();
        }
    }

    pub fn run(&mut self, actions: &[(usize, Action)]) -> Check {
        for (index, action) in actions {
            self.heartbeat
                .fetch_add(1, std::sync::atomic::Ordering::Release);
            self.tick(*index)?;
            self.note(format!("#{index} {action:?}"));
            match action {
                Action::Op(op) => self.op(op)?,
                Action::Fault(f) => self.fault(f, *index)?,
            }
        }
        self.finish()
    }
}

struct Found {
    model: Model,
    inos: BTreeMap<NodeId, u64>,
    names: BTreeMap<Name, NodeId>,
    nodes: BTreeMap<NodeId, super::model::Node>,
}

fn read_xattrs(fs: &raidfs::fs::FileSystem, ino: u64) -> Check<BTreeMap<String, Vec<u8>>> {
    let list = fs
        .listxattr(&root(), ino)
        .map_err(|e| Failure(format!("listxattr {ino}: {e}")))?;
    let mut out = BTreeMap::new();
    for name in list.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let name = String::from_utf8_lossy(name).into_owned();
        if !name.starts_with("user.") {
            continue;
        }
        let value = fs
            .getxattr(&root(), ino, n(&name))
            .map_err(|e| Failure(format!("getxattr {name} of {ino}: {e}")))?;
        out.insert(name, value);
    }
    Ok(out)
}

fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .or_else(|| (a.len() != b.len()).then_some(a.len().min(b.len())))
}
