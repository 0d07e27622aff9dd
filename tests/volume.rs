//! The volume's start-up and shut-down order: a read-write volume marks its
//! array dirty while open and clean when closed (or dropped), an abandoned
//! one leaves it dirty, a read-only one writes nothing at all, and the
//! background work (here a resync) starts only once the filesystem is open.

mod common;

use std::ffi::OsStr;
use std::sync::Arc;

use common::members::{faulty, named};
use raidfs::array::{
    assemble, create, Array, AssembleOptions, CreateSpec, SyncAction, GROUP_SHIFT,
};
use raidfs::fs::{format_array, Caller, FormatOptions, FsOptions, ROOT_INO};
use raidfs::geometry::{Layout, Level};
use raidfs::member::faulty::FaultyMember;
use raidfs::superblock::GroupProfile;
use raidfs::volume::{Volume, VolumeError};

const MEMBER_SIZE: u64 = 64 << 20;
const CLEAN: &str = "clean";
const DIRTY: &str = "active (dirty)";

fn spec() -> CreateSpec {
    CreateSpec {
        level: Level::Raid5,
        layout: Layout::LeftSymmetric,
        chunk: 64 << 10,
        copies: 1,
        name: "vol".into(),
        ppl: false,
    }
}

/// Three members with an empty filesystem on them.
fn formatted() -> Vec<FaultyMember> {
    let ms = faulty(3, MEMBER_SIZE, "v");
    let array = Arc::new(create(named(&ms), &spec()).expect("create array"));
    format_array(array, &FormatOptions::default()).expect("format");
    ms
}

fn assemble_rw(ms: &[FaultyMember]) -> Arc<Array> {
    Arc::new(
        assemble(named(ms), AssembleOptions::default())
            .expect("assemble")
            .array,
    )
}

fn state_on_disk(ms: &[FaultyMember]) -> String {
    assemble_ro(ms).status().state
}

fn events_on_disk(ms: &[FaultyMember]) -> u64 {
    assemble_ro(ms).status().events
}

fn assemble_ro(ms: &[FaultyMember]) -> Arc<Array> {
    Arc::new(
        assemble(
            named(ms),
            AssembleOptions {
                read_only: true,
                ..AssembleOptions::default()
            },
        )
        .expect("assemble read-only")
        .array,
    )
}

fn write_file(volume: &Volume, name: &str, data: &[u8]) {
    let fs = volume.fs();
    let ino = fs
        .mknod(&Caller::root(), ROOT_INO, OsStr::new(name), 0o100644, 0, 0)
        .expect("create file")
        .ino;
    fs.write(ino, 0, data).expect("write file");
}

#[test]
fn a_read_write_volume_is_dirty_while_open_and_clean_once_closed() {
    let ms = formatted();
    let volume = Volume::open(assemble_rw(&ms), FsOptions::default()).expect("open");
    assert_eq!(volume.array().status().state, DIRTY);
    write_file(&volume, "f", &[7u8; 100_000]);
    volume.close().expect("close");
    assert_eq!(state_on_disk(&ms), CLEAN);
}

#[test]
fn a_volume_dropped_without_close_still_ends_clean() {
    let ms = formatted();
    let volume = Volume::open(assemble_rw(&ms), FsOptions::default()).expect("open");
    write_file(&volume, "f", &[7u8; 100_000]);
    drop(volume);
    assert_eq!(state_on_disk(&ms), CLEAN);
    let volume = Volume::open(assemble_rw(&ms), FsOptions::default()).expect("reopen");
    let ino = volume
        .fs()
        .lookup(&Caller::root(), ROOT_INO, OsStr::new("f"))
        .expect("the file was committed")
        .ino;
    assert_eq!(
        volume.fs().read(ino, 0, 200_000).expect("read"),
        [7u8; 100_000]
    );
    volume.close().expect("close");
}

#[test]
fn an_abandoned_volume_leaves_the_array_dirty() {
    let ms = formatted();
    let volume = Volume::open(assemble_rw(&ms), FsOptions::default()).expect("open");
    write_file(&volume, "f", &[7u8; 100_000]);
    volume.abandon();
    assert_eq!(state_on_disk(&ms), DIRTY);
}

#[test]
fn a_read_only_volume_writes_nothing() {
    let ms = formatted();
    let events = events_on_disk(&ms);
    for m in &ms {
        m.reset_counts();
    }
    let volume = Volume::open(
        assemble_ro(&ms),
        FsOptions {
            read_only: true,
            ..FsOptions::default()
        },
    )
    .expect("open read-only");
    assert!(volume.read_only());
    assert_eq!(volume.array().status().state, CLEAN);
    assert!(volume
        .fs()
        .lookup(&Caller::root(), ROOT_INO, OsStr::new("absent"))
        .is_err());
    volume.close().expect("close read-only");
    for (i, m) in ms.iter().enumerate() {
        assert_eq!(m.counts().writes, 0, "member {i} was written");
    }
    assert_eq!(events_on_disk(&ms), events, "no event recorded");
    assert_eq!(state_on_disk(&ms), CLEAN);
}

/// A crashed session's array: dirty, with dirty regions for a resync. The
/// first allocated group's first bytes are written over with what they
/// hold (a filesystem on the array stays intact); an array with no group
/// gets one.
fn crashed_dirty(ms: &[FaultyMember]) {
    let array = assemble_rw(ms);
    let group = match array.groups().first() {
        Some(&(group, _)) => group as u64,
        None => array.allocate_group(GroupProfile::Data).expect("group") as u64,
    };
    let base = group << GROUP_SHIFT;
    let mut bytes = vec![0u8; 256 << 10];
    array.read(base, &mut bytes).expect("read");
    array.mark_dirty().expect("dirty");
    array.write(base, &bytes).expect("write");
    assert!(array.dirty_regions().0 >= 1);
}

#[test]
fn the_background_work_starts_only_once_the_filesystem_is_open() {
    // Unformatted: the filesystem does not open, so no resync may start,
    // and the array stays dirty for the next assembly to resync.
    let ms = faulty(3, MEMBER_SIZE, "u");
    drop(create(named(&ms), &spec()).expect("create array"));
    crashed_dirty(&ms);
    let array = assemble_rw(&ms);
    let dirty = array.dirty_regions();
    match Volume::open(Arc::clone(&array), FsOptions::default()) {
        Err(VolumeError::Open(_)) => {}
        Err(e) => panic!("expected the filesystem open to fail, got {e}"),
        Ok(_) => panic!("an unformatted array opened as a filesystem"),
    }
    assert!(array.sync_progress().is_none(), "a resync started");
    assert!(array.last_sync_result().is_none(), "a resync ran");
    assert_eq!(array.dirty_regions(), dirty);
    assert_eq!(array.status().state, DIRTY);
    drop(array);

    // Formatted: the same crash is resynced once the volume is open.
    let ms = formatted();
    crashed_dirty(&ms);
    let volume = Volume::open(assemble_rw(&ms), FsOptions::default()).expect("open");
    volume.array().wait_background();
    let result = volume.array().last_sync_result().expect("a resync ran");
    assert!(
        result.completed && result.action == SyncAction::Resync,
        "{result:?}"
    );
    volume.close().expect("close");
    assert_eq!(state_on_disk(&ms), CLEAN);
}

#[test]
fn a_resync_stopped_by_the_close_stays_due_for_the_next_assembly() {
    // md keeps its resync point across a stop; here the array stays dirty
    // with its dirty regions, so the next assembly resyncs them.
    let ms = formatted();
    crashed_dirty(&ms);
    let array = assemble_rw(&ms);
    let dirty = array.dirty_regions();
    // Slow enough that the resync cannot finish before the close stops it.
    array.set_speed_limits(Some(0), Some(4096));
    let volume = Volume::open(array, FsOptions::default()).expect("open");
    let running = volume.array().sync_progress().expect("a resync runs");
    assert_eq!(running.action, SyncAction::Resync);
    volume.close().expect("close");
    assert_eq!(
        state_on_disk(&ms),
        DIRTY,
        "the stopped resync was forgotten"
    );

    let array = assemble_rw(&ms);
    // The crash's regions are still marked (the open's own writes add more).
    assert!(
        array.dirty_regions().0 >= dirty.0,
        "{:?}",
        array.dirty_regions()
    );
    let volume = Volume::open(array, FsOptions::default()).expect("reopen");
    volume.array().wait_background();
    let result = volume.array().last_sync_result().expect("a resync ran");
    assert!(
        result.completed && result.action == SyncAction::Resync,
        "{result:?}"
    );
    volume.close().expect("close");
    assert_eq!(state_on_disk(&ms), CLEAN);
}
