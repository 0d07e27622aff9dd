//! Reference-model test: random operations go to the filesystem and to a
//! tiny in-memory model of POSIX; every result code and, after every step,
//! the whole visible tree (names, kinds, sizes, link counts, contents,
//! xattrs, hard-link identity) must agree. Unmount + open at random points.
//! Renames may leave a whiteout (RENAME_WHITEOUT), which later operations
//! then meet like any other name; O_TMPFILE files are written, then named
//! (linkat) or released unnamed.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::Arc;

use proptest::prelude::*;
use raidfs::fs::teststore::MemStore;
use raidfs::fs::*;

const PARENTS: [&str; 4] = ["", "d", "d/e", "e"];
const NAMES: [&str; 4] = ["a", "b", "d", "e"];
const XNAMES: [&str; 2] = ["user.one", "trusted.two"];

#[derive(Clone, Debug)]
enum Op {
    Create(usize, usize),
    Mkdir(usize, usize),
    Write(usize, usize, u16, u16, u8),
    Truncate(usize, usize, u16),
    /// fallocate: offset, length, punch a hole (else reserve), keep the size.
    Fallocate(usize, usize, u16, u16, bool, bool),
    Unlink(usize, usize),
    Rmdir(usize, usize),
    Link(usize, usize, usize, usize),
    /// Flags: 0 none, 1 NOREPLACE, 2 EXCHANGE, 3 WHITEOUT.
    Rename(usize, usize, usize, usize, u8),
    SetXattr(usize, usize, usize, u8, i32),
    RemoveXattr(usize, usize, usize),
    /// An O_TMPFILE file in a directory, written with a length and byte,
    /// then named (linkat) there, or released without a name.
    Tmpfile(usize, usize, u16, u8, bool),
    Reopen,
}

fn op() -> impl Strategy<Value = Op> {
    let p = 0..PARENTS.len();
    let nm = 0..NAMES.len();
    prop_oneof![
        3 => (p.clone(), nm.clone()).prop_map(|(p, n)| Op::Create(p, n)),
        2 => (p.clone(), nm.clone()).prop_map(|(p, n)| Op::Mkdir(p, n)),
        4 => (p.clone(), nm.clone(), 0..12_000u16, 1..6_000u16, any::<u8>()).prop_map(|(p, n, o, l, b)| Op::Write(p, n, o, l, b)),
        1 => (p.clone(), nm.clone(), 0..14_000u16).prop_map(|(p, n, s)| Op::Truncate(p, n, s)),
        2 => (p.clone(), nm.clone(), 0..12_000u16, 1..9_000u16, any::<bool>(), any::<bool>()).prop_map(|(p, n, o, l, punch, keep)| Op::Fallocate(p, n, o, l, punch, keep)),
        2 => (p.clone(), nm.clone()).prop_map(|(p, n)| Op::Unlink(p, n)),
        1 => (p.clone(), nm.clone()).prop_map(|(p, n)| Op::Rmdir(p, n)),
        1 => (p.clone(), nm.clone(), p.clone(), nm.clone()).prop_map(|(a, b, c, d)| Op::Link(a, b, c, d)),
        3 => (p.clone(), nm.clone(), p.clone(), nm.clone(), 0..4u8).prop_map(|(a, b, c, d, f)| Op::Rename(a, b, c, d, f)),
        1 => (p.clone(), nm.clone(), 0..2usize, any::<u8>(), 0..3i32).prop_map(|(a, b, x, v, f)| Op::SetXattr(a, b, x, v, f)),
        1 => (p.clone(), nm.clone(), 0..2usize).prop_map(|(a, b, x)| Op::RemoveXattr(a, b, x)),
        1 => (p.clone(), nm.clone(), 0..9_000u16, any::<u8>(), any::<bool>()).prop_map(|(p, n, l, b, link)| Op::Tmpfile(p, n, l, b, link)),
        1 => Just(Op::Reopen),
    ]
}

#[derive(Clone, Debug)]
enum Kind {
    File(Vec<u8>),
    Dir(BTreeMap<String, usize>),
    /// A character device 0:0 left by RENAME_WHITEOUT: no data to write.
    Whiteout,
}

#[derive(Clone, Debug)]
struct Node {
    kind: Kind,
    nlink: u32,
    parent: usize,
    xattrs: BTreeMap<String, Vec<u8>>,
}

struct Model {
    nodes: HashMap<usize, Node>,
    next: usize,
}

type Res<T> = Result<T, i32>;

impl Model {
    fn new() -> Model {
        let root = Node {
            kind: Kind::Dir(BTreeMap::new()),
            nlink: 2,
            parent: 1,
            xattrs: BTreeMap::new(),
        };
        Model {
            nodes: HashMap::from([(1, root)]),
            next: 2,
        }
    }

    fn entries(&self, dir: usize) -> &BTreeMap<String, usize> {
        match &self.nodes[&dir].kind {
            Kind::Dir(e) => e,
            Kind::File(_) | Kind::Whiteout => unreachable!("not a directory"),
        }
    }

    fn entries_mut(&mut self, dir: usize) -> &mut BTreeMap<String, usize> {
        match &mut self.nodes.get_mut(&dir).expect("dir").kind {
            Kind::Dir(e) => e,
            Kind::File(_) | Kind::Whiteout => unreachable!("not a directory"),
        }
    }

    fn is_dir(&self, id: usize) -> bool {
        matches!(self.nodes[&id].kind, Kind::Dir(_))
    }

    fn resolve(&self, path: &str) -> Res<usize> {
        let mut cur = 1;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            if !self.is_dir(cur) {
                return Err(libc::ENOTDIR);
            }
            cur = *self.entries(cur).get(comp).ok_or(libc::ENOENT)?;
        }
        if self.is_dir(cur) {
            Ok(cur)
        } else {
            Err(libc::ENOTDIR)
        }
    }

    fn child(&self, dir: usize, name: &str) -> Option<usize> {
        self.entries(dir).get(name).copied()
    }

    fn add(&mut self, dir: usize, name: &str, kind: Kind) -> Res<()> {
        if self.child(dir, name).is_some() {
            return Err(libc::EEXIST);
        }
        let id = self.next;
        self.next += 1;
        let is_dir = matches!(kind, Kind::Dir(_));
        self.nodes.insert(
            id,
            Node {
                kind,
                nlink: if is_dir { 2 } else { 1 },
                parent: dir,
                xattrs: BTreeMap::new(),
            },
        );
        if is_dir {
            self.nodes.get_mut(&dir).expect("dir").nlink += 1;
        }
        self.entries_mut(dir).insert(name.to_string(), id);
        Ok(())
    }

    fn drop_name(&mut self, dir: usize, name: &str) {
        let id = self.entries_mut(dir).remove(name).expect("entry");
        let is_dir = self.is_dir(id);
        let node = self.nodes.get_mut(&id).expect("node");
        node.nlink = if is_dir { 0 } else { node.nlink - 1 };
        if node.nlink == 0 {
            self.nodes.remove(&id);
        }
        if is_dir {
            self.nodes.get_mut(&dir).expect("dir").nlink -= 1;
        }
    }

    fn is_ancestor(&self, anc: usize, mut d: usize) -> bool {
        loop {
            if d == anc {
                return true;
            }
            if d == 1 {
                return false;
            }
            d = self.nodes[&d].parent;
        }
    }

    fn rename(&mut self, p: usize, name: &str, q: usize, new: &str, flags: u8) -> Res<()> {
        let src = self.child(p, name).ok_or(libc::ENOENT)?;
        let dst = self.child(q, new);
        if flags == 2 {
            let dst = dst.ok_or(libc::ENOENT)?;
            if dst == src {
                return Ok(());
            }
            if (self.is_dir(src) && self.is_ancestor(src, q))
                || (self.is_dir(dst) && self.is_ancestor(dst, p))
            {
                return Err(libc::EINVAL);
            }
            self.entries_mut(p).insert(name.into(), dst);
            self.entries_mut(q).insert(new.into(), src);
            let (sd, dd) = (self.is_dir(src), self.is_dir(dst));
            if sd {
                self.nodes.get_mut(&src).expect("n").parent = q;
                self.nodes.get_mut(&q).expect("n").nlink += 1;
                self.nodes.get_mut(&p).expect("n").nlink -= 1;
            }
            if dd {
                self.nodes.get_mut(&dst).expect("n").parent = p;
                self.nodes.get_mut(&p).expect("n").nlink += 1;
                self.nodes.get_mut(&q).expect("n").nlink -= 1;
            }
            return Ok(());
        }
        let src_dir = self.is_dir(src);
        if src_dir && self.is_ancestor(src, q) {
            return Err(libc::EINVAL);
        }
        if let Some(d) = dst {
            if flags == 1 {
                return Err(libc::EEXIST);
            }
            if d == src {
                return Ok(());
            }
            match (src_dir, self.is_dir(d)) {
                (true, false) => return Err(libc::ENOTDIR),
                (true, true) if !self.entries(d).is_empty() => return Err(libc::ENOTEMPTY),
                (false, true) => return Err(libc::EISDIR),
                _ => {}
            }
            self.drop_name(q, new);
        }
        self.entries_mut(p).remove(name);
        self.entries_mut(q).insert(new.into(), src);
        if src_dir {
            self.nodes.get_mut(&src).expect("n").parent = q;
            self.nodes.get_mut(&p).expect("n").nlink -= 1;
            self.nodes.get_mut(&q).expect("n").nlink += 1;
        }
        if flags == 3 {
            self.add(p, name, Kind::Whiteout)?;
        }
        Ok(())
    }
}

struct Harness {
    store: Arc<MemStore>,
    fs: FileSystem,
    model: Model,
}

fn os(s: &str) -> &OsStr {
    OsStr::new(s)
}

fn code<T>(r: FsResult<T>) -> Res<T> {
    r.map_err(|e| raidfs::fuse::errno_of(&e).code())
}

impl Harness {
    fn resolve(&self, path: &str) -> Res<u64> {
        let c = Caller::root();
        let mut cur = ROOT_INO;
        for comp in path.split('/').filter(|c| !c.is_empty()) {
            let a = code(self.fs.lookup(&c, cur, os(comp)))?;
            cur = a.ino;
        }
        if code(self.fs.getattr(cur))?.kind == FileKind::Dir {
            Ok(cur)
        } else {
            Err(libc::ENOTDIR)
        }
    }

    /// Resolve a parent on both sides; they must agree. None = skip the op.
    fn parent(&self, p: usize) -> Option<(usize, u64)> {
        let m = self.model.resolve(PARENTS[p]);
        let f = self.resolve(PARENTS[p]);
        assert_eq!(
            m.is_ok(),
            f.is_ok(),
            "resolving {:?}: model {m:?} fs {f:?}",
            PARENTS[p]
        );
        Some((m.ok()?, f.ok()?))
    }

    fn apply(&mut self, op: &Op) {
        let c = Caller::root();
        match *op {
            Op::Create(p, n) | Op::Mkdir(p, n) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let is_dir = matches!(op, Op::Mkdir(..));
                let want = self.model.add(
                    mp,
                    NAMES[n],
                    if is_dir {
                        Kind::Dir(BTreeMap::new())
                    } else {
                        Kind::File(Vec::new())
                    },
                );
                let got = if is_dir {
                    self.fs.mkdir(&c, fp, os(NAMES[n]), 0o755, 0)
                } else {
                    self.fs.mknod(&c, fp, os(NAMES[n]), 0o100644, 0, 0)
                };
                assert_eq!(code(got).map(|_| ()), want, "{op:?}");
            }
            Op::Write(p, n, off, len, byte) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let got = code(self.fs.write(ino, off as u64, &vec![byte; len as usize]));
                match &mut self.model.nodes.get_mut(&id).expect("node").kind {
                    Kind::Dir(_) => assert_eq!(got, Err(libc::EISDIR)),
                    Kind::Whiteout => assert_eq!(got, Err(libc::EINVAL), "{op:?}"),
                    Kind::File(data) => {
                        assert_eq!(got, Ok(len as usize));
                        let end = off as usize + len as usize;
                        if data.len() < end {
                            data.resize(end, 0);
                        }
                        data[off as usize..end].fill(byte);
                    }
                }
            }
            Op::Truncate(p, n, size) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let got = code(self.fs.setattr(
                    &c,
                    ino,
                    &SetAttr {
                        size: Some(size as u64),
                        ..Default::default()
                    },
                ));
                match &mut self.model.nodes.get_mut(&id).expect("node").kind {
                    Kind::Dir(_) => assert_eq!(got.map(|_| ()), Err(libc::EISDIR)),
                    Kind::Whiteout => assert_eq!(got.map(|_| ()), Err(libc::EINVAL), "{op:?}"),
                    Kind::File(data) => {
                        assert!(got.is_ok());
                        data.resize(size as usize, 0);
                    }
                }
            }
            Op::Fallocate(p, n, off, len, punch, keep_size) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let mode = FallocateMode {
                    keep_size: keep_size || punch,
                    punch_hole: punch,
                };
                let got = code(self.fs.fallocate(ino, off as u64, len as u64, mode));
                match &mut self.model.nodes.get_mut(&id).expect("node").kind {
                    Kind::Dir(_) => assert_eq!(got, Err(libc::EISDIR), "{op:?}"),
                    Kind::Whiteout => assert_eq!(got, Err(libc::EINVAL), "{op:?}"),
                    Kind::File(data) => {
                        assert_eq!(got, Ok(()), "{op:?}");
                        let end = off as usize + len as usize;
                        if punch {
                            let stop = end.min(data.len());
                            if (off as usize) < stop {
                                data[off as usize..stop].fill(0);
                            }
                        } else if !keep_size && data.len() < end {
                            data.resize(end, 0);
                        }
                    }
                }
            }
            Op::Unlink(p, n) | Op::Rmdir(p, n) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let rmdir = matches!(op, Op::Rmdir(..));
                let want = match self.model.child(mp, NAMES[n]) {
                    None => Err(libc::ENOENT),
                    Some(id) => match (rmdir, self.model.is_dir(id)) {
                        (false, true) => Err(libc::EISDIR),
                        (true, false) => Err(libc::ENOTDIR),
                        (true, true) if !self.model.entries(id).is_empty() => Err(libc::ENOTEMPTY),
                        _ => {
                            self.model.drop_name(mp, NAMES[n]);
                            Ok(())
                        }
                    },
                };
                let got = if rmdir {
                    self.fs.rmdir(&c, fp, os(NAMES[n]))
                } else {
                    self.fs.unlink(&c, fp, os(NAMES[n]))
                };
                assert_eq!(code(got), want, "{op:?}");
            }
            Op::Link(p, n, q, m) => {
                let (Some((mp, fp)), Some((mq, fq))) = (self.parent(p), self.parent(q)) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let want = if self.model.is_dir(id) {
                    Err(libc::EPERM)
                } else if self.model.child(mq, NAMES[m]).is_some() {
                    Err(libc::EEXIST)
                } else {
                    self.model.entries_mut(mq).insert(NAMES[m].into(), id);
                    self.model.nodes.get_mut(&id).expect("node").nlink += 1;
                    Ok(())
                };
                assert_eq!(
                    code(self.fs.link(&c, ino, fq, os(NAMES[m]))).map(|_| ()),
                    want,
                    "{op:?}"
                );
            }
            Op::Rename(p, n, q, m, flags) => {
                let (Some((mp, fp)), Some((mq, fq))) = (self.parent(p), self.parent(q)) else {
                    return;
                };
                let want = self.model.rename(mp, NAMES[n], mq, NAMES[m], flags);
                let f = RenameFlags {
                    noreplace: flags == 1,
                    exchange: flags == 2,
                    whiteout: flags == 3,
                };
                assert_eq!(
                    code(self.fs.rename(&c, fp, os(NAMES[n]), fq, os(NAMES[m]), f)),
                    want,
                    "{op:?}"
                );
            }
            Op::SetXattr(p, n, x, v, flags) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let node = self.model.nodes.get_mut(&id).expect("node");
                // As on any device node, user.* attributes are refused.
                let refused = matches!(node.kind, Kind::Whiteout) && XNAMES[x].starts_with("user.");
                let xattrs = &mut node.xattrs;
                let exists = xattrs.contains_key(XNAMES[x]);
                let want = if refused {
                    Err(libc::EPERM)
                } else if flags == XATTR_CREATE && exists {
                    Err(libc::EEXIST)
                } else if flags == XATTR_REPLACE && !exists {
                    Err(libc::ENODATA)
                } else {
                    xattrs.insert(XNAMES[x].into(), vec![v; 3]);
                    Ok(())
                };
                assert_eq!(
                    code(self.fs.setxattr(&c, ino, os(XNAMES[x]), &[v; 3], flags)),
                    want,
                    "{op:?}"
                );
            }
            Op::RemoveXattr(p, n, x) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let Some(id) = self.model.child(mp, NAMES[n]) else {
                    return;
                };
                let ino = self.fs.lookup(&c, fp, os(NAMES[n])).expect("lookup").ino;
                let node = self.model.nodes.get_mut(&id).expect("node");
                let want = if matches!(node.kind, Kind::Whiteout) && XNAMES[x].starts_with("user.")
                {
                    Err(libc::EPERM)
                } else {
                    node.xattrs
                        .remove(XNAMES[x])
                        .map(|_| ())
                        .ok_or(libc::ENODATA)
                };
                assert_eq!(
                    code(self.fs.removexattr(&c, ino, os(XNAMES[x]))),
                    want,
                    "{op:?}"
                );
            }
            Op::Tmpfile(p, n, len, byte, link) => {
                let Some((mp, fp)) = self.parent(p) else {
                    return;
                };
                let data = vec![byte; len as usize];
                let t = self.fs.tmpfile(&c, fp, 0o100644, 0, true).expect("tmpfile");
                assert_eq!(code(self.fs.write(t.ino, 0, &data)), Ok(data.len()));
                let named = link && {
                    let want = self.model.add(mp, NAMES[n], Kind::File(data));
                    let got = self.fs.link(&c, t.ino, fp, os(NAMES[n]));
                    assert_eq!(code(got).map(|_| ()), want, "{op:?}");
                    want.is_ok()
                };
                self.fs.release(t.ino).expect("release");
                assert_eq!(
                    self.fs.getattr(t.ino).is_ok(),
                    named,
                    "{op:?}: a tmpfile outlives its release only with a name"
                );
            }
            Op::Reopen => {
                self.fs.unmount().expect("unmount");
                self.fs = FileSystem::open(self.store.clone(), FsOptions::default()).expect("open");
            }
        }
    }

    /// Walk both trees and compare everything visible.
    fn compare(&self) {
        let mut ids: HashMap<usize, u64> = HashMap::new();
        self.compare_dir(1, ROOT_INO, &mut ids, "/");
        let inos: std::collections::HashSet<u64> = ids.values().copied().collect();
        assert_eq!(
            inos.len(),
            ids.len(),
            "distinct model inodes map to distinct inode numbers"
        );
    }

    fn compare_dir(&self, id: usize, ino: u64, ids: &mut HashMap<usize, u64>, path: &str) {
        let c = Caller::root();
        let listing = self.fs.readdir(ino, 0, usize::MAX).expect("readdir");
        assert_eq!(&listing[0].name, b".");
        assert_eq!(
            listing[1].ino,
            self.fs.lookup(&c, ino, os("..")).expect("..").ino
        );
        let got: BTreeMap<String, u64> = listing[2..]
            .iter()
            .map(|e| (String::from_utf8(e.name.clone()).expect("utf8"), e.ino))
            .collect();
        let want = self.model.entries(id);
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>(),
            "listing of {path}"
        );
        for (name, child) in want {
            let fino = got[name];
            if let Some(prev) = ids.insert(*child, fino) {
                assert_eq!(prev, fino, "hard links of {path}{name} share an inode");
            }
            let node = &self.model.nodes[child];
            let attr = self.fs.getattr(fino).expect("getattr");
            assert_eq!(attr.nlink, node.nlink, "nlink of {path}{name}");
            let xattrs: Vec<u8> = node
                .xattrs
                .keys()
                .flat_map(|k| k.bytes().chain([0]))
                .collect();
            assert_eq!(
                self.fs.listxattr(&c, fino).expect("listxattr"),
                xattrs,
                "xattrs of {path}{name}"
            );
            for (k, v) in &node.xattrs {
                assert_eq!(&self.fs.getxattr(&c, fino, os(k)).expect("getxattr"), v);
            }
            match &node.kind {
                Kind::File(data) => {
                    assert_eq!(attr.kind, FileKind::File);
                    assert_eq!(attr.size, data.len() as u64, "size of {path}{name}");
                    assert!(
                        self.fs.read(fino, 0, data.len() + 10).expect("read") == *data,
                        "contents of {path}{name}"
                    );
                }
                Kind::Dir(_) => {
                    assert_eq!(attr.kind, FileKind::Dir);
                    self.compare_dir(*child, fino, ids, &format!("{path}{name}/"));
                }
                Kind::Whiteout => {
                    assert_eq!(
                        (attr.kind, attr.rdev, attr.perm),
                        (FileKind::CharDev, 0, 0),
                        "whiteout {path}{name}"
                    );
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, max_shrink_iters: 2000, ..ProptestConfig::default() })]
    #[test]
    fn filesystem_matches_model(ops in prop::collection::vec(op(), 1..60)) {
        let store = Arc::new(MemStore::new(4, 4 << 20, 65536));
        FileSystem::format(store.clone()).expect("format");
        let fs = FileSystem::open(store.clone(), FsOptions::default()).expect("open");
        let mut h = Harness { store: store.clone(), fs, model: Model::new() };
        for op in &ops {
            h.apply(op);
            h.compare();
        }
        h.fs.unmount().expect("unmount");
        let report = fsck(store.clone(), false).expect("fsck");
        prop_assert!(report.is_clean(), "{:?}", report.problems);
        h.fs = FileSystem::open(store, FsOptions::default()).expect("reopen");
        h.compare();
    }
}
