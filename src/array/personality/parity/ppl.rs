//! The partial parity log (md's PPL), which closes the RAID5 write hole.
//!
//! Before a partial-stripe write changes a stripe's data and parity, the
//! XOR of the data chunks it does *not* modify (the partial parity) over the
//! written window is appended, durably, to a log ring on that stripe's
//! parity member. If the array then crashes and a member is lost, assembly
//! recomputes each logged stripe's parity as partial parity XOR the modified
//! chunks as they now are on disk, so every chunk that was not being written
//! reconstructs exactly. Every array flush starts a new log epoch: entries of
//! older epochs covered writes that the flush made durable and are ignored.
//!
//! Ring layout, on every member in `[PPL_OFFSET, data_offset)`: a 512-byte
//! header (magic, epoch, crc32c) then entries, each a 512-byte header
//! (magic, epoch, seq, group, stripe, window start and length, bitmask of
//! modified data chunks, crc32c over header and payload) followed by the
//! partial parity, padded to 512 bytes.

use crate::member::Member;
use parking_lot::{Condvar, Mutex};
use std::sync::Arc;

pub const PPL_OFFSET: u64 = 128 << 10;
const SECTOR: usize = 512;
const RING_MAGIC: &[u8; 8] = b"RAIDPPLR";
const ENTRY_MAGIC: &[u8; 8] = b"RAIDPPLE";
/// Bytes of the modified-chunk bitmask (one bit per data chunk, 255 members).
const MASK_BYTES: usize = 32;

/// One logged partial-stripe write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub epoch: u64,
    pub seq: u64,
    pub group: u32,
    pub stripe: u64,
    pub lo: u64,
    /// Data indices being modified.
    pub modified: Vec<usize>,
    pub partial_parity: Vec<u8>,
}

struct State {
    epoch: u64,
    seq: u64,
    /// Next free byte in each slot's ring, after its header.
    heads: Vec<u64>,
    /// Logged writes still in flight; a flush waits for them.
    in_flight: usize,
    /// Stripes logged in this epoch. A second partial write to one of them
    /// needs a flush first: its partial parity would include chunks the
    /// first write modified, whose new contents may not be durable yet.
    logged: std::collections::HashSet<(u32, u64)>,
}

pub struct Ppl {
    ring_len: u64,
    state: Mutex<State>,
    drained: Condvar,
}

fn crc_le(bytes: &[u8]) -> [u8; 4] {
    crc32c::crc32c(bytes).to_le_bytes()
}

fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl Ppl {
    pub fn new(members: usize, data_offset: u64) -> Ppl {
        Ppl {
            ring_len: data_offset.saturating_sub(PPL_OFFSET + SECTOR as u64),
            state: Mutex::new(State {
                epoch: 1,
                seq: 0,
                heads: vec![0; members],
                in_flight: 0,
                logged: std::collections::HashSet::new(),
            }),
            drained: Condvar::new(),
        }
    }

    /// Bytes an entry of `len` payload bytes takes (saturating: a length
    /// read from disk may be anything).
    fn entry_size(len: usize) -> u64 {
        (len as u64)
            .div_ceil(SECTOR as u64)
            .saturating_mul(SECTOR as u64)
            .saturating_add(SECTOR as u64)
    }

    /// Whether an entry of `len` bytes can ever fit in the ring.
    pub fn fits(&self, len: usize) -> bool {
        Self::entry_size(len) <= self.ring_len
    }

    /// Reserve room for an entry on `slot`'s ring. None: a flush must come
    /// first (the ring is full, or the stripe was already logged this epoch).
    pub fn reserve(
        &self,
        slot: usize,
        group: u32,
        stripe: u64,
        lo: u64,
        modified: &[usize],
        pp: &[u8],
    ) -> Option<(u64, Vec<u8>)> {
        let mut st = self.state.lock();
        let size = Self::entry_size(pp.len());
        if st.heads[slot] + size > self.ring_len || st.logged.contains(&(group, stripe)) {
            return None;
        }
        st.logged.insert((group, stripe));
        st.seq += 1;
        let offset = PPL_OFFSET + SECTOR as u64 + st.heads[slot];
        st.heads[slot] += size;
        st.in_flight += 1;
        let mut buf = vec![0u8; size as usize];
        buf[0..8].copy_from_slice(ENTRY_MAGIC);
        buf[8..16].copy_from_slice(&st.epoch.to_le_bytes());
        buf[16..24].copy_from_slice(&st.seq.to_le_bytes());
        buf[24..28].copy_from_slice(&group.to_le_bytes());
        buf[32..40].copy_from_slice(&stripe.to_le_bytes());
        buf[40..48].copy_from_slice(&lo.to_le_bytes());
        buf[48..56].copy_from_slice(&(pp.len() as u64).to_le_bytes());
        for &i in modified {
            buf[64 + i / 8] |= 1 << (i % 8);
        }
        buf[SECTOR..SECTOR + pp.len()].copy_from_slice(pp);
        let crc = {
            let mut covered = buf[..SECTOR - 4].to_vec();
            covered.extend_from_slice(pp);
            crc_le(&covered)
        };
        buf[SECTOR - 4..SECTOR].copy_from_slice(&crc);
        Some((offset, buf))
    }

    /// The logged write whose entry was reserved is complete (or abandoned).
    pub fn done(&self) {
        let mut st = self.state.lock();
        st.in_flight = st.in_flight.saturating_sub(1);
        if st.in_flight == 0 {
            self.drained.notify_all();
        }
    }

    /// A flush: wait until no logged write is in flight, begin a new epoch
    /// (entries of older epochs are now obsolete), and run `sync` with the
    /// ring header of the new epoch, which every member must store durably.
    /// New entries wait until it returns.
    pub fn flush_with<R>(&self, sync: impl FnOnce(&[u8]) -> R) -> R {
        let mut st = self.state.lock();
        while st.in_flight > 0 {
            self.drained.wait(&mut st);
        }
        st.epoch += 1;
        st.heads.iter_mut().for_each(|h| *h = 0);
        st.logged.clear();
        sync(&Self::header_for(st.epoch))
    }

    /// The ring header for the current epoch.
    pub fn header(&self) -> Vec<u8> {
        let epoch = self.state.lock().epoch;
        Self::header_for(epoch)
    }

    fn header_for(epoch: u64) -> Vec<u8> {
        let mut h = vec![0u8; SECTOR];
        h[0..8].copy_from_slice(RING_MAGIC);
        h[8..16].copy_from_slice(&epoch.to_le_bytes());
        let crc = crc_le(&h[..SECTOR - 4]);
        h[SECTOR - 4..].copy_from_slice(&crc);
        h
    }

    /// Continue from `epoch` (the newest found at assembly).
    pub fn resume(&self, epoch: u64) {
        let mut st = self.state.lock();
        st.epoch = st.epoch.max(epoch + 1);
    }

    /// Read one member's ring: its epoch and the entries of that epoch.
    pub fn read_ring(&self, member: &dyn Member) -> Option<(u64, Vec<Entry>)> {
        let mut ring = vec![0u8; SECTOR + self.ring_len as usize];
        member.read_at(&mut ring, PPL_OFFSET).ok()?;
        decode_ring(&ring).ok()
    }

    /// Write an empty ring (header of the current epoch) to every member.
    pub fn format(&self, members: &[Arc<dyn Member>]) -> std::io::Result<()> {
        let header = self.header();
        for m in members {
            m.write_at(&header, PPL_OFFSET)?;
        }
        Ok(())
    }
}

/// Decode a ring (header then entries, as read from `PPL_OFFSET`): its
/// epoch and the entries of that epoch, up to the first that is not one
/// (another magic or epoch, a length past the ring, a failing checksum: a
/// torn or never written entry ends the ring). The error says why the ring
/// has no valid header.
pub fn decode_ring(ring: &[u8]) -> Result<(u64, Vec<Entry>), String> {
    let h = ring
        .get(..SECTOR)
        .ok_or_else(|| format!("PPL ring is {} bytes, shorter than its header", ring.len()))?;
    if &h[0..8] != RING_MAGIC {
        return Err("no PPL ring header magic".into());
    }
    if crc_le(&h[..SECTOR - 4]) != h[SECTOR - 4..] {
        return Err("PPL ring header fails its checksum".into());
    }
    let epoch = get_u64(h, 8);
    let mut entries = Vec::new();
    let mut at = SECTOR;
    while let Some(e) = ring.get(at..at + SECTOR) {
        if &e[0..8] != ENTRY_MAGIC || get_u64(e, 8) != epoch {
            break;
        }
        let len = get_u64(e, 48);
        let room = (ring.len() - at) as u64;
        if Ppl::entry_size(usize::try_from(len).unwrap_or(usize::MAX)) > room {
            break;
        }
        // Both fit in usize: they are within the ring.
        let (len, size) = (len as usize, Ppl::entry_size(len as usize) as usize);
        let pp = &ring[at + SECTOR..at + SECTOR + len];
        let mut covered = e[..SECTOR - 4].to_vec();
        covered.extend_from_slice(pp);
        if crc_le(&covered) != e[SECTOR - 4..] {
            break; // A torn entry: its write never started.
        }
        let mask = &e[64..64 + MASK_BYTES];
        entries.push(Entry {
            epoch,
            seq: get_u64(e, 16),
            group: u32::from_le_bytes([e[24], e[25], e[26], e[27]]),
            stripe: get_u64(e, 32),
            lo: get_u64(e, 40),
            modified: (0..MASK_BYTES * 8)
                .filter(|&i| mask[i / 8] & (1 << (i % 8)) != 0)
                .collect(),
            partial_parity: pp.to_vec(),
        });
        at += size;
    }
    Ok((epoch, entries))
}

impl crate::array::Array {
    /// Make room in the log: once the logged writes in flight are done,
    /// sync every member, which makes every logged write durable, and
    /// start a new epoch, which makes their entries obsolete. This is the
    /// part of [`Array::flush`](crate::array::Array::flush) the log needs
    /// and no more: it neither writes out the stripe cache nor waits for
    /// queued full-stripe writes (neither has log entries), so a write path
    /// that holds a stripe lock or is itself a cache write-out may call it.
    pub(crate) fn roll_partial_parity_log(&self, ppl: &Ppl) -> crate::array::ArrayResult<()> {
        match ppl.flush_with(|header| self.sync_members(Some(header))) {
            Some(host) => Err(host),
            None => self.ensure_writable(),
        }
    }

    /// At assembly: read every member's log, continue its epoch numbering,
    /// and (when `repair`) recompute the parity of every stripe a logged
    /// write was changing. Returns the number of stripes repaired.
    pub(crate) fn ppl_recover(&self, repair: bool) -> crate::array::ArrayResult<usize> {
        use crate::array::worker::Op;
        let Some(ppl) = &self.ppl else { return Ok(0) };
        let mut newest = 0;
        let mut logged = Vec::new();
        for (slot, member) in self.present_members() {
            if let Some((epoch, entries)) = ppl.read_ring(member.as_ref()) {
                newest = newest.max(epoch);
                logged.extend(entries.into_iter().map(|e| (slot, e)));
            }
        }
        ppl.resume(newest);
        if !repair {
            return Ok(0);
        }
        logged.retain(|(_, e)| e.epoch == newest);
        logged.sort_by_key(|(_, e)| e.seq);
        let mut repaired = 0;
        let group_size = self.sb.lock().group_size;
        for (parity_slot, e) in logged {
            let Some(region) = self.group_region(e.group) else {
                continue;
            };
            let members = self.stripe_slots(&region, e.stripe);
            let k = region.geometry.data_chunks();
            if members.get(k) != Some(&parity_slot) {
                continue;
            }
            // A modified chunk on a lost member was being written: nothing
            // that was not being written depends on this stripe's parity.
            if e.modified
                .iter()
                .any(|&i| members.get(i).is_none_or(|&m| self.is_failed(m)))
            {
                continue;
            }
            let len = e.partial_parity.len();
            // An entry is checksummed, not trusted: its window must lie in
            // one chunk of a stripe inside the group.
            let chunk = region.geometry.chunk;
            let stripe_start = e.stripe.checked_mul(chunk);
            if e.lo.saturating_add(len as u64) > chunk
                || stripe_start.is_none_or(|s| s.saturating_add(chunk) > group_size)
            {
                log::warn!(
                    "PPL entry {} (group {} stripe {}) lies outside its group; ignored",
                    e.seq,
                    e.group,
                    e.stripe
                );
                continue;
            }
            let at = region.base + e.stripe * chunk + e.lo;
            let jobs = e
                .modified
                .iter()
                .map(|&i| (members[i], Op::Read { offset: at, len }))
                .collect();
            let mut parity = e.partial_parity.clone();
            for outcome in self.pool.run(jobs) {
                let bytes = outcome.map_err(|err| {
                    crate::array::ArrayError::Refused(format!("reading a logged stripe: {err}"))
                })?;
                self.parity.xor_into(&mut parity, &bytes);
            }
            let job = vec![(
                parity_slot,
                Op::Write {
                    offset: at,
                    data: Arc::from(parity),
                    range: 0..len,
                },
            )];
            if let Some(Err(err)) = self.pool.run(job).pop() {
                return Err(crate::array::ArrayError::Refused(format!(
                    "rewriting logged parity: {err}"
                )));
            }
            repaired += 1;
        }
        self.flush()?;
        Ok(repaired)
    }
}
