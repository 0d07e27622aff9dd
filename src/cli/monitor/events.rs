//! What `raidfs monitor` raises: the events (mdadm's names, plus ZED-like
//! checksum and unrecoverable-error events) and the [`Tracker`] that finds
//! them by comparing each pass's array reports with the last pass's, per
//! array UUID, as mdadm's `--monitor` compares md's state between polls.
//!
//! At the first pass only the standing conditions are raised
//! (DegradedArray, SparesMissing, and DeviceDisappeared for mounts whose
//! daemon is already gone); arrays that appear later raise NewArray first.
//! Within a pass an array's events come in this order: members that failed,
//! background work (started, marks, finished), members that became active,
//! then error counters.

use crate::array::MemberState;
use crate::control::{ArrayReport, SyncReport};
use std::collections::{BTreeMap, BTreeSet};

use super::super::status::InactiveMount;

/// The event names, as `--program` receives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Fail,
    FailSpare,
    DegradedArray,
    SpareActive,
    SparesMissing,
    RebuildStarted,
    /// Progress crossed 20, 40, 60 or 80 percent.
    Rebuild(u8),
    RebuildFinished,
    ChecksumError,
    UnrecoverableError,
    DeviceDisappeared,
    NewArray,
    TestMessage,
}

/// syslog priorities, as mdadm gives them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Critical,
    Warning,
    Info,
}

impl Kind {
    pub fn name(self) -> String {
        match self {
            Kind::Fail => "Fail".into(),
            Kind::FailSpare => "FailSpare".into(),
            Kind::DegradedArray => "DegradedArray".into(),
            Kind::SpareActive => "SpareActive".into(),
            Kind::SparesMissing => "SparesMissing".into(),
            Kind::RebuildStarted => "RebuildStarted".into(),
            Kind::Rebuild(mark) => format!("Rebuild{mark}"),
            Kind::RebuildFinished => "RebuildFinished".into(),
            Kind::ChecksumError => "ChecksumError".into(),
            Kind::UnrecoverableError => "UnrecoverableError".into(),
            Kind::DeviceDisappeared => "DeviceDisappeared".into(),
            Kind::NewArray => "NewArray".into(),
            Kind::TestMessage => "TestMessage".into(),
        }
    }

    /// mdadm logs failures, degradation and vanished arrays as critical,
    /// rebuild progress and missing spares as warnings, the rest as
    /// information; data no copy could serve is critical too, a bad copy
    /// that was healed a warning.
    pub fn severity(self) -> Severity {
        match self {
            Kind::Fail
            | Kind::FailSpare
            | Kind::DegradedArray
            | Kind::DeviceDisappeared
            | Kind::UnrecoverableError => Severity::Critical,
            Kind::SparesMissing
            | Kind::RebuildStarted
            | Kind::Rebuild(_)
            | Kind::RebuildFinished
            | Kind::ChecksumError => Severity::Warning,
            Kind::SpareActive | Kind::NewArray | Kind::TestMessage => Severity::Info,
        }
    }

    /// Whether `--mail` sends it: as mdadm, failures, degradation, missing
    /// spares and the test message; also a vanished array and data errors.
    pub fn mailed(self) -> bool {
        matches!(
            self,
            Kind::Fail
                | Kind::FailSpare
                | Kind::DegradedArray
                | Kind::SparesMissing
                | Kind::TestMessage
                | Kind::DeviceDisappeared
                | Kind::ChecksumError
                | Kind::UnrecoverableError
        )
    }
}

/// One event on one mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Event {
    pub kind: Kind,
    pub mount_point: String,
    /// The member concerned (mdadm's component device), if any.
    pub member: Option<String>,
    /// The file concerned (data errors), when known.
    pub file: Option<String>,
    /// The array's UUID, when known (a dead mount cannot be asked).
    pub uuid: Option<String>,
    /// A sentence saying what happened, for logs and mail.
    pub message: String,
}

impl Event {
    fn new(kind: Kind, mount_point: &str, uuid: Option<&str>, message: String) -> Event {
        Event {
            kind,
            mount_point: mount_point.to_string(),
            member: None,
            file: None,
            uuid: uuid.map(str::to_string),
            message,
        }
    }

    fn on(kind: Kind, r: &ArrayReport, message: String) -> Event {
        Event::new(kind, &r.mount_point, Some(&r.uuid), message)
    }

    fn member(mut self, member: &str) -> Event {
        self.member = Some(member.to_string());
        self
    }

    fn file(mut self, file: Option<String>) -> Event {
        self.file = file;
        self
    }

    /// The arguments `--program` gets after the command, mdadm's order
    /// (event, mount point, member) with the file last: `ChecksumError
    /// MOUNT MEMBER [FILE]`, `UnrecoverableError MOUNT [FILE]`.
    pub fn arguments(&self) -> Vec<String> {
        let mut args = vec![self.kind.name(), self.mount_point.clone()];
        args.extend(self.member.clone());
        args.extend(self.file.clone());
        args
    }
}

/// The 20% marks of background work: Rebuild20 .. Rebuild80.
const MARKS: [u8; 4] = [20, 40, 60, 80];

/// Marks at or below `per_mille` (tenths of a percent).
fn marks_reached(per_mille: u64) -> usize {
    MARKS
        .iter()
        .filter(|&&m| per_mille >= u64::from(m) * 10)
        .count()
}

/// An array as the last pass saw it.
struct Seen {
    report: ArrayReport,
    /// Marks of the running background work already raised (or passed
    /// before the monitor first saw it).
    marks: usize,
    /// Members (slot, name) that became active while the work that brought
    /// them in was still reported running: raised after it finishes.
    held: Vec<(usize, String)>,
}

/// The state between passes, and the comparison that yields events.
#[derive(Default)]
pub struct Tracker {
    arrays: BTreeMap<String, Seen>,
    /// Dead mounts already announced, by mount point.
    dead: BTreeSet<String>,
    passes: u64,
}

/// What the configuration expects of one array.
pub trait Expectations {
    /// Hot spares the array should have (mdadm.conf's `spares=`).
    fn spares(&self, uuid: &str) -> usize;
}

impl Tracker {
    /// Compare one pass's reports and dead mounts with the last pass's.
    /// `unanswered`: mount points still mounted and alive whose daemon did
    /// not answer this time; their arrays are kept as they were.
    pub fn pass(
        &mut self,
        reports: &[ArrayReport],
        inactive: &[InactiveMount],
        unanswered: &[String],
        expect: &dyn Expectations,
    ) -> Vec<Event> {
        let first = self.passes == 0;
        self.passes += 1;
        let mut events = Vec::new();
        for r in reports {
            match self.arrays.get_mut(&r.uuid) {
                Some(seen) if seen.report.daemon_pid == r.daemon_pid => {
                    events.extend(changes(seen, r));
                    seen.report = r.clone();
                }
                _ => {
                    // New, or served by a new daemon (remounted between
                    // passes): its counters started again.
                    events.extend(arrived(r, first, expect));
                    let marks = r.sync.as_ref().map_or(0, |s| marks_reached(s.per_mille()));
                    self.arrays.insert(
                        r.uuid.clone(),
                        Seen {
                            report: r.clone(),
                            marks,
                            held: Vec::new(),
                        },
                    );
                }
            }
        }
        let gone: Vec<String> = self
            .arrays
            .iter()
            .filter(|(uuid, seen)| {
                !reports.iter().any(|r| &r.uuid == *uuid)
                    && !unanswered.contains(&seen.report.mount_point)
            })
            .map(|(uuid, _)| uuid)
            .cloned()
            .collect();
        for uuid in gone {
            let Some(seen) = self.arrays.remove(&uuid) else {
                continue;
            };
            let mp = &seen.report.mount_point;
            let message = match inactive.iter().find(|d| &d.mount_point == mp) {
                Some(dead) => {
                    self.dead.insert(mp.clone());
                    format!("{mp} is dead: {}", dead.reason)
                }
                None => format!("{mp} is no longer mounted"),
            };
            events.push(Event::new(
                Kind::DeviceDisappeared,
                mp,
                Some(&uuid),
                message,
            ));
        }
        for dead in inactive {
            if self.dead.insert(dead.mount_point.clone()) {
                events.push(Event::new(
                    Kind::DeviceDisappeared,
                    &dead.mount_point,
                    None,
                    format!("{} is dead: {}", dead.mount_point, dead.reason),
                ));
            }
        }
        // A dead mount that was taken down may come back as a new mount.
        self.dead
            .retain(|mp| inactive.iter().any(|d| &d.mount_point == mp));
        events
    }

    /// TestMessage for every array now served.
    pub fn test_messages(reports: &[ArrayReport]) -> Vec<Event> {
        reports
            .iter()
            .map(|r| {
                Event::on(
                    Kind::TestMessage,
                    r,
                    format!(
                        "test message from raidfs monitor for {} ({})",
                        r.mount_point, r.state
                    ),
                )
            })
            .collect()
    }
}

/// The standing conditions of an array seen for the first time.
fn arrived(r: &ArrayReport, first_pass: bool, expect: &dyn Expectations) -> Vec<Event> {
    let mut events = Vec::new();
    if !first_pass {
        events.push(Event::on(
            Kind::NewArray,
            r,
            format!("{} {} mounted on {}", r.level, r.uuid, r.mount_point),
        ));
    }
    if r.degraded {
        events.push(Event::on(
            Kind::DegradedArray,
            r,
            format!(
                "{} is degraded: {} of {} members active {}",
                r.mount_point, r.active_devices, r.raid_devices, r.map
            ),
        ));
    }
    let wanted = expect.spares(&r.uuid);
    if r.spares.len() < wanted {
        events.push(Event::on(
            Kind::SparesMissing,
            r,
            format!(
                "{} has {} hot spare(s); the configuration expects {wanted}",
                r.mount_point,
                r.spares.len()
            ),
        ));
    }
    events
}

fn same_run(a: &SyncReport, b: &SyncReport) -> bool {
    a.action == b.action && a.slot == b.slot
}

/// What changed between the last pass's report of an array and this one's.
fn changes(seen: &mut Seen, now: &ArrayReport) -> Vec<Event> {
    let before = &seen.report;
    let mut events = Vec::new();
    let mut joined = Vec::new();
    for m in &now.members {
        let Some(was) = before.members.iter().find(|b| b.slot == m.slot) else {
            continue;
        };
        let out = m.state.is_out();
        match was.state {
            MemberState::Active if out => events.push(
                Event::on(
                    Kind::Fail,
                    now,
                    format!("{} (slot {}) failed", was.name, m.slot),
                )
                .member(&was.name),
            ),
            MemberState::Rebuilding if out => events.push(
                Event::on(
                    Kind::FailSpare,
                    now,
                    format!("{} (slot {}) failed while rebuilding", was.name, m.slot),
                )
                .member(&was.name),
            ),
            MemberState::Rebuilding | MemberState::Faulty | MemberState::Missing
                if m.state == MemberState::Active =>
            {
                joined.push((m.slot, m.name.clone()));
            }
            // A replacement swapped in: the slot's member is another one.
            MemberState::Active
                if m.state == MemberState::Active
                    && m.name != was.name
                    && before
                        .replacing
                        .as_ref()
                        .is_some_and(|r| r.slot == m.slot && r.name == m.name) =>
            {
                joined.push((m.slot, m.name.clone()));
            }
            _ => {}
        }
    }
    events.extend(background(seen, now));
    // The engine marks a rebuilt slot active a moment before its run is
    // over: the member is raised after RebuildFinished, as it happens.
    seen.held.extend(joined);
    let running_on = now.sync.as_ref().and_then(|s| s.slot);
    let (waiting, joined): (Vec<_>, Vec<_>) = std::mem::take(&mut seen.held)
        .into_iter()
        .partition(|(slot, _)| Some(*slot) == running_on);
    seen.held = waiting;
    let before = &seen.report;
    for (slot, name) in joined {
        events.push(
            Event::on(
                Kind::SpareActive,
                now,
                format!("{name} (slot {slot}) is active and in sync"),
            )
            .member(&name),
        );
    }
    let new_data_error = now.corrected_errors + now.unrecoverable_errors
        > before.corrected_errors + before.unrecoverable_errors;
    let last_file = |unrecoverable: bool| {
        now.last_data_error
            .as_ref()
            .filter(|e| new_data_error && e.unrecoverable == unrecoverable)
            .and_then(|e| e.path.clone())
    };
    for m in &now.members {
        let Some(was) = before
            .members
            .iter()
            .find(|b| b.slot == m.slot && b.uuid == m.uuid)
        else {
            continue;
        };
        if m.checksum_errors > was.checksum_errors {
            let file = last_file(false);
            let place = file
                .as_deref()
                .map(|f| format!(" (last in {f})"))
                .unwrap_or_default();
            events.push(
                Event::on(
                    Kind::ChecksumError,
                    now,
                    format!(
                        "{} held {} more bad cop{} ({} in all){place}",
                        m.name,
                        m.checksum_errors - was.checksum_errors,
                        if m.checksum_errors - was.checksum_errors == 1 {
                            "y"
                        } else {
                            "ies"
                        },
                        m.checksum_errors
                    ),
                )
                .member(&m.name)
                .file(file),
            );
        }
    }
    if now.unrecoverable_errors > before.unrecoverable_errors {
        let file = last_file(true);
        let place = file
            .as_deref()
            .map(|f| format!(" (last in {f})"))
            .unwrap_or_default();
        events.push(
            Event::on(
                Kind::UnrecoverableError,
                now,
                format!(
                    "{} more data block(s) with no good copy ({} in all; reads of them fail with EIO){place}",
                    now.unrecoverable_errors - before.unrecoverable_errors,
                    now.unrecoverable_errors
                ),
            )
            .file(file),
        );
    }
    events
}

/// Background work: started, marks crossed, finished.
fn background(seen: &mut Seen, now: &ArrayReport) -> Vec<Event> {
    let mut events = Vec::new();
    let was = seen.report.sync.clone();
    let is = now.sync.clone();
    let ended = match (&was, &is) {
        (Some(a), Some(b)) => !same_run(a, b),
        (Some(_), None) => true,
        (None, _) => false,
    };
    if let (true, Some(a)) = (ended, &was) {
        let result = now.last_sync.as_ref().filter(|l| l.action == a.action);
        if result.is_some_and(|l| l.completed) {
            // It ran to the end: the marks it passed since the last pass.
            for &mark in &MARKS[seen.marks.min(MARKS.len())..] {
                events.push(Event::on(
                    Kind::Rebuild(mark),
                    now,
                    format!("{} {mark}% done", a.action),
                ));
            }
        }
        let mut finished = Event::on(
            Kind::RebuildFinished,
            now,
            result
                .map(|l| l.message.clone())
                .unwrap_or_else(|| format!("{} ended", a.action)),
        );
        if let Some(l) = result.filter(|l| l.mismatches > 0) {
            // mdadm's third argument for a check that found mismatches.
            finished = finished.member(&format!("mismatches found: {}", l.mismatches));
        }
        events.push(finished);
        seen.marks = 0;
    }
    if let Some(b) = &is {
        if was.is_none() || ended {
            events.push(Event::on(
                Kind::RebuildStarted,
                now,
                format!(
                    "{}{} started",
                    b.action,
                    b.slot.map(|s| format!(" of slot {s}")).unwrap_or_default()
                ),
            ));
        }
        let reached = marks_reached(b.per_mille());
        for &mark in &MARKS[seen.marks.min(reached)..reached] {
            events.push(Event::on(
                Kind::Rebuild(mark),
                now,
                format!("{} {mark}% done", b.action),
            ));
        }
        seen.marks = seen.marks.max(reached);
    }
    events
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::control::{
        DataErrorReport, LastSyncReport, MemberReport, SpeedLimitReport, REPORT_VERSION,
    };

    struct Spares(usize);
    impl Expectations for Spares {
        fn spares(&self, _: &str) -> usize {
            self.0
        }
    }

    fn member(slot: usize, state: MemberState) -> MemberReport {
        MemberReport {
            slot,
            name: format!("/img/m{slot}"),
            uuid: format!("u{slot}"),
            state,
            read_errors: 0,
            write_errors: 0,
            checksum_errors: 0,
            reads: 0,
            read_bytes: 0,
            seeks: 0,
            pending: 0,
            latency_us: 0.0,
            rotational: false,
            write_mostly: false,
            failfast: false,
            streams: Vec::new(),
            io: Default::default(),
        }
    }

    /// A RAID1 report with one member per state given (also used by
    /// `detail`'s tests).
    pub(crate) fn report(states: &[MemberState]) -> ArrayReport {
        let members: Vec<MemberReport> = states
            .iter()
            .enumerate()
            .map(|(i, &s)| member(i, s))
            .collect();
        let active = members
            .iter()
            .filter(|m| m.state == MemberState::Active)
            .count();
        ArrayReport {
            version: REPORT_VERSION,
            mount_point: "/mnt/a".into(),
            daemon_pid: 7,
            owner_uid: 0,
            read_only: false,
            uuid: "uuid-a".into(),
            name: String::new(),
            level: "raid1".into(),
            layout: String::new(),
            chunk: 65536,
            raid_devices: members.len(),
            active_devices: active,
            failed_devices: members.iter().filter(|m| m.state.is_out()).count(),
            state: "clean".into(),
            degraded: active < members.len(),
            events: 1,
            created: 0,
            updated: 0,
            array_size: 0,
            member_size: 0,
            data_offset: 0,
            groups_allocated: 0,
            groups_total: 0,
            map: String::new(),
            members,
            spares: Vec::new(),
            replacing: None,
            sync: None,
            last_sync: None,
            speed_limit: SpeedLimitReport { min: 0, max: 0 },
            read_policy: String::new(),
            suspended: None,
            host_no_space_errors: 0,
            fs_size: 0,
            fs_free: 0,
            io_seconds: 0.0,
            damaged: Vec::new(),
            corrected_errors: 0,
            unrecoverable_errors: 0,
            last_data_error: None,
            paused_scrub: None,
            reshape: None,
        }
    }

    fn recovery(done: u64) -> Option<SyncReport> {
        Some(SyncReport {
            run: 1,
            action: "recovery".into(),
            slot: Some(1),
            done,
            total: 100,
            speed: 1,
            eta_secs: 1,
            mismatches: 0,
        })
    }

    /// The report of a recovery that ended, `done` of 100 bytes in.
    fn ended_recovery(completed: bool, done: u64) -> Option<LastSyncReport> {
        Some(LastSyncReport {
            run: 1,
            action: "recovery".into(),
            completed,
            mismatches: 0,
            message: format!("recovery {}", if completed { "finished" } else { "failed" }),
            done,
            total: 100,
        })
    }

    fn names(events: &[Event]) -> Vec<String> {
        events.iter().map(|e| e.arguments().join(" ")).collect()
    }

    use MemberState::{Active, Faulty, Rebuilding};

    #[test]
    fn the_first_pass_raises_standing_conditions_and_later_arrays_are_new() {
        let mut t = Tracker::default();
        let degraded = report(&[Active, Faulty]);
        assert_eq!(
            names(&t.pass(std::slice::from_ref(&degraded), &[], &[], &Spares(1))),
            ["DegradedArray /mnt/a", "SparesMissing /mnt/a"]
        );
        assert!(t
            .pass(std::slice::from_ref(&degraded), &[], &[], &Spares(1))
            .is_empty());
        let mut other = report(&[Active, Active]);
        other.uuid = "uuid-b".into();
        other.mount_point = "/mnt/b".into();
        assert_eq!(
            names(&t.pass(&[degraded, other], &[], &[], &Spares(0))),
            ["NewArray /mnt/b"]
        );
    }

    #[test]
    fn a_failure_and_a_rebuild_raise_every_mark_in_order() {
        let mut t = Tracker::default();
        let healthy = report(&[Active, Active]);
        assert!(t.pass(&[healthy], &[], &[], &Spares(0)).is_empty());
        let failed = report(&[Active, Faulty]);
        assert_eq!(
            names(&t.pass(&[failed], &[], &[], &Spares(0))),
            ["Fail /mnt/a /img/m1"]
        );
        let mut rebuilding = report(&[Active, Rebuilding]);
        rebuilding.sync = recovery(10);
        assert_eq!(
            names(&t.pass(std::slice::from_ref(&rebuilding), &[], &[], &Spares(0))),
            ["RebuildStarted /mnt/a"]
        );
        // Two marks between passes: both, in order.
        rebuilding.sync = recovery(45);
        assert_eq!(
            names(&t.pass(std::slice::from_ref(&rebuilding), &[], &[], &Spares(0))),
            ["Rebuild20 /mnt/a", "Rebuild40 /mnt/a"]
        );
        // The slot turns active a moment before the run is reported over.
        let mut ending = report(&[Active, Active]);
        ending.sync = recovery(100);
        assert_eq!(
            names(&t.pass(&[ending], &[], &[], &Spares(0))),
            ["Rebuild60 /mnt/a", "Rebuild80 /mnt/a"]
        );
        // Finished: then the member is raised.
        let mut done = report(&[Active, Active]);
        done.last_sync = ended_recovery(true, 100);
        let events = t.pass(&[done], &[], &[], &Spares(0));
        assert_eq!(
            names(&events),
            ["RebuildFinished /mnt/a", "SpareActive /mnt/a /img/m1"]
        );
        assert_eq!(events[0].message, "recovery finished");
    }

    #[test]
    fn a_run_that_completes_between_passes_raises_the_marks_it_had_left() {
        let mut t = Tracker::default();
        let mut rebuilding = report(&[Active, Rebuilding]);
        rebuilding.sync = recovery(30);
        t.pass(&[rebuilding], &[], &[], &Spares(0));
        let mut done = report(&[Active, Active]);
        done.last_sync = ended_recovery(true, 100);
        // Seen first at 30%: Rebuild20 was passed before the monitor looked.
        assert_eq!(
            names(&t.pass(&[done], &[], &[], &Spares(0))),
            [
                "Rebuild40 /mnt/a",
                "Rebuild60 /mnt/a",
                "Rebuild80 /mnt/a",
                "RebuildFinished /mnt/a",
                "SpareActive /mnt/a /img/m1"
            ]
        );
    }

    #[test]
    fn a_member_failing_while_it_rebuilds_is_fail_spare() {
        let mut t = Tracker::default();
        let mut rebuilding = report(&[Active, Rebuilding]);
        rebuilding.sync = recovery(50);
        t.pass(&[rebuilding], &[], &[], &Spares(0));
        let mut failed = report(&[Active, Faulty]);
        failed.last_sync = ended_recovery(false, 50);
        assert_eq!(
            names(&t.pass(&[failed], &[], &[], &Spares(0))),
            ["FailSpare /mnt/a /img/m1", "RebuildFinished /mnt/a"]
        );
    }

    #[test]
    fn data_errors_name_the_member_and_the_file() {
        let mut t = Tracker::default();
        let healthy = report(&[Active, Active]);
        t.pass(std::slice::from_ref(&healthy), &[], &[], &Spares(0));
        let mut hit = healthy.clone();
        hit.members[0].checksum_errors = 1;
        hit.corrected_errors = 1;
        hit.last_data_error = Some(DataErrorReport {
            ino: 5,
            path: Some("/d/f".into()),
            offset: 4096,
            unrecoverable: false,
        });
        let events = t.pass(std::slice::from_ref(&hit), &[], &[], &Spares(0));
        assert_eq!(names(&events), ["ChecksumError /mnt/a /img/m0 /d/f"]);
        let mut lost = hit.clone();
        lost.unrecoverable_errors = 1;
        lost.last_data_error = Some(DataErrorReport {
            ino: 6,
            path: Some("/g".into()),
            offset: 0,
            unrecoverable: true,
        });
        assert_eq!(
            names(&t.pass(&[lost], &[], &[], &Spares(0))),
            ["UnrecoverableError /mnt/a /g"]
        );
    }

    #[test]
    fn a_dead_mount_disappears_once() {
        let mut t = Tracker::default();
        t.pass(&[report(&[Active, Active])], &[], &[], &Spares(0));
        let dead = [InactiveMount {
            mount_point: "/mnt/a".into(),
            reason: "the daemon is gone".into(),
        }];
        let events = t.pass(&[], &dead, &[], &Spares(0));
        assert_eq!(names(&events), ["DeviceDisappeared /mnt/a"]);
        assert_eq!(events[0].message, "/mnt/a is dead: the daemon is gone");
        assert!(t.pass(&[], &dead, &[], &Spares(0)).is_empty());
        assert!(t.pass(&[], &[], &[], &Spares(0)).is_empty());
    }

    #[test]
    fn a_daemon_that_does_not_answer_once_is_not_gone() {
        let mut t = Tracker::default();
        let healthy = report(&[Active, Active]);
        t.pass(std::slice::from_ref(&healthy), &[], &[], &Spares(0));
        assert!(t.pass(&[], &[], &["/mnt/a".into()], &Spares(0)).is_empty());
        assert!(t
            .pass(std::slice::from_ref(&healthy), &[], &[], &Spares(0))
            .is_empty());
    }
}
