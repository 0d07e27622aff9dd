//! The superblock: every member's record of which array it belongs to, where
//! it sits in it, and the array's state as this member last knew it.
//!
//! Format version 2 keeps four copies on each member: two at the start
//! ([`SB_OFFSETS`]) and two in the last 8 KiB ([`end_offsets`]), so a member
//! whose start was overwritten (a stray `dd`, a partitioning tool, a zeroed
//! first MiB) is still recognised, as md's 1.0 superblock and ZFS's four
//! labels are. The copies are written one after the other with a sync
//! between, so a torn write destroys at most one. Version 1 members (older
//! releases) carry the front copies only and may use the member up to its
//! end; they are read and kept as version 1 (see [`Superblock::write_to`]).
//! Each copy is 4 KiB of fixed-width little-endian fields ending in a crc32c;
//! `docs/format.md` documents it byte by byte.
//!
//! Format version 3 adds the compat and ro-compat feature words beside the
//! incompat one (the `features` word of versions 1 and 2), with the rules of
//! [`crate::features`]: an unknown incompat bit refuses the member, an unknown
//! ro-compat bit lets only a read-only assembly in (the check is the array's,
//! at assembly), unknown compat bits are kept. Versions 1 and 2 have the one
//! word, whose only known bit (PPL) is ro-compat in the model.

pub use crate::features::Features;
use crate::features::Known;
use crate::geometry::{Layout, Level};
use crate::member::Member;
use serde::Serialize;
use uuid::Uuid;

pub const MAGIC: [u8; 8] = *b"RAIDFS\x00\x01";
/// The format version this raidfs writes for new arrays.
pub const FORMAT_VERSION: u32 = 3;
/// The first format version with the three feature words (and the last
/// version bump: later features are feature bits).
pub const FEATURE_WORDS_VERSION: u32 = 3;
/// The oldest format version this raidfs reads (and keeps writing as it is).
pub const OLDEST_FORMAT_VERSION: u32 = 1;
pub const SUPERBLOCK_SIZE: usize = 4096;
/// Byte offsets of the two front superblock copies on every member.
pub const SB_OFFSETS: [u64; 2] = [0, 4096];
/// Bytes the two end copies take at the end of a version 2 member; the data
/// area must end at or before `member_end(len) - END_COPIES_LEN`.
pub const END_COPIES_LEN: u64 = 2 * SUPERBLOCK_SIZE as u64;
/// Where member data starts by default (room for the bitmap and PPL areas).
pub const DEFAULT_DATA_OFFSET: u64 = 1 << 20;
/// What new arrays leave unused at the end of each member: the end copies
/// plus room for later end-of-member structures, mirroring
/// [`DEFAULT_DATA_OFFSET`] at the front.
pub const TAIL_RESERVE: u64 = 1 << 20;
/// Ro-compat feature bit: partial-parity log (closes the RAID5 write hole).
/// A raidfs without it reads the array correctly but would write without
/// logging, leaving a ring that a later recovery would replay wrongly; so it
/// is ro-compat. Versions 1 and 2 store it as bit 1 of their one word.
pub const FEATURE_PPL: u64 = 1 << 1;
/// The compat feature bits this raidfs knows (none yet).
pub const KNOWN_COMPAT: u64 = 0;
/// The ro-compat feature bits this raidfs knows.
pub const KNOWN_RO_COMPAT: u64 = FEATURE_PPL;
/// Incompat feature bit: a reshape is under way and the superblock carries
/// its record ([`Reshape`]): some groups are still in the old geometry, one
/// may be in force at a staging slice. A raidfs without it would read those
/// groups with the new geometry, so it must refuse the array.
pub const FEATURE_RESHAPE: u64 = 1 << 0;
/// The incompat feature bits this raidfs knows.
pub const KNOWN_INCOMPAT: u64 = FEATURE_RESHAPE;
/// The superblock's feature bits with their names, for the rules of
/// [`crate::features`].
pub const SUPERBLOCK_FEATURES: Known = Known {
    what: "superblock",
    compat: &[],
    ro_compat: &[(FEATURE_PPL, "ppl")],
    incompat: &[(FEATURE_RESHAPE, "reshape")],
};
/// Most member slots an array can have.
pub const MAX_MEMBERS: usize = 255;
/// Most allocation groups an array can have (one byte each in the table).
pub const MAX_GROUPS: usize = 2048;
/// `slot` value of a hot spare.
pub const SPARE_SLOT: u32 = u32::MAX;

/// Clean means every stripe's parity/copies agree; dirty means writes may have
/// been in flight (set while mounted read-write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum ArrayState {
    Clean,
    Dirty,
}

/// A slot's state as recorded in this member's superblock (md's dev_roles).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum SlotState {
    Active,
    Faulty,
    /// Being rebuilt; `recovery_offset` on that member says how far.
    Rebuilding,
    Missing,
}

/// What an allocation group holds. The table index is the group number.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum GroupProfile {
    Unallocated,
    /// Filesystem metadata: mirrored on min(3, members) members.
    Metadata,
    /// File data at the array's level.
    Data,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Superblock {
    pub version: u32,
    pub array_uuid: Uuid,
    pub member_uuid: Uuid,
    /// Array name (at most 32 bytes of UTF-8).
    pub name: String,
    /// This member's slot (role) in the array, or SPARE_SLOT.
    pub slot: u32,
    pub level: Level,
    pub layout: Layout,
    /// Chunk size in bytes.
    pub chunk: u64,
    /// Number of slots (members when complete).
    pub members: u32,
    /// Copies for RAID1/10.
    pub copies: u32,
    /// Where the data area starts on the member.
    pub data_offset: u64,
    /// Usable bytes of the data area on each member.
    pub data_size: u64,
    /// Bytes of each member's data area that one allocation group occupies.
    pub group_size: u64,
    /// Bumped on every state change; the highest wins at assembly.
    pub events: u64,
    pub state: ArrayState,
    /// How far this member has been rebuilt (u64::MAX: in sync).
    pub recovery_offset: u64,
    /// Compat, ro-compat and incompat feature bits (see [`crate::features`]).
    pub features: Features,
    /// Creation and last update time, seconds since the epoch.
    pub ctime: u64,
    pub utime: u64,
    /// State of each slot, `members` entries.
    pub slots: Vec<SlotState>,
    /// Profile of each allocation group, `data_size / group_size` entries.
    pub groups: Vec<GroupProfile>,
    /// A check or repair paused before its end, to resume from.
    pub scrub: Option<ScrubCheckpoint>,
    /// The reshape under way, when there is one (incompat feature
    /// [`FEATURE_RESHAPE`] set with it, version 3 on).
    pub reshape: Option<Reshape>,
}

/// A geometry as the superblock records it: the fields of the array-wide
/// geometry, for the groups a reshape has not reached yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct GeometrySpec {
    pub level: Level,
    pub layout: Layout,
    pub chunk: u64,
    pub members: u32,
    pub copies: u32,
}

/// A reshape under way (md's reshape_position, per group): the superblock's
/// own geometry fields already describe the target; `from` is the geometry
/// of every group in `pending`. A group moves from one to the other in two
/// copies, each switched in by one superblock commit: first to the
/// `staging` slice in the old geometry (`staged` names it while that copy
/// is the one in force), then home in the new geometry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Reshape {
    pub from: GeometrySpec,
    /// Groups still in the `from` geometry (bit `g` for group `g`).
    pub pending: Vec<bool>,
    /// The unallocated slice a group is copied to before it is rewritten
    /// at home; kept from allocation while the reshape runs.
    pub staging: u32,
    /// The group whose copy at `staging` is in force, if any.
    pub staged: Option<u32>,
}

impl Reshape {
    /// Whether group `g` is still in the old geometry.
    pub fn is_pending(&self, g: u32) -> bool {
        self.pending.get(g as usize).copied().unwrap_or(false)
    }

    /// Groups still to move.
    pub fn pending_count(&self) -> usize {
        self.pending.iter().filter(|&&p| p).count()
    }
}

/// Where a paused check or repair resumes. Bytes an older raidfs never
/// wrote (zero: none) and ignores; its next superblock write drops the
/// checkpoint, and the scrub then starts over, which is only slower.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ScrubCheckpoint {
    /// A repair (else a check).
    pub repair: bool,
    /// Member offset below which every allocated group is scrubbed.
    pub offset: u64,
}

/// Why a superblock could not be read.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockError {
    #[error("{0}: I/O error reading superblock: {1}")]
    Io(String, std::io::Error),
    #[error("{0}: not a raidfs member (no superblock magic)")]
    NotMember(String),
    #[error("{member}: every superblock copy fails its checksum")]
    Corrupt { member: String },
    #[error(
        "{member}: superblock format version {version} is not supported (this raidfs reads versions {OLDEST_FORMAT_VERSION} to {FORMAT_VERSION}); a newer raidfs wrote it"
    )]
    Version { member: String, version: u32 },
    #[error("{member}: invalid superblock field: {what}")]
    Invalid { member: String, what: String },
    /// An incompat feature this raidfs does not know.
    #[error("{member}: {what}")]
    Feature { member: String, what: String },
}

/// What reading one superblock copy found.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum CopyState {
    /// Valid, and the superblock [`Superblock::read_from`] returned.
    Good,
    /// Valid, but not the returned superblock: fewer events (an interrupted
    /// update) or another array's or member's identity.
    Stale,
    /// Has the magic but fails its checksum (a torn or damaged write).
    BadChecksum,
    /// Unreadable, an unsupported version, or a field out of range.
    Invalid,
    /// No magic where a copy should be.
    Missing,
    /// No copy belongs here: the end copies of a version 1 member (whose data
    /// area may reach the member's end) or of a member too small for them.
    NotPresent,
}

impl CopyState {
    /// Short lower-case description for `examine`.
    pub fn describe(self) -> &'static str {
        match self {
            CopyState::Good => "good",
            CopyState::Stale => "stale",
            CopyState::BadChecksum => "bad checksum",
            CopyState::Invalid => "invalid",
            CopyState::Missing => "missing",
            CopyState::NotPresent => "not present",
        }
    }
}

/// Names of the four copies, in [`ReadVerdict::copies`] order.
pub const COPY_NAMES: [&str; 4] = ["front 0", "front 1", "end 0", "end 1"];

/// Result of reading every copy of one member.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ReadVerdict {
    /// Front copy 0, front copy 1, end copy 0, end copy 1.
    pub copies: [CopyState; 4],
}

impl ReadVerdict {
    /// Whether some copy that should hold the returned superblock does not
    /// (damaged, missing or stale): writing the superblock again heals it.
    pub fn needs_rewrite(&self) -> bool {
        self.copies
            .iter()
            .any(|c| !matches!(c, CopyState::Good | CopyState::NotPresent))
    }

    /// Whether some copy is damaged or missing (not merely stale, which an
    /// interrupted update leaves behind and the next update replaces).
    pub fn has_damage(&self) -> bool {
        self.copies.iter().any(|c| {
            matches!(
                c,
                CopyState::BadChecksum | CopyState::Invalid | CopyState::Missing
            )
        })
    }

    /// The copies that are not good, as `"front 0 missing, end 1 bad checksum"`.
    pub fn damaged(&self) -> String {
        self.copies
            .iter()
            .zip(COPY_NAMES)
            .filter(|(c, _)| !matches!(c, CopyState::Good | CopyState::NotPresent))
            .map(|(c, name)| format!("{name} {}", c.describe()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The end of a member as the end copies see it: its length rounded down to
/// a whole 4 KiB block.
pub fn member_end(len: u64) -> u64 {
    len / SUPERBLOCK_SIZE as u64 * SUPERBLOCK_SIZE as u64
}

/// Byte offsets of the two end copies on a member of `len` bytes, or `None`
/// when the member is too small to hold them apart from the front copies.
pub fn end_offsets(len: u64) -> Option<[u64; 2]> {
    let end = member_end(len);
    let front = SB_OFFSETS[1] + SUPERBLOCK_SIZE as u64;
    (end >= front + END_COPIES_LEN).then(|| [end - END_COPIES_LEN, end - SUPERBLOCK_SIZE as u64])
}

/// Byte offsets of the fields inside one copy (see `docs/format.md`).
mod offsets {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 8;
    pub const ARRAY_UUID: usize = 16;
    pub const MEMBER_UUID: usize = 32;
    pub const NAME: usize = 48;
    pub const NAME_LEN: usize = 32;
    pub const SLOT: usize = 80;
    pub const LEVEL: usize = 84;
    pub const LAYOUT: usize = 85;
    pub const STATE: usize = 86;
    pub const CHUNK: usize = 88;
    pub const MEMBERS: usize = 96;
    pub const COPIES: usize = 100;
    pub const DATA_OFFSET: usize = 104;
    pub const DATA_SIZE: usize = 112;
    pub const GROUP_SIZE: usize = 120;
    pub const EVENTS: usize = 128;
    pub const RECOVERY_OFFSET: usize = 136;
    /// `features` in versions 1 and 2.
    pub const INCOMPAT: usize = 144;
    pub const CTIME: usize = 152;
    pub const UTIME: usize = 160;
    pub const GROUP_COUNT: usize = 168;
    /// Version 3 on; reserved (zero, ignored) before.
    pub const RO_COMPAT: usize = 172;
    pub const COMPAT: usize = 180;
    /// A paused scrub: 0 none, 1 check, 2 repair (other codes: none).
    pub const SCRUB_KIND: usize = 188;
    pub const SCRUB_OFFSET: usize = 192;
    pub const SLOTS: usize = 256;
    pub const GROUPS: usize = 512;
    /// The reshape record (incompat `reshape` set; zero otherwise).
    pub const RESHAPE: usize = GROUPS + super::MAX_GROUPS;
    pub const RESHAPE_FROM_LEVEL: usize = RESHAPE;
    pub const RESHAPE_FROM_LAYOUT: usize = RESHAPE + 1;
    pub const RESHAPE_FROM_MEMBERS: usize = RESHAPE + 4;
    pub const RESHAPE_FROM_CHUNK: usize = RESHAPE + 8;
    pub const RESHAPE_FROM_COPIES: usize = RESHAPE + 16;
    pub const RESHAPE_STAGING: usize = RESHAPE + 20;
    pub const RESHAPE_STAGED: usize = RESHAPE + 24;
    pub const RESHAPE_PENDING: usize = RESHAPE + 32;
    pub const CRC: usize = super::SUPERBLOCK_SIZE - 4;
}

/// Smallest and largest chunk sizes (as the geometry layer accepts).
const MIN_CHUNK: u64 = 4096;
const MAX_CHUNK: u64 = 64 << 20;
/// Data offsets and group sizes are multiples of this.
const ALIGN: u64 = 4096;

fn level_to_code(level: Level) -> u8 {
    match level {
        Level::Raid0 => 0,
        Level::Raid1 => 1,
        Level::Raid5 => 5,
        Level::Raid6 => 6,
        Level::Raid10 => 10,
    }
}

fn level_from_code(code: u8) -> Option<Level> {
    Some(match code {
        0 => Level::Raid0,
        1 => Level::Raid1,
        5 => Level::Raid5,
        6 => Level::Raid6,
        10 => Level::Raid10,
        _ => return None,
    })
}

/// md's algorithm numbers for the four RAID5/6 layouts.
fn layout_to_code(layout: Layout) -> u8 {
    match layout {
        Layout::LeftAsymmetric => 0,
        Layout::RightAsymmetric => 1,
        Layout::LeftSymmetric => 2,
        Layout::RightSymmetric => 3,
    }
}

fn layout_from_code(code: u8) -> Option<Layout> {
    Some(match code {
        0 => Layout::LeftAsymmetric,
        1 => Layout::RightAsymmetric,
        2 => Layout::LeftSymmetric,
        3 => Layout::RightSymmetric,
        _ => return None,
    })
}

fn state_to_code(state: ArrayState) -> u8 {
    match state {
        ArrayState::Clean => 0,
        ArrayState::Dirty => 1,
    }
}

fn state_from_code(code: u8) -> Option<ArrayState> {
    match code {
        0 => Some(ArrayState::Clean),
        1 => Some(ArrayState::Dirty),
        _ => None,
    }
}

/// Slot codes start at 1 so that 0 can mark table entries past `members`.
fn slot_to_code(slot: SlotState) -> u8 {
    match slot {
        SlotState::Active => 1,
        SlotState::Faulty => 2,
        SlotState::Rebuilding => 3,
        SlotState::Missing => 4,
    }
}

fn slot_from_code(code: u8) -> Option<SlotState> {
    Some(match code {
        1 => SlotState::Active,
        2 => SlotState::Faulty,
        3 => SlotState::Rebuilding,
        4 => SlotState::Missing,
        _ => return None,
    })
}

fn group_to_code(group: GroupProfile) -> u8 {
    match group {
        GroupProfile::Unallocated => 0,
        GroupProfile::Metadata => 1,
        GroupProfile::Data => 2,
    }
}

fn group_from_code(code: u8) -> Option<GroupProfile> {
    Some(match code {
        0 => GroupProfile::Unallocated,
        1 => GroupProfile::Metadata,
        2 => GroupProfile::Data,
        _ => return None,
    })
}

/// The reshape record of a copy whose feature bit says it has one.
fn decode_reshape(buf: &[u8], group_count: usize) -> Result<Reshape, String> {
    use offsets::*;
    let level = level_from_code(buf[RESHAPE_FROM_LEVEL]).ok_or_else(|| {
        format!(
            "reshape from unknown level code {}",
            buf[RESHAPE_FROM_LEVEL]
        )
    })?;
    let layout = layout_from_code(buf[RESHAPE_FROM_LAYOUT]).ok_or_else(|| {
        format!(
            "reshape from unknown layout code {}",
            buf[RESHAPE_FROM_LAYOUT]
        )
    })?;
    if buf[RESHAPE + 2..RESHAPE_FROM_MEMBERS]
        .iter()
        .any(|&b| b != 0)
        || buf[RESHAPE_STAGED + 4..RESHAPE_PENDING]
            .iter()
            .any(|&b| b != 0)
    {
        return Err("reserved bytes of the reshape record are not zero".into());
    }
    let pending: Vec<bool> = (0..MAX_GROUPS)
        .map(|g| buf[RESHAPE_PENDING + g / 8] & (1 << (g % 8)) != 0)
        .collect();
    if let Some(g) = pending[group_count..].iter().position(|&p| p) {
        return Err(format!(
            "reshape marks group {} but the array has {group_count} groups",
            group_count + g
        ));
    }
    let staged = get_u32(buf, RESHAPE_STAGED);
    Ok(Reshape {
        from: GeometrySpec {
            level,
            layout,
            chunk: get_u64(buf, RESHAPE_FROM_CHUNK),
            members: get_u32(buf, RESHAPE_FROM_MEMBERS),
            copies: get_u32(buf, RESHAPE_FROM_COPIES),
        },
        pending: pending[..group_count].to_vec(),
        staging: get_u32(buf, RESHAPE_STAGING),
        staged: (staged != u32::MAX).then_some(staged),
    })
}

fn put_u32(buf: &mut [u8], at: usize, value: u32) {
    buf[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn put_u64(buf: &mut [u8], at: usize, value: u64) {
    buf[at..at + 8].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(bytes)
}

fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(bytes)
}

fn get_uuid(buf: &[u8], at: usize) -> Uuid {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&buf[at..at + 16]);
    Uuid::from_bytes(bytes)
}

/// The superblock with the most events (the first of them on a tie).
fn newest<'a>(copies: impl Iterator<Item = &'a Superblock>) -> Option<&'a Superblock> {
    let mut best: Option<&Superblock> = None;
    for sb in copies {
        if best.is_none_or(|b| sb.events > b.events) {
            best = Some(sb);
        }
    }
    best
}

/// Seconds since the Unix epoch (0 if the clock is before it).
pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Superblock {
    /// The superblock of a new array, as slot 0 will carry it: fresh array and
    /// member uuids, events 1, clean, every slot active, every group
    /// unallocated, data at [`DEFAULT_DATA_OFFSET`]. Use [`Superblock::for_slot`]
    /// for the other members. `data_size` should leave [`TAIL_RESERVE`]
    /// before the members' end, as `array::create` does.
    pub fn new_for_create(
        name: &str,
        geometry: &crate::geometry::Geometry,
        data_size: u64,
        group_size: u64,
    ) -> Result<Superblock, SuperblockError> {
        let now = now_secs();
        let invalid = |what: String| SuperblockError::Invalid {
            member: format!("new array {name:?}"),
            what,
        };
        let group_count = data_size.checked_div(group_size).unwrap_or(0);
        if group_count > MAX_GROUPS as u64 {
            return Err(invalid(format!(
                "data size {data_size} makes {group_count} groups of {group_size} bytes, more than {MAX_GROUPS}"
            )));
        }
        let sb = Superblock {
            version: FORMAT_VERSION,
            array_uuid: Uuid::new_v4(),
            member_uuid: Uuid::new_v4(),
            name: name.to_string(),
            slot: 0,
            level: geometry.level,
            layout: geometry.layout,
            chunk: geometry.chunk,
            members: u32::try_from(geometry.members).unwrap_or(u32::MAX),
            copies: u32::try_from(geometry.copies).unwrap_or(u32::MAX),
            data_offset: DEFAULT_DATA_OFFSET,
            data_size,
            group_size,
            events: 1,
            state: ArrayState::Clean,
            recovery_offset: u64::MAX,
            features: Features::default(),
            ctime: now,
            utime: now,
            slots: vec![SlotState::Active; geometry.members],
            groups: vec![GroupProfile::Unallocated; group_count as usize],
            reshape: None,
            scrub: None,
        };
        sb.validate().map_err(invalid)?;
        Ok(sb)
    }

    /// This superblock as another member carries it: `slot` and a fresh member uuid.
    pub fn for_slot(&self, slot: u32) -> Superblock {
        Superblock {
            slot,
            member_uuid: Uuid::new_v4(),
            ..self.clone()
        }
    }

    /// The on-disk code of the level (0, 1, 5, 6, 10).
    pub fn level_code(&self) -> u8 {
        level_to_code(self.level)
    }

    /// The on-disk code of the layout (md's algorithm numbers 0..=3).
    pub fn layout_code(&self) -> u8 {
        layout_to_code(self.layout)
    }

    /// Whether this member is a hot spare.
    pub fn is_spare(&self) -> bool {
        self.slot == SPARE_SLOT
    }

    /// Encode into one 4 KiB copy (crc32c over all bytes before the crc field).
    ///
    /// Does not validate: a name longer than 32 bytes or tables longer than
    /// their limits are cut, and the result then fails [`Superblock::decode`].
    /// [`Superblock::write_to`] validates first.
    pub fn encode(&self) -> [u8; SUPERBLOCK_SIZE] {
        use offsets::*;
        let mut buf = [0u8; SUPERBLOCK_SIZE];
        buf[MAGIC..MAGIC + 8].copy_from_slice(&self::MAGIC);
        put_u32(&mut buf, VERSION, self.version);
        buf[ARRAY_UUID..ARRAY_UUID + 16].copy_from_slice(self.array_uuid.as_bytes());
        buf[MEMBER_UUID..MEMBER_UUID + 16].copy_from_slice(self.member_uuid.as_bytes());
        let name = self.name.as_bytes();
        let name_len = name.len().min(NAME_LEN);
        buf[NAME..NAME + name_len].copy_from_slice(&name[..name_len]);
        put_u32(&mut buf, SLOT, self.slot);
        buf[LEVEL] = level_to_code(self.level);
        buf[LAYOUT] = layout_to_code(self.layout);
        buf[STATE] = state_to_code(self.state);
        put_u64(&mut buf, CHUNK, self.chunk);
        put_u32(&mut buf, MEMBERS, self.members);
        put_u32(&mut buf, COPIES, self.copies);
        put_u64(&mut buf, DATA_OFFSET, self.data_offset);
        put_u64(&mut buf, DATA_SIZE, self.data_size);
        put_u64(&mut buf, GROUP_SIZE, self.group_size);
        put_u64(&mut buf, EVENTS, self.events);
        put_u64(&mut buf, RECOVERY_OFFSET, self.recovery_offset);
        if self.version >= FEATURE_WORDS_VERSION {
            put_u64(&mut buf, INCOMPAT, self.features.incompat);
            put_u64(&mut buf, RO_COMPAT, self.features.ro_compat);
            put_u64(&mut buf, COMPAT, self.features.compat);
        } else {
            put_u64(&mut buf, INCOMPAT, one_word(&self.features));
        }
        if let Some(scrub) = self.scrub {
            buf[SCRUB_KIND] = if scrub.repair { 2 } else { 1 };
            put_u64(&mut buf, SCRUB_OFFSET, scrub.offset);
        }
        put_u64(&mut buf, CTIME, self.ctime);
        put_u64(&mut buf, UTIME, self.utime);
        put_u32(
            &mut buf,
            GROUP_COUNT,
            u32::try_from(self.groups.len()).unwrap_or(u32::MAX),
        );
        for (i, slot) in self.slots.iter().take(MAX_MEMBERS).enumerate() {
            buf[SLOTS + i] = slot_to_code(*slot);
        }
        for (i, group) in self.groups.iter().take(MAX_GROUPS).enumerate() {
            buf[GROUPS + i] = group_to_code(*group);
        }
        if let Some(r) = &self.reshape {
            buf[RESHAPE_FROM_LEVEL] = level_to_code(r.from.level);
            buf[RESHAPE_FROM_LAYOUT] = layout_to_code(r.from.layout);
            put_u32(&mut buf, RESHAPE_FROM_MEMBERS, r.from.members);
            put_u64(&mut buf, RESHAPE_FROM_CHUNK, r.from.chunk);
            put_u32(&mut buf, RESHAPE_FROM_COPIES, r.from.copies);
            put_u32(&mut buf, RESHAPE_STAGING, r.staging);
            put_u32(&mut buf, RESHAPE_STAGED, r.staged.unwrap_or(u32::MAX));
            for (g, _) in r
                .pending
                .iter()
                .take(MAX_GROUPS)
                .enumerate()
                .filter(|(_, p)| **p)
            {
                buf[RESHAPE_PENDING + g / 8] |= 1 << (g % 8);
            }
        }
        let crc = crc32c::crc32c(&buf[..CRC]);
        put_u32(&mut buf, CRC, crc);
        buf
    }

    /// Decode one copy; verifies magic, crc, version and field sanity, in that
    /// order (the crc sits at the end of the block in every version, so it is
    /// checked before the version is trusted).
    pub fn decode(buf: &[u8], member: &str) -> Result<Superblock, SuperblockError> {
        use offsets::*;
        let invalid = |what: String| SuperblockError::Invalid {
            member: member.to_string(),
            what,
        };
        if buf.len() < MAGIC + 8 || buf[MAGIC..MAGIC + 8] != self::MAGIC {
            return Err(SuperblockError::NotMember(member.to_string()));
        }
        if buf.len() < SUPERBLOCK_SIZE {
            return Err(invalid(format!(
                "superblock buffer is {} bytes, expected {SUPERBLOCK_SIZE}",
                buf.len()
            )));
        }
        let buf = &buf[..SUPERBLOCK_SIZE];
        if crc32c::crc32c(&buf[..CRC]) != get_u32(buf, CRC) {
            return Err(SuperblockError::Corrupt {
                member: member.to_string(),
            });
        }
        let version = get_u32(buf, VERSION);
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&version) {
            return Err(SuperblockError::Version {
                member: member.to_string(),
                version,
            });
        }
        let features = if version >= FEATURE_WORDS_VERSION {
            Features {
                compat: get_u64(buf, COMPAT),
                ro_compat: get_u64(buf, RO_COMPAT),
                incompat: get_u64(buf, INCOMPAT),
            }
        } else {
            features_from_one_word(get_u64(buf, INCOMPAT))
        };
        SUPERBLOCK_FEATURES
            .refuse_open(&features)
            .map_err(|what| SuperblockError::Feature {
                member: member.to_string(),
                what,
            })?;
        let name_bytes = &buf[NAME..NAME + NAME_LEN];
        let name_len = name_bytes.iter().position(|&b| b == 0).unwrap_or(NAME_LEN);
        if name_bytes[name_len..].iter().any(|&b| b != 0) {
            return Err(invalid("name has bytes after its terminating zero".into()));
        }
        let name = std::str::from_utf8(&name_bytes[..name_len])
            .map_err(|_| invalid("name is not UTF-8".into()))?
            .to_string();
        let level = level_from_code(buf[LEVEL])
            .ok_or_else(|| invalid(format!("unknown level code {}", buf[LEVEL])))?;
        let layout = layout_from_code(buf[LAYOUT])
            .ok_or_else(|| invalid(format!("unknown layout code {}", buf[LAYOUT])))?;
        let state = state_from_code(buf[STATE])
            .ok_or_else(|| invalid(format!("unknown array state code {}", buf[STATE])))?;
        let members = get_u32(buf, MEMBERS);
        if members == 0 || members as usize > MAX_MEMBERS {
            return Err(invalid(format!(
                "member count {members} is not in 1..={MAX_MEMBERS}"
            )));
        }
        let slot_table = &buf[SLOTS..SLOTS + MAX_MEMBERS];
        let mut slots = Vec::with_capacity(members as usize);
        for (i, &code) in slot_table.iter().enumerate() {
            if i < members as usize {
                slots.push(
                    slot_from_code(code).ok_or_else(|| {
                        invalid(format!("slot {i} has unknown state code {code}"))
                    })?,
                );
            } else if code != 0 {
                return Err(invalid(format!(
                    "slot table entry {i} is set but the array has {members} slots"
                )));
            }
        }
        let group_count = get_u32(buf, GROUP_COUNT) as usize;
        if group_count > MAX_GROUPS {
            return Err(invalid(format!(
                "group count {group_count} exceeds {MAX_GROUPS}"
            )));
        }
        let group_table = &buf[GROUPS..GROUPS + MAX_GROUPS];
        let mut groups = Vec::with_capacity(group_count);
        for (i, &code) in group_table.iter().enumerate() {
            if i < group_count {
                groups.push(group_from_code(code).ok_or_else(|| {
                    invalid(format!("group {i} has unknown profile code {code}"))
                })?);
            } else if code != 0 {
                return Err(invalid(format!(
                    "group table entry {i} is set but the array has {group_count} groups"
                )));
            }
        }
        let reshape = if features.incompat & FEATURE_RESHAPE != 0 {
            Some(decode_reshape(buf, group_count).map_err(invalid)?)
        } else {
            None
        };
        let sb = Superblock {
            version,
            array_uuid: get_uuid(buf, ARRAY_UUID),
            member_uuid: get_uuid(buf, MEMBER_UUID),
            name,
            slot: get_u32(buf, SLOT),
            level,
            layout,
            chunk: get_u64(buf, CHUNK),
            members,
            copies: get_u32(buf, COPIES),
            data_offset: get_u64(buf, DATA_OFFSET),
            data_size: get_u64(buf, DATA_SIZE),
            group_size: get_u64(buf, GROUP_SIZE),
            events: get_u64(buf, EVENTS),
            state,
            recovery_offset: get_u64(buf, RECOVERY_OFFSET),
            features,
            ctime: get_u64(buf, CTIME),
            utime: get_u64(buf, UTIME),
            slots,
            groups,
            reshape,
            scrub: match buf[SCRUB_KIND] {
                1 | 2 => Some(ScrubCheckpoint {
                    repair: buf[SCRUB_KIND] == 2,
                    offset: get_u64(buf, SCRUB_OFFSET),
                }),
                _ => None,
            },
        };
        sb.validate().map_err(invalid)?;
        Ok(sb)
    }

    /// Check every field against the format's rules; the error says which failed.
    pub fn validate(&self) -> Result<(), String> {
        if !(OLDEST_FORMAT_VERSION..=FORMAT_VERSION).contains(&self.version) {
            return Err(format!(
                "version {} is not in {OLDEST_FORMAT_VERSION}..={FORMAT_VERSION}",
                self.version
            ));
        }
        SUPERBLOCK_FEATURES.refuse_open(&self.features)?;
        if self.version < FEATURE_WORDS_VERSION
            && features_from_one_word(one_word(&self.features)) != self.features
        {
            return Err(format!(
                "version {} keeps one feature word, which cannot hold {}",
                self.version,
                SUPERBLOCK_FEATURES.describe(&self.features)
            ));
        }
        if self.name.len() > offsets::NAME_LEN {
            return Err(format!(
                "name {:?} is longer than {} bytes",
                self.name,
                offsets::NAME_LEN
            ));
        }
        if self.name.contains('\0') {
            return Err("name contains a zero byte".into());
        }
        let members = self.members as usize;
        if members == 0 || members > MAX_MEMBERS {
            return Err(format!(
                "member count {members} is not in 1..={MAX_MEMBERS}"
            ));
        }
        if self.slots.len() != members {
            return Err(format!(
                "slot table has {} entries for {members} slots",
                self.slots.len()
            ));
        }
        if self.slot != SPARE_SLOT && self.slot >= self.members {
            return Err(format!(
                "slot {} is outside 0..{members} and not the spare marker",
                self.slot
            ));
        }
        if !self
            .level
            .copies_fit(u64::from(self.copies), u64::from(self.members))
        {
            return Err(format!(
                "{} copies is not valid for {:?} with {members} members",
                self.copies, self.level
            ));
        }
        if !self.chunk.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&self.chunk) {
            return Err(format!(
                "chunk size {} is not a power of two in {MIN_CHUNK}..={MAX_CHUNK}",
                self.chunk
            ));
        }
        let first_free = SB_OFFSETS[1] + SUPERBLOCK_SIZE as u64;
        if self.data_offset < first_free || !self.data_offset.is_multiple_of(ALIGN) {
            return Err(format!(
                "data offset {} is not a multiple of {ALIGN} at or after {first_free}",
                self.data_offset
            ));
        }
        if self
            .data_offset
            .checked_add(self.data_size)
            .and_then(|end| end.checked_add(END_COPIES_LEN + ALIGN))
            .is_none()
        {
            return Err(format!(
                "data area {}+{} overflows",
                self.data_offset, self.data_size
            ));
        }
        if self.group_size == 0 || !self.group_size.is_multiple_of(self.chunk) {
            return Err(format!(
                "group size {} is not a positive multiple of the chunk size {}",
                self.group_size, self.chunk
            ));
        }
        let expected_groups = self.data_size / self.group_size;
        if expected_groups > MAX_GROUPS as u64 {
            return Err(format!(
                "data size {} makes {expected_groups} groups of {} bytes, more than {MAX_GROUPS}",
                self.data_size, self.group_size
            ));
        }
        if self.groups.len() as u64 != expected_groups {
            return Err(format!(
                "group table has {} entries but data size / group size is {expected_groups}",
                self.groups.len()
            ));
        }
        self.validate_reshape()
    }

    /// The reshape record agrees with the feature bit, the group table and
    /// the array's geometry.
    fn validate_reshape(&self) -> Result<(), String> {
        let flagged = self.features.incompat & FEATURE_RESHAPE != 0;
        let Some(r) = &self.reshape else {
            return match flagged {
                true => Err("the reshape feature is set without a reshape record".into()),
                false => Ok(()),
            };
        };
        if !flagged {
            return Err("a reshape record without the reshape feature".into());
        }
        if self.version < FEATURE_WORDS_VERSION {
            return Err(format!(
                "version {} has no room for a reshape record",
                self.version
            ));
        }
        let from = &r.from;
        if from.members == 0 || from.members > self.members {
            return Err(format!(
                "reshape from {} members, but the array has {} slots",
                from.members, self.members
            ));
        }
        if !from
            .level
            .copies_fit(u64::from(from.copies), u64::from(from.members))
        {
            return Err(format!(
                "reshape from {} copies is not valid for {:?} with {} members",
                from.copies, from.level, from.members
            ));
        }
        if !from.chunk.is_power_of_two()
            || !(MIN_CHUNK..=MAX_CHUNK).contains(&from.chunk)
            || !self.group_size.is_multiple_of(from.chunk)
        {
            return Err(format!(
                "reshape from chunk size {} does not fit group size {}",
                from.chunk, self.group_size
            ));
        }
        if r.pending.len() != self.groups.len() {
            return Err(format!(
                "reshape marks {} groups, the table has {}",
                r.pending.len(),
                self.groups.len()
            ));
        }
        if let Some(g) = r
            .pending
            .iter()
            .enumerate()
            .position(|(g, &p)| p && self.groups[g] == GroupProfile::Unallocated)
        {
            return Err(format!("reshape marks unallocated group {g} as pending"));
        }
        match self.groups.get(r.staging as usize) {
            Some(GroupProfile::Unallocated) => {}
            _ => {
                return Err(format!(
                    "reshape staging slice {} is not an unallocated group",
                    r.staging
                ))
            }
        }
        if let Some(g) = r.staged {
            if !r.is_pending(g) {
                return Err(format!("reshape has group {g} staged but not pending"));
            }
        }
        Ok(())
    }

    /// Whether this superblock's members carry the end copies (version 2 on).
    pub fn has_end_copies(&self) -> bool {
        self.version >= 2
    }

    /// Smallest member length that holds this superblock's data area (and,
    /// from version 2, the end copies after it).
    pub fn min_member_len(&self) -> u64 {
        let data_end = self.data_offset.saturating_add(self.data_size);
        if self.has_end_copies() {
            data_end
                .saturating_add(END_COPIES_LEN)
                .div_ceil(ALIGN)
                .saturating_mul(ALIGN)
        } else {
            data_end
        }
    }

    /// Why this superblock does not fit a member of `len` bytes, if it does not.
    fn misfit(&self, len: u64) -> Option<String> {
        let data_end = self.data_offset.saturating_add(self.data_size);
        if data_end > len {
            return Some(format!(
                "data area ends at {data_end} but the member has {len} bytes"
            ));
        }
        if self.has_end_copies() && len < self.min_member_len() {
            return Some(format!(
                "data area ends at {data_end}, inside the end superblock copies at {}",
                member_end(len).saturating_sub(END_COPIES_LEN)
            ));
        }
        None
    }

    /// Read every copy and return the valid one with the highest event count
    /// (the earliest copy on a tie), with a verdict per copy.
    ///
    /// The front copies are read first. When the best of them is version 1,
    /// the end of the member is that array's data and is not looked at.
    /// Otherwise the end copies (when the member has room for them) are
    /// candidates too, but only those of the same array and member as a
    /// valid front copy: an end copy left behind by an earlier use of the
    /// device must not win over the front. With no valid front copy, the
    /// end copies alone identify the member (a version 1 superblock there
    /// is not one of ours and counts as invalid).
    ///
    /// With no valid copy: `NotMember` if none has the magic; otherwise the
    /// most telling failure: `Version`, then `Invalid`, then `Io`, then `Corrupt`.
    pub fn read_from(member: &dyn Member) -> Result<(Superblock, ReadVerdict), SuperblockError> {
        let name = member.name();
        let read_copy = |offset: u64| -> Result<Superblock, SuperblockError> {
            let mut buf = vec![0u8; SUPERBLOCK_SIZE];
            member
                .read_at(&mut buf, offset)
                .map_err(|e| SuperblockError::Io(name.clone(), e))?;
            Superblock::decode(&buf, &name)
        };
        let mut decoded: Vec<Result<Superblock, SuperblockError>> =
            SB_OFFSETS.iter().map(|&offset| read_copy(offset)).collect();
        let front = newest(decoded.iter().flatten()).cloned();
        let read_end = front.as_ref().is_none_or(Superblock::has_end_copies);
        let ends = end_offsets(member.len()).filter(|_| read_end);
        if let Some(offsets) = ends {
            for offset in offsets {
                let copy = read_copy(offset).and_then(|sb| {
                    if sb.has_end_copies() {
                        Ok(sb)
                    } else {
                        Err(SuperblockError::Invalid {
                            member: name.clone(),
                            what: format!(
                                "version {} superblock at end offset {offset}, where that version keeps none",
                                sb.version
                            ),
                        })
                    }
                });
                decoded.push(copy);
            }
        }
        let same_identity = |a: &Superblock, b: &Superblock| {
            a.array_uuid == b.array_uuid && a.member_uuid == b.member_uuid
        };
        // End copies that disagree with the front about whose member this is
        // are left out before the newest is picked.
        let best = newest(
            decoded
                .iter()
                .flatten()
                .filter(|sb| front.as_ref().is_none_or(|f| same_identity(sb, f))),
        )
        .cloned();
        let state = |i: usize| -> CopyState {
            match decoded.get(i) {
                None => CopyState::NotPresent,
                Some(Ok(sb)) => match &best {
                    Some(b) if same_identity(sb, b) && sb.events == b.events => CopyState::Good,
                    _ => CopyState::Stale,
                },
                Some(Err(SuperblockError::NotMember(_))) => CopyState::Missing,
                Some(Err(SuperblockError::Corrupt { .. })) => CopyState::BadChecksum,
                Some(Err(_)) => CopyState::Invalid,
            }
        };
        let verdict = ReadVerdict {
            copies: [0, 1, 2, 3].map(state),
        };
        if let Some(sb) = best {
            if let Some(what) = sb.misfit(member.len()) {
                return Err(SuperblockError::Invalid { member: name, what });
            }
            return Ok((sb, verdict));
        }
        let rank = |e: &SuperblockError| match e {
            SuperblockError::Version { .. } | SuperblockError::Feature { .. } => 0,
            SuperblockError::Invalid { .. } => 1,
            SuperblockError::Io(..) => 2,
            SuperblockError::Corrupt { .. } => 3,
            SuperblockError::NotMember(_) => 4,
        };
        let worst = decoded
            .into_iter()
            .filter_map(Result::err)
            .min_by_key(|e| rank(e));
        Err(worst.unwrap_or(SuperblockError::NotMember(name)))
    }

    /// Write every copy this superblock's version keeps, each followed by a
    /// sync, so at most one is ever in flight: front copy 0, front copy 1,
    /// then (version 2 on) end copy 0 and end copy 1.
    ///
    /// A version 1 superblock is written as version 1, front copies only:
    /// its array's data area may run to the end of the member, and raidfs
    /// never moves an existing array to a new version behind its owner's
    /// back. Refuses an invalid superblock, and one whose data area would
    /// overlap the end copies on this member.
    pub fn write_to(&self, member: &dyn Member) -> std::io::Result<()> {
        let name = member.name();
        let refuse = |what: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!("{name}: refusing to write an invalid superblock: {what}"),
            )
        };
        self.validate().map_err(refuse)?;
        SUPERBLOCK_FEATURES
            .refuse_write(&self.features)
            .map_err(refuse)?;
        if let Some(what) = self.misfit(member.len()) {
            return Err(refuse(what));
        }
        let ends = if self.has_end_copies() {
            end_offsets(member.len())
                .ok_or_else(|| refuse("the member has no room for the end copies".into()))?
                .to_vec()
        } else {
            Vec::new()
        };
        let block = self.encode();
        for (&offset, copy) in SB_OFFSETS.iter().chain(&ends).zip(COPY_NAMES) {
            let context = |what: &str, e: std::io::Error| {
                std::io::Error::new(
                    e.kind(),
                    format!("{name}: {what} superblock copy {copy} (offset {offset}): {e}"),
                )
            };
            member
                .write_at(&block, offset)
                .map_err(|e| context("writing", e))?;
            member.sync().map_err(|e| context("syncing", e))?;
        }
        Ok(())
    }

    /// Number of allocation groups.
    pub fn group_count(&self) -> usize {
        self.groups.len()
    }

    /// Whether the partial parity log feature is set. `create` sets it on
    /// RAID5 only; the array engine keeps a log when its personality does.
    pub fn has_ppl(&self) -> bool {
        self.features.ro_compat & FEATURE_PPL != 0
    }
}

/// The features the one `features` word of versions 1 and 2 holds: its PPL
/// bit is the ro-compat PPL feature, any other bit an incompat one (those
/// versions refused every bit they did not know).
pub fn features_from_one_word(word: u64) -> Features {
    Features {
        compat: 0,
        ro_compat: word & FEATURE_PPL,
        incompat: word & !FEATURE_PPL,
    }
}

/// The one word versions 1 and 2 store for `features`;
/// [`Superblock::validate`] refuses features it cannot hold.
pub fn one_word(features: &Features) -> u64 {
    features.ro_compat & FEATURE_PPL | features.incompat
}
