//! Read balancing across mirror copies (RAID1, RAID10, mirrored metadata).
//!
//! Every mirror read asks the [`Balancer`] which copy to read. It keeps, per
//! member: the head position (the member offset right after the last read it
//! was given), the reads in flight, a small table of sequential streams it is
//! serving, an average latency, and whether the member is rotational.
//!
//! The default policy, [`ReadPolicy::Sticky`], keeps each sequential stream on
//! the mirror that serves it, so K streams on N >= K mirrors never make a head
//! seek between them. On non-rotational members, where a seek costs nothing,
//! a large read is instead split across the copies, read in parallel
//! ([`Balancer::splits_large_reads`]). md's old balancer tracked a single stream for the whole
//! array and bounced concurrent streams between disks; [`ReadPolicy::Legacy`]
//! reproduces it for comparison. Failed and write-mostly members are avoided
//! as md does (write-mostly ones are read only when nothing else holds the data).
//!
//! The hot path takes no allocation and at most one short lock per candidate.

use crate::geometry::Target;
use parking_lot::Mutex;
use serde::Serialize;
use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::time::Duration;

/// Streams remembered per member.
const STREAMS: usize = 4;
/// A read within this many bytes of where a stream ended continues it (reads
/// of one stream arrive out of order: the kernel keeps several 1 MiB readahead
/// READs of a stream in flight, served by different FUSE threads).
const STREAM_WINDOW: u64 = 8 << 20;
/// A stream unused for this many mirror reads (array-wide) is no longer active.
const ACTIVE_TICKS: u64 = 1024;
/// A placement not issued within this many mirror reads is forgotten.
const CLAIM_TICKS: u64 = 8;
/// Weight of a new latency sample in the moving average (1/8, as TCP's SRTT).
const EWMA_SHIFT: u32 = 3;

/// How mirror reads choose a copy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ReadPolicy {
    /// Streams stay on their mirror; new streams go to a free, idle or nearest
    /// mirror; on non-rotational members, fewest reads in flight.
    #[default]
    Sticky,
    /// Each read to the next working copy in turn.
    RoundRobin,
    /// Always the first working copy.
    First,
    /// One sequential tracker for the whole array, as md's balancer of 2003.
    Legacy,
}

impl ReadPolicy {
    pub const ALL: [ReadPolicy; 4] = [
        ReadPolicy::Sticky,
        ReadPolicy::RoundRobin,
        ReadPolicy::First,
        ReadPolicy::Legacy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            ReadPolicy::Sticky => "sticky",
            ReadPolicy::RoundRobin => "round-robin",
            ReadPolicy::First => "first",
            ReadPolicy::Legacy => "legacy",
        }
    }

    fn from_index(i: u8) -> ReadPolicy {
        ReadPolicy::ALL.get(i as usize).copied().unwrap_or_default()
    }

    fn index(self) -> u8 {
        ReadPolicy::ALL.iter().position(|&p| p == self).unwrap_or(0) as u8
    }
}

impl fmt::Display for ReadPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ReadPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<ReadPolicy, String> {
        let wanted = s.trim().to_ascii_lowercase().replace('_', "-");
        let wanted = if wanted == "roundrobin" || wanted == "rr" {
            "round-robin".to_string()
        } else {
            wanted
        };
        ReadPolicy::ALL
            .iter()
            .copied()
            .find(|p| p.name() == wanted)
            .ok_or_else(|| {
                let names: Vec<&str> = ReadPolicy::ALL.iter().map(|p| p.name()).collect();
                format!(
                    "unknown read balance policy {s:?} (choose one of {})",
                    names.join(", ")
                )
            })
    }
}

/// One member's balancing counters, for `raidfs detail` and the bench.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct MemberStats {
    pub slot: usize,
    pub name: String,
    pub rotational: bool,
    pub write_mostly: bool,
    /// Mirror reads sent to this member (after merging a request's chunks).
    pub reads: u64,
    pub bytes: u64,
    /// Reads that did not start where the member's previous read ended.
    pub seeks: u64,
    /// Reads in flight now.
    pub pending: u32,
    /// Moving average of read latency, microseconds (0 before the first read).
    pub latency_us: f64,
    /// Sequential streams this member is serving now.
    pub streams: u32,
    /// Where each of those streams stands: the member offset its last read
    /// ended at, lowest first.
    pub stream_ends: Vec<u64>,
    /// Member offset right after its last read.
    pub head: u64,
}

#[derive(Clone, Copy, Default)]
struct Stream {
    live: bool,
    /// Member offset where the stream's last read ended.
    next: u64,
    /// Array-wide read tick of its last read.
    last: u64,
    /// Reads that continued it (0: a lone read so far, not yet a stream).
    hits: u32,
    /// Placed by the balancer but not yet issued: a new stream on its way.
    claim: bool,
}

#[derive(Default)]
struct HeadState {
    head: u64,
    streams: [Stream; STREAMS],
    latency_ns: u64,
}

impl HeadState {
    fn continuing(&self, offset: u64) -> Option<&Stream> {
        self.streams
            .iter()
            .filter(|s| s.live && s.next.abs_diff(offset) <= STREAM_WINDOW)
            .min_by_key(|s| s.next.abs_diff(offset))
    }

    fn active_streams(&self, tick: u64) -> u32 {
        self.streams
            .iter()
            .filter(|s| s.live && s.hits > 0 && tick.saturating_sub(s.last) <= ACTIVE_TICKS)
            .count() as u32
    }

    fn active_stream_ends(&self, tick: u64) -> Vec<u64> {
        let mut ends: Vec<u64> = self
            .streams
            .iter()
            .filter(|s| s.live && s.hits > 0 && tick.saturating_sub(s.last) <= ACTIVE_TICKS)
            .map(|s| s.next)
            .collect();
        ends.sort_unstable();
        ends
    }

    /// New streams placed here in the last few reads and not yet issued.
    fn claims(&self, tick: u64) -> u32 {
        self.streams
            .iter()
            .filter(|s| s.live && s.claim && tick.saturating_sub(s.last) <= CLAIM_TICKS)
            .count() as u32
    }

    /// Slot for a new entry: a free one, else the least recently used.
    fn oldest(&self) -> usize {
        (0..STREAMS)
            .min_by_key(|&i| {
                let s = &self.streams[i];
                if s.live {
                    s.last + 1
                } else {
                    0
                }
            })
            .unwrap_or(0)
    }
}

#[derive(Default)]
struct Mirror {
    state: Mutex<HeadState>,
    pending: AtomicU32,
    reads: AtomicU64,
    bytes: AtomicU64,
    seeks: AtomicU64,
    rotational: AtomicBool,
    write_mostly: AtomicBool,
}

/// md's single tracker, for [`ReadPolicy::Legacy`].
#[derive(Default)]
struct LegacyTracker {
    last_used: usize,
    next_seq: u64,
}

/// What the sticky policy weighs for one candidate copy.
#[derive(Clone, Copy)]
struct View {
    continues: bool,
    /// Distance to the end of the stream it continues.
    gap: u64,
    streams: u32,
    claims: u32,
    pending: u32,
    distance: u64,
    latency_ns: u64,
}

/// One pass of the sticky policy over the candidates: the best continuation
/// on a mirror serving only this stream, the best continuation on a crowded
/// mirror (two or more streams), the best mirror for a new stream.
struct Scan<'a> {
    own: Option<(&'a Target, Key)>,
    crowded: Option<(&'a Target, Key)>,
    fresh: Option<(&'a Target, Key)>,
    any_free: bool,
}

/// A candidate's rank under the sticky policy: lowest wins, compared in order.
type Key = (u64, u64, u64, u64, u64, u64, u64);

/// The read balancer of one array.
pub struct Balancer {
    mirrors: Vec<Mirror>,
    policy: AtomicU8,
    next_robin: AtomicUsize,
    tick: AtomicU64,
    legacy: Mutex<LegacyTracker>,
    /// Serialises the placement of new streams (not continuations).
    placing: Mutex<()>,
}

impl Balancer {
    /// A balancer for `members` slots, all rotational, policy sticky.
    pub fn new(members: usize) -> Balancer {
        let mirrors = (0..members)
            .map(|_| Mirror {
                rotational: AtomicBool::new(true),
                ..Mirror::default()
            })
            .collect();
        Balancer {
            mirrors,
            policy: AtomicU8::new(ReadPolicy::Sticky.index()),
            next_robin: AtomicUsize::new(0),
            tick: AtomicU64::new(0),
            legacy: Mutex::new(LegacyTracker::default()),
            placing: Mutex::new(()),
        }
    }

    pub fn policy(&self) -> ReadPolicy {
        ReadPolicy::from_index(self.policy.load(Ordering::Relaxed))
    }

    pub fn set_policy(&self, policy: ReadPolicy) {
        self.policy.store(policy.index(), Ordering::Relaxed);
    }

    pub fn set_rotational(&self, slot: usize, rotational: bool) {
        if let Some(m) = self.mirrors.get(slot) {
            m.rotational.store(rotational, Ordering::Relaxed);
        }
    }

    pub fn is_rotational(&self, slot: usize) -> bool {
        self.mirrors
            .get(slot)
            .is_some_and(|m| m.rotational.load(Ordering::Relaxed))
    }

    /// Whether a large read with copies on `targets` is split across them
    /// (btrfs's round-robin policy for one stream): under the sticky
    /// policy, when every copy is non-rotational, so parallel reads cost
    /// no seek, and none is write-mostly.
    pub fn splits_large_reads(&self, targets: &[Target]) -> bool {
        self.policy() == ReadPolicy::Sticky
            && targets.len() > 1
            && targets.iter().all(|t| {
                self.mirrors.get(t.member).is_some_and(|m| {
                    !m.rotational.load(Ordering::Relaxed) && !m.write_mostly.load(Ordering::Relaxed)
                })
            })
    }

    /// A write-mostly member is read only when no other copy is available.
    pub fn set_write_mostly(&self, slot: usize, write_mostly: bool) {
        if let Some(m) = self.mirrors.get(slot) {
            m.write_mostly.store(write_mostly, Ordering::Relaxed);
        }
    }

    fn write_mostly(&self, slot: usize) -> bool {
        self.mirrors
            .get(slot)
            .is_some_and(|m| m.write_mostly.load(Ordering::Relaxed))
    }

    /// The copy to read for a piece whose copies are `targets` (offsets
    /// relative to `base`), `len` bytes of the request starting there.
    /// `readable` tells which copies can serve (not failed, not being
    /// rebuilt there). `None`: no readable copy.
    pub fn choose<'a, F: Fn(&Target) -> bool>(
        &self,
        targets: &'a [Target],
        base: u64,
        len: u64,
        readable: F,
    ) -> Option<&'a Target> {
        // Write-mostly members only when nothing else is left, as md does.
        let usable = |t: &&Target| readable(t) && t.member < self.mirrors.len();
        let preferred = |t: &&Target| usable(t) && !self.write_mostly(t.member);
        if targets.iter().any(|t| preferred(&t)) {
            self.choose_among(targets, base, len, preferred)
        } else {
            self.choose_among(targets, base, len, usable)
        }
    }

    /// Like [`Balancer::choose`], but a piece that directly follows the
    /// previous piece of the same request on a member it has a copy on
    /// stays there, so the request is one read on that member.
    pub(crate) fn choose_following<'a, F: Fn(&Target) -> bool>(
        &self,
        targets: &'a [Target],
        base: u64,
        len: u64,
        follow: Option<(usize, u64)>,
        readable: F,
    ) -> Option<&'a Target> {
        if let Some((slot, end)) = follow {
            if let Some(t) = targets
                .iter()
                .find(|t| t.member == slot && base + t.offset == end && readable(t))
            {
                return Some(t);
            }
        }
        self.choose(targets, base, len, readable)
    }

    fn choose_among<'a>(
        &self,
        targets: &'a [Target],
        base: u64,
        len: u64,
        eligible: impl Fn(&&Target) -> bool,
    ) -> Option<&'a Target> {
        match self.policy() {
            ReadPolicy::First => targets.iter().find(|t| eligible(t)),
            ReadPolicy::RoundRobin => {
                let count = targets.iter().filter(|t| eligible(t)).count();
                if count == 0 {
                    return None;
                }
                let n = self.next_robin.fetch_add(1, Ordering::Relaxed) % count;
                targets.iter().filter(|t| eligible(t)).nth(n)
            }
            ReadPolicy::Legacy => self.choose_legacy(targets, base, len, eligible),
            ReadPolicy::Sticky => self.choose_sticky(targets, base, eligible),
        }
    }

    fn view(&self, slot: usize, offset: u64, tick: u64) -> View {
        let m = &self.mirrors[slot];
        let state = m.state.lock();
        let stream = state.continuing(offset);
        View {
            continues: stream.is_some(),
            gap: stream.map_or(0, |s| s.next.abs_diff(offset)),
            streams: state.active_streams(tick),
            claims: state.claims(tick),
            pending: m.pending.load(Ordering::Relaxed),
            distance: state.head.abs_diff(offset),
            latency_ns: state.latency_ns,
        }
    }

    fn choose_sticky<'a>(
        &self,
        targets: &'a [Target],
        base: u64,
        eligible: impl Fn(&&Target) -> bool,
    ) -> Option<&'a Target> {
        let tick = self.tick.load(Ordering::Relaxed);
        // md's rule: any solid-state copy makes reads spread by queue depth.
        let all_rotational = targets
            .iter()
            .filter(|t| eligible(t))
            .all(|t| self.is_rotational(t.member));
        if !all_rotational {
            return self.lowest(targets, |t| {
                eligible(t).then(|| solid_state_key(&self.view(t.member, base + t.offset, tick)))
            });
        }
        let first = self.scan(targets, base, tick, &eligible);
        if let Some((t, _)) = first.own {
            return Some(t);
        }
        // Placing a new stream: one placement at a time, so two streams that
        // start together see each other's claim and take different mirrors.
        let _placing = self.placing.lock();
        let scan = self.scan(targets, base, tick, &eligible);
        if let Some((t, _)) = scan.own {
            return Some(t);
        }
        let chosen = match (scan.crowded, scan.fresh) {
            // Streams that met on one mirror part: this one moves to a mirror
            // serving none, once; the crowded mirror forgets it so that it
            // does not move back.
            (Some((stuck, _)), Some((free, _))) if scan.any_free && free.member != stuck.member => {
                self.forget_stream(stuck.member, base + stuck.offset);
                free
            }
            (Some((stuck, _)), _) => return Some(stuck),
            (None, fresh) => fresh?.0,
        };
        self.claim(chosen.member, base + chosen.offset, tick);
        Some(chosen)
    }

    fn scan<'a>(
        &self,
        targets: &'a [Target],
        base: u64,
        tick: u64,
        eligible: &impl Fn(&&Target) -> bool,
    ) -> Scan<'a> {
        let mut scan = Scan {
            own: None,
            crowded: None,
            fresh: None,
            any_free: false,
        };
        for t in targets.iter().filter(|t| eligible(t)) {
            let v = self.view(t.member, base + t.offset, tick);
            scan.any_free |= v.streams + v.claims == 0;
            if v.continues {
                let slot = if v.streams >= 2 {
                    &mut scan.crowded
                } else {
                    &mut scan.own
                };
                keep_lowest(slot, t, continuation_key(&v));
            }
            keep_lowest(&mut scan.fresh, t, new_stream_key(&v));
        }
        scan
    }

    /// Record a new stream placed on `slot` at `offset` before its read is
    /// issued, so that concurrent placements count it.
    fn claim(&self, slot: usize, offset: u64, tick: u64) {
        let mut state = self.mirrors[slot].state.lock();
        let i = state.oldest();
        state.streams[i] = Stream {
            live: true,
            next: offset,
            last: tick,
            hits: 0,
            claim: true,
        };
    }

    /// The target with the lowest key (`None` from `key`: not a candidate).
    fn lowest<'a>(
        &self,
        targets: &'a [Target],
        key: impl Fn(&&Target) -> Option<Key>,
    ) -> Option<&'a Target> {
        let mut best = None;
        for t in targets {
            if let Some(k) = key(&t) {
                keep_lowest(&mut best, t, k);
            }
        }
        best.map(|(t, _)| t)
    }

    /// Drop the stream of `slot` that a read at `offset` would continue.
    fn forget_stream(&self, slot: usize, offset: u64) {
        let mut state = self.mirrors[slot].state.lock();
        let closest = state
            .streams
            .iter_mut()
            .filter(|s| s.live && s.next.abs_diff(offset) <= STREAM_WINDOW)
            .min_by_key(|s| s.next.abs_diff(offset));
        if let Some(s) = closest {
            s.live = false;
        }
    }

    /// md's balancer of the thread: continue the one tracked stream on the
    /// disk last used, else the first idle disk scanning back from it, else
    /// the nearest head.
    fn choose_legacy<'a>(
        &self,
        targets: &'a [Target],
        base: u64,
        len: u64,
        eligible: impl Fn(&&Target) -> bool,
    ) -> Option<&'a Target> {
        let mut tracker = self.legacy.lock();
        let count = targets.len();
        let last = targets
            .iter()
            .position(|t| t.member == tracker.last_used && eligible(&t));
        let mut chosen = None;
        if let Some(i) = last {
            let at = base + targets[i].offset;
            let head = self.mirrors[targets[i].member].state.lock().head;
            if at == tracker.next_seq || at == head {
                chosen = Some(i);
            }
        }
        if chosen.is_none() {
            let start = last.unwrap_or(0);
            let mut nearest: Option<(usize, u64)> = None;
            for step in 1..=count {
                let i = (start + count - step) % count;
                let t = &targets[i];
                if !eligible(&t) {
                    continue;
                }
                let m = &self.mirrors[t.member];
                if m.pending.load(Ordering::Relaxed) == 0 {
                    chosen = Some(i);
                    break;
                }
                let distance = m.state.lock().head.abs_diff(base + t.offset);
                if nearest.is_none_or(|(_, d)| distance < d) {
                    nearest = Some((i, distance));
                }
            }
            chosen = chosen.or(nearest.map(|(i, _)| i));
        }
        let i = chosen?;
        tracker.last_used = targets[i].member;
        tracker.next_seq = base + targets[i].offset + len;
        Some(&targets[i])
    }

    /// A read of `len` bytes at member `offset` is being sent to `slot`.
    pub fn issue(&self, slot: usize, offset: u64, len: u64) {
        let Some(m) = self.mirrors.get(slot) else {
            return;
        };
        let tick = self.tick.fetch_add(1, Ordering::Relaxed) + 1;
        m.pending.fetch_add(1, Ordering::Relaxed);
        m.reads.fetch_add(1, Ordering::Relaxed);
        m.bytes.fetch_add(len, Ordering::Relaxed);
        let end = offset + len;
        let mut state = m.state.lock();
        if state.head != offset {
            m.seeks.fetch_add(1, Ordering::Relaxed);
        }
        state.head = end;
        let continued = state
            .streams
            .iter()
            .enumerate()
            .filter(|(_, s)| s.live && s.next.abs_diff(offset) <= STREAM_WINDOW)
            .min_by_key(|(_, s)| s.next.abs_diff(offset))
            .map(|(i, _)| i);
        match continued {
            Some(i) => {
                let s = &mut state.streams[i];
                s.next = s.next.max(end);
                s.last = tick;
                if s.claim {
                    s.claim = false;
                } else {
                    s.hits = s.hits.saturating_add(1);
                }
            }
            None => {
                let i = state.oldest();
                state.streams[i] = Stream {
                    live: true,
                    next: end,
                    last: tick,
                    hits: 0,
                    claim: false,
                };
            }
        }
    }

    /// A read issued to `slot` finished after `elapsed`.
    pub fn complete(&self, slot: usize, elapsed: Duration) {
        let Some(m) = self.mirrors.get(slot) else {
            return;
        };
        // Never below zero, even if a caller completes more than it issued.
        let _ = m
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1));
        let sample = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        let mut state = m.state.lock();
        state.latency_ns = if state.latency_ns == 0 {
            sample
        } else {
            let old = state.latency_ns as i128;
            (old + ((sample as i128 - old) >> EWMA_SHIFT)).max(1) as u64
        };
    }

    /// Zero the counters and forget heads, streams and latencies.
    pub fn reset(&self) {
        for m in &self.mirrors {
            *m.state.lock() = HeadState::default();
            m.reads.store(0, Ordering::Relaxed);
            m.bytes.store(0, Ordering::Relaxed);
            m.seeks.store(0, Ordering::Relaxed);
        }
        *self.legacy.lock() = LegacyTracker::default();
    }

    /// Counters of every member; `names` gives the slots' names.
    pub fn stats(&self, names: &[String]) -> Vec<MemberStats> {
        let tick = self.tick.load(Ordering::Relaxed);
        self.mirrors
            .iter()
            .take(names.len())
            .enumerate()
            .map(|(slot, m)| {
                let state = m.state.lock();
                MemberStats {
                    slot,
                    name: names.get(slot).cloned().unwrap_or_default(),
                    rotational: m.rotational.load(Ordering::Relaxed),
                    write_mostly: m.write_mostly.load(Ordering::Relaxed),
                    reads: m.reads.load(Ordering::Relaxed),
                    bytes: m.bytes.load(Ordering::Relaxed),
                    seeks: m.seeks.load(Ordering::Relaxed),
                    pending: m.pending.load(Ordering::Relaxed),
                    latency_us: state.latency_ns as f64 / 1000.0,
                    streams: state.active_streams(tick),
                    stream_ends: state.active_stream_ends(tick),
                    head: state.head,
                }
            })
            .collect()
    }
}

fn keep_lowest<'a>(best: &mut Option<(&'a Target, Key)>, t: &'a Target, key: Key) {
    if best.as_ref().is_none_or(|(_, k)| key < *k) {
        *best = Some((t, key));
    }
}

/// Rotational members continuing a stream: the closest stream end, then
/// fewer pending reads, lower latency.
fn continuation_key(v: &View) -> Key {
    (v.gap, v.pending as u64, v.latency_ns, 0, 0, 0, 0)
}

/// Rotational members for a new stream: a mirror serving fewer streams, idle,
/// with the nearest head (within a factor of two counts as equally near);
/// then fewer pending reads, lower latency, the exactly nearest head.
fn new_stream_key(v: &View) -> Key {
    let busy = (v.pending > 0) as u64;
    let near = u64::from(64 - v.distance.leading_zeros());
    (
        (v.streams + v.claims) as u64,
        busy,
        near,
        v.pending as u64,
        v.latency_ns,
        v.distance,
        0,
    )
}

/// Solid-state members: fewest pending reads; then stay on the stream's
/// member, fewer streams, lower latency.
fn solid_state_key(v: &View) -> Key {
    let moves = (!v.continues) as u64;
    (
        v.pending as u64,
        moves,
        v.streams as u64,
        v.latency_ns,
        0,
        0,
        0,
    )
}

/// Whether the device at `path` (or, for an image file, the device holding
/// it) is rotational, from /sys/dev/block/MAJ:MIN/queue/rotational.
pub fn detect_rotational(path: &Path) -> Option<bool> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let meta = std::fs::metadata(path).ok()?;
    let dev = if meta.file_type().is_block_device() {
        meta.rdev()
    } else {
        meta.dev()
    };
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    if major == 0 {
        return None; // tmpfs, overlay and other filesystems without a device
    }
    let node = std::fs::canonicalize(format!("/sys/dev/block/{major}:{minor}")).ok()?;
    // A partition has no queue of its own: its disk's is one level up.
    [
        node.join("queue/rotational"),
        node.join("../queue/rotational"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| match s.trim() {
        "0" => Some(false),
        "1" => Some(true),
        _ => None,
    })
}
