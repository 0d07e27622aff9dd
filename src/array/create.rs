//! Creating an array: validate every member first (so bad input modifies
//! nothing), then write fresh superblocks; a failure after writing began
//! takes back what it did (image files it made, blank members it wrote).

use super::host_space::{shortfalls, Image};
use super::personality::Personality;
use super::state::now_secs;
use super::{Array, ArrayError, ArrayResult, Slot};
use crate::geometry::{Geometry, Layout, Level};
use crate::member::file::{FileMember, OpenOptions};
use crate::member::Member;
use crate::parity::Parity;
use crate::superblock::{
    end_offsets, member_end, ArrayState, GroupProfile, SlotState, Superblock, SuperblockError,
    DEFAULT_DATA_OFFSET, FORMAT_VERSION, MAX_GROUPS, MAX_MEMBERS, SUPERBLOCK_SIZE, TAIL_RESERVE,
};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use uuid::Uuid;

/// What to create.
#[derive(Clone, Debug)]
pub struct CreateSpec {
    pub level: Level,
    pub layout: Layout,
    /// Chunk size in bytes.
    pub chunk: u64,
    /// RAID10 copies (RAID1 always uses one copy per member).
    pub copies: usize,
    pub name: String,
    /// Close the RAID5 write hole with a partial parity log (md's
    /// `--consistency-policy=ppl`); otherwise the bitmap drives resync.
    pub ppl: bool,
}

impl CreateSpec {
    pub fn new(level: Level) -> CreateSpec {
        CreateSpec {
            level,
            layout: Layout::LeftSymmetric,
            chunk: 64 * 1024,
            copies: 2,
            name: String::new(),
            ppl: false,
        }
    }

    /// Fewest members `create` accepts for the level: what gives the level
    /// its meaning (md needs --force below these too).
    pub fn min_members(&self) -> usize {
        Personality::of(self.level).min_members(self.copies)
    }

    fn geometry(&self, members: usize) -> ArrayResult<Geometry> {
        if self.ppl && !Personality::of(self.level).keeps_partial_parity_log() {
            return Err(ArrayError::Refused(
                "the partial parity log (ppl) is for RAID5 only".into(),
            ));
        }
        if members < self.min_members() {
            return Err(ArrayError::Refused(format!(
                "too few members: {} needs at least {}, got {members}",
                self.level,
                self.min_members()
            )));
        }
        // The geometry sets the copies the level implies (RAID1: every
        // member; RAID0/5/6: one) and checks RAID10's.
        Ok(Geometry::new(
            self.level,
            members,
            self.chunk,
            self.copies,
            self.layout,
        )?)
    }
}

const MIB: u64 = 1 << 20;

/// Bytes of each member one allocation group takes: about 1/64 of the data
/// area, between 8 MiB and 1 GiB, a whole number of chunks, and never so small
/// that the table overflows.
fn choose_group_size(data_area: u64, chunk: u64) -> u64 {
    let unit = chunk.max(MIB);
    let round_up = |v: u64| v.div_ceil(unit) * unit;
    let target = (data_area / 64).clamp(8 * MIB, 1024 * MIB);
    let at_least_for_table = data_area.div_ceil(MAX_GROUPS as u64);
    round_up(target.max(at_least_for_table))
}

/// Group size and count for members the smallest of which has `smallest`
/// bytes; too small for two groups is refused.
fn data_groups(smallest: u64, chunk: u64) -> ArrayResult<(u64, usize)> {
    // The data area stops TAIL_RESERVE before the end, which holds the end
    // superblock copies.
    let data_area = member_end(smallest).saturating_sub(DEFAULT_DATA_OFFSET + TAIL_RESERVE);
    let group_size = choose_group_size(data_area, chunk);
    let groups = (data_area / group_size) as usize;
    if groups < 2 {
        return Err(ArrayError::Refused(format!(
            "members are too small: each needs at least {} MiB (the smallest has {} MiB)",
            (DEFAULT_DATA_OFFSET + 2 * group_size + TAIL_RESERVE).div_ceil(MIB),
            smallest / MIB
        )));
    }
    Ok((group_size, groups))
}

/// Write a new array onto `members` (slot order). Nothing is validated here
/// beyond the geometry: callers check ownership first (see [`create_paths`]).
pub fn create(members: Vec<(Arc<dyn Member>, String)>, spec: &CreateSpec) -> ArrayResult<Array> {
    if members.len() > MAX_MEMBERS {
        return Err(ArrayError::Refused(format!(
            "too many members: {} (at most {MAX_MEMBERS})",
            members.len()
        )));
    }
    let geometry = spec.geometry(members.len())?;
    let smallest = members.iter().map(|(m, _)| m.len()).min().unwrap_or(0);
    let (group_size, groups) = data_groups(smallest, geometry.chunk)?;
    let now = now_secs();
    let mut name = spec.name.clone();
    while name.len() > 32 {
        name.pop();
    }
    let sb = Superblock {
        version: FORMAT_VERSION,
        array_uuid: Uuid::new_v4(),
        member_uuid: Uuid::nil(),
        name,
        slot: 0,
        level: geometry.level,
        layout: geometry.layout,
        chunk: geometry.chunk,
        members: members.len() as u32,
        copies: geometry.copies as u32,
        data_offset: DEFAULT_DATA_OFFSET,
        data_size: groups as u64 * group_size,
        group_size,
        events: 1,
        state: ArrayState::Clean,
        recovery_offset: u64::MAX,
        features: crate::superblock::Features {
            ro_compat: if spec.ppl { super::FEATURE_PPL } else { 0 },
            ..Default::default()
        },
        ctime: now,
        utime: now,
        slots: vec![SlotState::Active; members.len()],
        groups: vec![GroupProfile::Unallocated; groups],
        reshape: None,
        scrub: None,
    };
    let slots = members
        .into_iter()
        .map(|(member, name)| Slot::new(Some(member), name, Uuid::new_v4(), u64::MAX))
        .collect();
    let array = Array::from_parts(slots, sb, Parity::global())?;
    array.write_superblocks()?;
    array.write_bitmap();
    if let Some(ppl) = &array.ppl {
        let members: Vec<Arc<dyn Member>> = array
            .present_members()
            .into_iter()
            .map(|(_, m)| m)
            .collect();
        ppl.format(&members)
            .map_err(|e| ArrayError::Refused(format!("writing the partial parity log: {e}")))?;
    }
    if array.is_degraded() {
        return Err(ArrayError::Refused(
            "a member failed while the array was being created".into(),
        ));
    }
    Ok(array)
}

/// Why an existing path may not become a member without `--force`.
fn ownership_problem(path: &Path) -> Result<Option<String>, ArrayError> {
    let io_err = |source| ArrayError::MemberIo {
        path: path.display().to_string(),
        source,
    };
    let meta = std::fs::symlink_metadata(path).map_err(io_err)?;
    if meta.file_type().is_symlink() {
        return Err(ArrayError::Refused(format!(
            "{}: is a symbolic link; give the real path",
            path.display()
        )));
    }
    let mut file = std::fs::File::open(path).map_err(io_err)?;
    let len = file.seek(SeekFrom::End(0)).map_err(io_err)?;
    let name = path.display().to_string();
    classify(&name, "file", len, |buf, offset| {
        file.seek(SeekFrom::Start(offset))?;
        let mut got = 0;
        while got < buf.len() {
            match file.read(&mut buf[got..]) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(got)
    })
    .map_err(io_err)
}

/// [`ownership_problem`] for a member that is not a file (an NBD export).
fn member_problem(name: &str, member: &dyn Member) -> ArrayResult<Option<String>> {
    let len = member.len();
    classify(name, "export", len, |buf, offset| {
        let n = (buf.len() as u64).min(len.saturating_sub(offset)) as usize;
        member.read_at(&mut buf[..n], offset)?;
        Ok(n)
    })
    .map_err(|source| ArrayError::MemberIo {
        path: name.to_string(),
        source,
    })
}

/// What the superblock places of a device of `len` bytes say about it:
/// a member of some array (by its start or end copies), a damaged
/// superblock, data that is not a member (a non-empty `kind`), or nothing (None). `read`
/// fills a buffer at an offset and says how much it read.
fn classify(
    name: &str,
    kind: &str,
    len: u64,
    mut read: impl FnMut(&mut [u8], u64) -> std::io::Result<usize>,
) -> std::io::Result<Option<String>> {
    let mut head = vec![0u8; DEFAULT_DATA_OFFSET as usize];
    let got = read(&mut head, 0)?;
    head.truncate(got);
    match Superblock::decode(
        &head[..head.len().min(crate::superblock::SUPERBLOCK_SIZE)],
        name,
    ) {
        Ok(sb) => {
            return Ok(Some(format!(
                "{name} is a member of array {} (slot {})",
                sb.array_uuid, sb.slot
            )))
        }
        Err(SuperblockError::NotMember(_)) => {}
        Err(_) => return Ok(Some(format!("{name} holds a damaged raidfs superblock"))),
    }
    // A member whose start was overwritten is still one by its end copies.
    for offset in end_offsets(len).into_iter().flatten() {
        let mut block = vec![0u8; SUPERBLOCK_SIZE];
        if read(&mut block, offset)? != block.len() {
            return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof));
        }
        match Superblock::decode(&block, name) {
            Ok(sb) if sb.has_end_copies() => {
                return Ok(Some(format!(
                    "{name} is a member of array {} (slot {}) by its end superblock copies",
                    sb.array_uuid, sb.slot
                )))
            }
            Ok(_) | Err(SuperblockError::NotMember(_)) => {}
            Err(_) => {
                return Ok(Some(format!(
                    "{name} holds a damaged raidfs superblock at its end"
                )))
            }
        }
    }
    if head.iter().any(|&b| b != 0) {
        return Ok(Some(format!(
            "{name} is a non-empty {kind} that is not a raidfs member"
        )));
    }
    Ok(None)
}

/// How `raidfs create` treats its member paths.
#[derive(Clone, Copy, Debug, Default)]
pub struct PathOptions {
    /// Size of the image files that do not exist yet (made sparse).
    pub size: Option<u64>,
    /// Overwrite members of other arrays and non-empty files.
    pub force: bool,
    /// Reserve the image files' host space now (`fallocate`).
    pub preallocate: bool,
}

/// An array just created on paths. Until [`Created::keep`], a failure in
/// what follows (writing the filesystem) is undone with [`Created::abandon`].
pub struct Created {
    pub array: Arc<Array>,
    /// One line per host filesystem that cannot hold its sparse images at
    /// full size.
    pub warnings: Vec<String>,
    undo: Undo,
}

impl Created {
    /// The array is complete: keep everything.
    pub fn keep(mut self) -> Arc<Array> {
        self.undo.made.clear();
        self.undo.blank.clear();
        self.array
    }

    /// Take back what create did: remove the image files it made, and blank
    /// again the members that were empty before it.
    pub fn abandon(self) {
        // `undo` runs when `self` drops.
    }
}

/// What a failed create takes back when dropped.
#[derive(Default)]
struct Undo {
    /// Image files create made; removed (they are ours: made with O_EXCL).
    made: Vec<PathBuf>,
    /// Members that existed and were empty: their head and their end copies,
    /// where create writes the superblocks, are zeroed again so that a rerun
    /// finds them empty.
    blank: Vec<Arc<dyn Member>>,
}

impl Drop for Undo {
    fn drop(&mut self) {
        for member in &self.blank {
            let len = DEFAULT_DATA_OFFSET.min(member.len());
            let tail = end_offsets(member.len())
                .map(|[first, _]| (first, member_end(member.len()) - first));
            let zeroed = member.zero_range(0, len).and_then(|()| match tail {
                Some((at, n)) => member.zero_range(at, n),
                None => Ok(()),
            });
            if let Err(e) = zeroed.and_then(|()| member.sync()) {
                log::warn!("{}: could not blank it again: {e}", member.name());
                eprintln!("raidfs: {}: could not blank it again: {e}", member.name());
            }
        }
        for path in &self.made {
            if let Err(e) = std::fs::remove_file(path) {
                eprintln!("raidfs: {}: could not remove it: {e}", path.display());
            }
        }
    }
}

/// What validation learnt about one path.
struct Checked {
    /// Size of the member (the new image's, for one to be made).
    size: u64,
    /// Missing now: to be made as a sparse image.
    make: bool,
    /// A regular file (or one to be made), whose host space matters.
    image: bool,
    /// Existing and empty (nothing but zeros where superblocks go).
    blank: bool,
}

/// Check one path, writing nothing.
fn check_path(path: &Path, options: &PathOptions) -> ArrayResult<Checked> {
    if crate::member::open::is_uri(path) {
        return check_export(path, options);
    }
    if std::fs::symlink_metadata(path).is_err() {
        let Some(size) = options.size else {
            return Err(ArrayError::Refused(format!(
                "{} does not exist; give --size to create it as a sparse image",
                path.display()
            )));
        };
        check_new_image_dir(path)?;
        return Ok(Checked {
            size,
            make: true,
            image: true,
            blank: false,
        });
    }
    let problem = ownership_problem(path)?;
    if let Some(problem) = &problem {
        if !options.force {
            return Err(ArrayError::Refused(format!(
                "{problem}; use --force to overwrite it"
            )));
        }
        log::warn!("{problem}; overwriting (--force)");
    }
    let peek = OpenOptions {
        read_only: true,
        lock: false,
        ..OpenOptions::default()
    };
    let member = FileMember::open(path, peek).map_err(|source| ArrayError::MemberIo {
        path: path.display().to_string(),
        source,
    })?;
    let image = std::fs::metadata(path).is_ok_and(|m| m.is_file());
    Ok(Checked {
        size: member.len(),
        make: false,
        image,
        blank: problem.is_none(),
    })
}

/// Check an NBD export: it must answer, and its size is the member's
/// (`--size` makes new image files only).
fn check_export(uri: &Path, options: &PathOptions) -> ArrayResult<Checked> {
    let name = uri.display().to_string();
    let member = crate::member::open::peek(uri).map_err(|source| ArrayError::MemberIo {
        path: name.clone(),
        source,
    })?;
    let problem = member_problem(&name, member.as_ref())?;
    if let Some(problem) = &problem {
        if !options.force {
            return Err(ArrayError::Refused(format!(
                "{problem}; use --force to overwrite it"
            )));
        }
        log::warn!("{problem}; overwriting (--force)");
    }
    Ok(Checked {
        size: member.len(),
        make: false,
        image: false,
        blank: problem.is_none(),
    })
}

/// The directory a new image goes in must exist and take new files.
fn check_new_image_dir(path: &Path) -> ArrayResult<()> {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(meta) if meta.is_dir() => {}
        Ok(_) => {
            return Err(ArrayError::Refused(format!(
                "cannot create {}: {} is not a directory",
                path.display(),
                dir.display()
            )))
        }
        Err(e) => {
            return Err(ArrayError::Refused(format!(
                "cannot create {}: directory {}: {e}",
                path.display(),
                dir.display()
            )))
        }
    }
    let c_dir = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| ArrayError::Refused(format!("{}: NUL in path", dir.display())))?;
    // SAFETY: c_dir is NUL-terminated; access only reads it.
    if unsafe { libc::access(c_dir.as_ptr(), libc::W_OK) } != 0 {
        return Err(ArrayError::Refused(format!(
            "cannot create {}: directory {}: {}",
            path.display(),
            dir.display(),
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

/// `raidfs create`: check every path (ownership, sizes, the directories of
/// new images, host space for `--preallocate`) before writing anything;
/// then make the missing image files and create the array. A failure after
/// that removes the files it made and blanks again the members that were
/// empty, so a corrected rerun starts from where the user was.
pub fn create_paths(
    paths: &[PathBuf],
    spec: &CreateSpec,
    options: &PathOptions,
) -> ArrayResult<Created> {
    let geometry = spec.geometry(paths.len())?;
    if paths.len() > MAX_MEMBERS {
        return Err(ArrayError::Refused(format!(
            "too many members: {} (at most {MAX_MEMBERS})",
            paths.len()
        )));
    }
    crate::member::open::refuse_repeated(paths).map_err(ArrayError::Refused)?;
    let mut checked = Vec::with_capacity(paths.len());
    for path in paths {
        checked.push(check_path(path, options)?);
    }
    let smallest = checked.iter().map(|c| c.size).min().unwrap_or(0);
    data_groups(smallest, geometry.chunk)?;

    let images: Vec<Image> = paths
        .iter()
        .zip(&checked)
        .filter(|(_, c)| c.image)
        .map(|(path, c)| Image {
            path: path.clone(),
            size: c.size,
        })
        .collect();
    let short = shortfalls(&images).map_err(|source| ArrayError::MemberIo {
        path: "host space".into(),
        source,
    })?;
    if options.preallocate && !short.is_empty() {
        let refusals: Vec<String> = short.iter().map(|s| s.refusal()).collect();
        return Err(ArrayError::Refused(refusals.join("; ")));
    }
    let warnings = if options.preallocate {
        Vec::new()
    } else {
        short.iter().map(|s| s.warning()).collect()
    };

    let mut undo = Undo::default();
    let mut members = Vec::with_capacity(paths.len());
    for (path, check) in paths.iter().zip(&checked) {
        let io_err = |source| ArrayError::MemberIo {
            path: path.display().to_string(),
            source,
        };
        let member: Arc<dyn Member> = if check.make {
            let member = FileMember::create(path, check.size).map_err(io_err)?;
            undo.made.push(path.clone());
            if options.preallocate {
                member.preallocate().map_err(io_err)?;
            }
            Arc::new(member)
        } else if crate::member::open::is_uri(path) {
            // Its space is the server's business: nothing to preallocate.
            crate::member::open::open(path, &OpenOptions::default()).map_err(io_err)?
        } else {
            let member = FileMember::open(path, OpenOptions::default()).map_err(io_err)?;
            if options.preallocate {
                member.preallocate().map_err(io_err)?;
            }
            Arc::new(member)
        };
        if check.blank {
            undo.blank.push(Arc::clone(&member));
        }
        members.push((member, path.display().to_string()));
    }
    let array = create(members, spec)?;
    Ok(Created {
        array: Arc::new(array),
        warnings,
        undo,
    })
}
