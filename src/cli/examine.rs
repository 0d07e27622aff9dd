//! `raidfs examine`: print a member's superblock the way `mdadm --examine`
//! does, with what was found at each of the four superblock copies.

use crate::array::data_geometry;
use crate::superblock::{
    ArrayState, CopyState, GroupProfile, SlotState, Superblock, COPY_NAMES, SPARE_SLOT,
    SUPERBLOCK_FEATURES,
};
use serde::Serialize;
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct ExamineArgs {
    /// Print JSON instead of text.
    #[arg(long)]
    pub json: bool,
    /// Member image files, block devices or NBD URIs.
    #[arg(required = true)]
    pub members: Vec<PathBuf>,
}

#[derive(Serialize)]
struct Examined {
    member: String,
    magic: String,
    version: u32,
    array_uuid: String,
    member_uuid: String,
    name: String,
    level: String,
    layout: String,
    /// The names of `detail --json` for the same things (docs/status-json.md).
    chunk: u64,
    raid_devices: u32,
    copies: u32,
    data_offset: u64,
    member_size: u64,
    group_size: u64,
    groups_total: usize,
    groups_metadata: usize,
    groups_data: usize,
    array_size: u64,
    events: u64,
    state: String,
    role: String,
    slots: Vec<String>,
    recovery_offset: Option<u64>,
    /// Behind another member of the same array examined with it (fewer
    /// events): the array went on without this member.
    stale: bool,
    /// The version 1/2 feature word (2: partial parity log), kept for scripts.
    features: u64,
    compat_features: u64,
    ro_compat_features: u64,
    incompat_features: u64,
    /// The three words by name (`compat: -; ro_compat: ppl; incompat: -`),
    /// unknown bits as numbers.
    feature_names: String,
    /// A paused check or repair: where it resumes.
    scrub_checkpoint: Option<ScrubCheckpointJson>,
    created: u64,
    updated: u64,
    checksum: [String; 2],
    superblock_copies: SuperblockCopies,
    /// The reshape under way (`raidfs grow`), or null.
    reshape: Option<ExaminedReshape>,
}

/// The superblock's reshape record, as `examine` shows it.
#[derive(Serialize)]
struct ExaminedReshape {
    from_level: String,
    from_raid_devices: u32,
    groups_pending: usize,
    staging_group: u32,
    staged_group: Option<u32>,
}

#[derive(Serialize)]
struct ScrubCheckpointJson {
    /// `check` or `repair`.
    action: &'static str,
    /// Member offset below which it is done.
    offset: u64,
}

/// What each of the four superblock copies held (`CopyState::describe`).
#[derive(Serialize)]
struct SuperblockCopies {
    front_0: &'static str,
    front_1: &'static str,
    end_0: &'static str,
    end_1: &'static str,
}

fn slot_char(s: SlotState) -> char {
    match s {
        SlotState::Active => 'A',
        SlotState::Faulty => 'F',
        SlotState::Rebuilding => 'R',
        SlotState::Missing => '.',
    }
}

/// The front copies in the words of the `checksum` field, kept as releases
/// before the end copies printed it.
fn verdict(v: CopyState) -> String {
    match v {
        CopyState::Good | CopyState::Stale => "good".into(),
        CopyState::Missing | CopyState::NotPresent => "absent".into(),
        CopyState::BadChecksum | CopyState::Invalid => "BAD (checksum mismatch)".into(),
    }
}

fn describe(path: &str, sb: &Superblock, copies: [CopyState; 4]) -> Examined {
    let array_size = data_geometry(sb)
        .map(|g| g.capacity(sb.group_size) * sb.groups.len() as u64)
        .unwrap_or(0);
    Examined {
        member: path.to_string(),
        magic: "RAIDFS".into(),
        version: sb.version,
        array_uuid: sb.array_uuid.to_string(),
        member_uuid: sb.member_uuid.to_string(),
        name: sb.name.clone(),
        reshape: sb.reshape.as_ref().map(|r| ExaminedReshape {
            from_level: r.from.level.to_string(),
            from_raid_devices: r.from.members,
            groups_pending: r.pending_count(),
            staging_group: r.staging,
            staged_group: r.staged,
        }),
        level: sb.level.to_string(),
        layout: sb.level.layout_shown(sb.layout, sb.copies),
        chunk: sb.chunk,
        raid_devices: sb.members,
        copies: sb.copies,
        data_offset: sb.data_offset,
        member_size: sb.data_size,
        group_size: sb.group_size,
        groups_total: sb.groups.len(),
        groups_metadata: sb
            .groups
            .iter()
            .filter(|g| **g == GroupProfile::Metadata)
            .count(),
        groups_data: sb
            .groups
            .iter()
            .filter(|g| **g == GroupProfile::Data)
            .count(),
        array_size,
        events: sb.events,
        state: match sb.state {
            ArrayState::Clean => "clean".into(),
            ArrayState::Dirty => "active (dirty)".into(),
        },
        role: if sb.slot == SPARE_SLOT {
            "spare".into()
        } else {
            format!("Active device {}", sb.slot)
        },
        slots: sb
            .slots
            .iter()
            .map(|s| format!("{s:?}").to_lowercase())
            .collect(),
        recovery_offset: (sb.recovery_offset != u64::MAX).then_some(sb.recovery_offset),
        stale: false,
        features: crate::superblock::one_word(&sb.features),
        compat_features: sb.features.compat,
        ro_compat_features: sb.features.ro_compat,
        incompat_features: sb.features.incompat,
        feature_names: SUPERBLOCK_FEATURES.describe(&sb.features),
        scrub_checkpoint: sb.scrub.map(|c| ScrubCheckpointJson {
            action: if c.repair { "repair" } else { "check" },
            offset: c.offset,
        }),
        created: sb.ctime,
        updated: sb.utime,
        checksum: [verdict(copies[0]), verdict(copies[1])],
        superblock_copies: SuperblockCopies {
            front_0: copies[0].describe(),
            front_1: copies[1].describe(),
            end_0: copies[2].describe(),
            end_1: copies[3].describe(),
        },
    }
}

fn print_text(e: &Examined, sb: &Superblock, copies: [CopyState; 4]) {
    let states: String = sb.slots.iter().map(|s| slot_char(*s)).collect();
    println!("{}:", e.member);
    println!("          Magic : RAIDFS");
    println!("        Version : {}", e.version);
    println!("     Array UUID : {}", e.array_uuid);
    println!(
        "           Name : {}",
        if e.name.is_empty() { "(none)" } else { &e.name }
    );
    println!("  Creation Time : {}", utc(e.created));
    println!("     Raid Level : {}", e.level);
    println!("   Raid Devices : {}", e.raid_devices);
    if let Some(r) = &e.reshape {
        println!(
            "        Reshape : from {} on {} members, {} groups to move{}",
            r.from_level,
            r.from_raid_devices,
            r.groups_pending,
            r.staged_group
                .map(|g| format!(" (group {g} at staging group {})", r.staging_group))
                .unwrap_or_default()
        );
    }
    if sb.level == crate::geometry::Level::Raid10 {
        println!("         Copies : {}", e.copies);
    }
    println!(
        "     Array Size : {} bytes ({})",
        e.array_size,
        super::create::human(e.array_size)
    );
    println!(
        "  Used Dev Size : {} bytes ({})",
        e.member_size,
        super::create::human(e.member_size)
    );
    println!("    Data Offset : {} bytes", e.data_offset);
    println!(
        "         Groups : {} of {} bytes ({} metadata, {} data allocated)",
        e.groups_total, e.group_size, e.groups_metadata, e.groups_data
    );
    println!("    Device UUID : {}", e.member_uuid);
    println!("    Update Time : {}", utc(e.updated));
    let found: Vec<String> = COPY_NAMES
        .iter()
        .zip(copies)
        .map(|(name, c)| format!("{name} {}", c.describe()))
        .collect();
    println!("Superblock copies : {}", found.join(", "));
    println!("         Events : {}", e.events);
    if !e.layout.is_empty() {
        println!("         Layout : {}", e.layout);
    }
    println!("     Chunk Size : {}K", e.chunk / 1024);
    if let Some(r) = e.recovery_offset {
        println!("Recovery Offset : {r} bytes");
    }
    println!("       Features : {}", e.feature_names);
    if let Some(c) = &e.scrub_checkpoint {
        println!(
            "Scrub Checkpoint : {} paused at member offset {} bytes",
            c.action, c.offset
        );
    }
    println!("    Device Role : {}", e.role);
    println!("    Array State : {states} ('A' == active, '.' == missing, 'F' == faulty, 'R' == rebuilding)");
    println!("          State : {}", e.state);
    if e.stale {
        println!(
            "          Stale : yes: another member of this array has more events; the array went on without this one"
        );
    }
}

/// Mark the members that are behind another member of their array.
fn mark_stale(all: &mut [(Examined, Superblock, [CopyState; 4])]) {
    let newest = |uuid: &str, all: &[(Examined, Superblock, [CopyState; 4])]| {
        all.iter()
            .filter(|(e, ..)| e.array_uuid == uuid)
            .map(|(e, ..)| e.events)
            .max()
            .unwrap_or(0)
    };
    let newest: Vec<u64> = all
        .iter()
        .map(|(e, ..)| newest(&e.array_uuid, all))
        .collect();
    for ((e, ..), newest) in all.iter_mut().zip(newest) {
        e.stale = e.events < newest;
    }
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (civil-from-days).
pub(crate) fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

pub fn run(args: ExamineArgs) -> i32 {
    let mut code = 0;
    let mut all = Vec::new();
    for path in &args.members {
        let name = path.display().to_string();
        let member = match crate::member::open::peek(path) {
            Ok(m) => m,
            Err(e) => {
                code = super::fail(format!("{name}: {e}"));
                continue;
            }
        };
        match Superblock::read_from(member.as_ref()) {
            Ok((sb, verdict)) => {
                all.push((describe(&name, &sb, verdict.copies), sb, verdict.copies))
            }
            Err(e) => code = super::fail(e),
        }
    }
    mark_stale(&mut all);
    if !args.json {
        for (e, sb, copies) in &all {
            print_text(e, sb, *copies);
        }
        return code;
    }
    let all: Vec<&Examined> = all.iter().map(|(e, ..)| e).collect();
    {
        match serde_json::to_string_pretty(&all) {
            Ok(s) => println!("{s}"),
            Err(e) => code = super::fail(e),
        }
    }
    code
}
