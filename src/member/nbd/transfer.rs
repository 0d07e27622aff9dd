//! Turning one member operation into NBD requests on a connection: split
//! at the export's maximum payload, up to a window of requests in flight,
//! every one waited for before the operation returns; and the alignment
//! the export's minimum block size asks for.

use super::conn::{Conn, Failure, Ticket};
use super::proto::{CMD_READ, CMD_WRITE};

/// Requests one call keeps in flight at once (a large transfer split at
/// the server's maximum payload).
const WINDOW: usize = 16;

/// A request that failed: what it was and why.
pub(super) struct Failed {
    pub(super) what: String,
    pub(super) failure: Failure,
}

pub(super) type Outcome<T> = Result<T, Failed>;

/// Whether a range is aligned to the export's minimum block size.
pub(super) fn aligned(conn: &Conn, offset: u64, len: u64) -> bool {
    let min = u64::from(conn.export().min_block);
    offset.is_multiple_of(min) && len.is_multiple_of(min)
}

/// The minimum-block-aligned range around `[offset, offset + len)`.
pub(super) fn widen(conn: &Conn, offset: u64, len: u64) -> (u64, u64) {
    let export = conn.export();
    let min = u64::from(export.min_block);
    let start = offset / min * min;
    let end = (offset + len).div_ceil(min) * min;
    (start, end.min(export.size.div_ceil(min) * min))
}

fn submit(
    conn: &Conn,
    command: u16,
    flags: u16,
    at: u64,
    len: u32,
    payload: Option<&[u8]>,
    what: &str,
) -> Outcome<Ticket> {
    conn.submit(command, flags, at, len, payload)
        .map_err(|failure| Failed {
            what: format!("{what} at {at}"),
            failure,
        })
}

/// Wait for a window of tickets, copying reads into `out` (a buffer and
/// the offset it starts at). The first failure wins, but every ticket is
/// waited for so nothing of this call is still in flight.
fn wait_all(
    conn: &Conn,
    tickets: Vec<(Ticket, u64)>,
    what: &str,
    mut out: Option<(&mut [u8], u64)>,
) -> Outcome<()> {
    let mut first = None;
    for (ticket, at) in tickets {
        match conn.wait(ticket) {
            Ok(data) => {
                if let Some((buf, base)) = out.as_mut() {
                    let start = (at - *base) as usize;
                    buf[start..start + data.len()].copy_from_slice(&data);
                }
            }
            Err(failure) => {
                if first.is_none() {
                    first = Some(Failed {
                        what: format!("{what} at {at}"),
                        failure,
                    });
                }
            }
        }
    }
    first.map_or(Ok(()), Err)
}

/// Read an aligned range, split at the maximum payload.
pub(super) fn read_aligned(conn: &Conn, buf: &mut [u8], offset: u64) -> Outcome<()> {
    let max = conn.export().max_payload as usize;
    let mut done = 0;
    while done < buf.len() {
        let mut tickets = Vec::with_capacity(WINDOW);
        let window_start = done;
        while done < buf.len() && tickets.len() < WINDOW {
            let n = max.min(buf.len() - done);
            let at = offset + done as u64;
            tickets.push((submit(conn, CMD_READ, 0, at, n as u32, None, "read")?, at));
            done += n;
        }
        let window = &mut buf[window_start..done];
        wait_all(
            conn,
            tickets,
            "read",
            Some((window, offset + window_start as u64)),
        )?;
    }
    Ok(())
}

/// Write aligned buffers one after another from `offset`, split at the
/// maximum payload, up to a window of requests in flight.
pub(super) fn write_aligned(conn: &Conn, bufs: &[&[u8]], offset: u64, flags: u16) -> Outcome<()> {
    let max = conn.export().max_payload as usize;
    let mut tickets = Vec::with_capacity(WINDOW);
    let mut at = offset;
    for buf in bufs {
        for piece in buf.chunks(max) {
            if tickets.len() == WINDOW {
                wait_all(conn, std::mem::take(&mut tickets), "write", None)?;
            }
            let len = piece.len() as u32;
            let ticket = submit(conn, CMD_WRITE, flags, at, len, Some(piece), "write")?;
            tickets.push((ticket, at));
            at += piece.len() as u64;
        }
    }
    wait_all(conn, tickets, "write", None)
}

/// A payload-free command over a range (trim, write zeroes), split at the
/// maximum payload like the rest.
pub(super) fn ranged(
    conn: &Conn,
    command: u16,
    flags: u16,
    offset: u64,
    len: u64,
    what: &str,
) -> Outcome<()> {
    let max = u64::from(conn.export().max_payload);
    let mut tickets = Vec::with_capacity(WINDOW);
    let mut at = offset;
    while at < offset + len {
        let n = max.min(offset + len - at);
        if tickets.len() == WINDOW {
            wait_all(conn, std::mem::take(&mut tickets), what, None)?;
        }
        tickets.push((submit(conn, command, flags, at, n as u32, None, what)?, at));
        at += n;
    }
    wait_all(conn, tickets, what, None)
}
