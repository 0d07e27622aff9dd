//! The handshake: fixed newstyle negotiation up to the transmission phase.
//!
//! Structured replies are asked for first (`NBD_OPT_STRUCTURED_REPLY`), then
//! the export with `NBD_OPT_GO`, asking for its block-size constraints
//! (`NBD_INFO_BLOCK_SIZE`). Only a server that does not know `NBD_OPT_GO`
//! gets the old `NBD_OPT_EXPORT_NAME`, which has no way to say why an
//! export is refused. Oldstyle servers are refused.

use super::proto::*;
use std::io::{self, Read, Write};

/// Largest option reply read (an error message, an export description);
/// anything longer is a broken or hostile server.
const MAX_OPTION_REPLY: u32 = 64 << 10;

/// What the handshake settled.
#[derive(Clone, Debug)]
pub struct Export {
    pub size: u64,
    /// Transmission flags.
    pub flags: u16,
    /// Requests must be aligned to this (offset and length); a power of two.
    pub min_block: u32,
    /// The server's preferred request granularity (a hint).
    pub pref_block: u32,
    /// Largest payload of one read or write, a multiple of `min_block`.
    pub max_payload: u32,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// The export was opened with `NBD_OPT_GO` (else `NBD_OPT_EXPORT_NAME`).
    pub go: bool,
}

impl Export {
    pub fn has(&self, flag: u16) -> bool {
        self.flags & FLAG_HAS_FLAGS != 0 && self.flags & flag != 0
    }
}

fn protocol(why: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, why.into())
}

fn read_u16(s: &mut impl Read) -> io::Result<u16> {
    let mut b = [0u8; 2];
    s.read_exact(&mut b)?;
    Ok(u16::from_be_bytes(b))
}

fn read_u32(s: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    s.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(s: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    s.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

fn send_option(s: &mut impl Write, option: u32, data: &[u8]) -> io::Result<()> {
    let mut msg = Vec::with_capacity(16 + data.len());
    msg.extend_from_slice(&OPT_MAGIC.to_be_bytes());
    msg.extend_from_slice(&option.to_be_bytes());
    let len = u32::try_from(data.len()).map_err(|_| protocol("option data too long"))?;
    msg.extend_from_slice(&len.to_be_bytes());
    msg.extend_from_slice(data);
    s.write_all(&msg)?;
    s.flush()
}

/// One option reply: its type and data.
fn read_reply(s: &mut impl Read, option: u32) -> io::Result<(u32, Vec<u8>)> {
    if read_u64(s)? != OPT_REPLY_MAGIC {
        return Err(protocol("bad option reply magic"));
    }
    let answered = read_u32(s)?;
    if answered != option {
        return Err(protocol(format!(
            "option reply for option {answered}, expected {option}"
        )));
    }
    let kind = read_u32(s)?;
    let len = read_u32(s)?;
    if len > MAX_OPTION_REPLY {
        return Err(protocol(format!("option reply of {len} bytes")));
    }
    let mut data = vec![0u8; len as usize];
    s.read_exact(&mut data)?;
    Ok((kind, data))
}

/// An option error reply as an error, with the server's message if any.
fn refused(option: &str, kind: u32, data: &[u8]) -> io::Error {
    let said = String::from_utf8_lossy(data);
    let why = option_error(kind);
    let message = if said.trim().is_empty() {
        format!("{option}: {why}")
    } else {
        format!("{option}: {why}: {}", said.trim())
    };
    let kind = match kind {
        REP_ERR_POLICY => io::ErrorKind::PermissionDenied,
        REP_ERR_UNKNOWN => io::ErrorKind::NotFound,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, message)
}

/// Negotiate `export` on a freshly connected stream.
pub fn negotiate<S: Read + Write>(s: &mut S, export: &str) -> io::Result<Export> {
    if read_u64(s)? != INIT_MAGIC {
        return Err(protocol("not an NBD server (no NBDMAGIC greeting)"));
    }
    match read_u64(s)? {
        OPT_MAGIC => {}
        0x0000_4202_8186_1253 => {
            return Err(protocol(
                "the server speaks only the oldstyle handshake, which has no export names; run it in newstyle mode",
            ))
        }
        _ => return Err(protocol("unknown handshake magic")),
    }
    let server_flags = read_u16(s)?;
    let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
    let fixed = server_flags & FLAG_FIXED_NEWSTYLE != 0;
    let mut client_flags = 0;
    if fixed {
        client_flags |= CLIENT_FIXED_NEWSTYLE;
    }
    if no_zeroes {
        client_flags |= CLIENT_NO_ZEROES;
    }
    s.write_all(&client_flags.to_be_bytes())?;
    if export.len() > 4096 {
        return Err(protocol("export name longer than 4096 bytes"));
    }
    if !fixed {
        // Plain newstyle: one option, and only this one.
        return export_name(s, export, no_zeroes, false);
    }
    send_option(s, OPT_STRUCTURED_REPLY, &[])?;
    let (kind, data) = read_reply(s, OPT_STRUCTURED_REPLY)?;
    let structured = match kind {
        REP_ACK => true,
        k if k & REP_ERR_BIT != 0 => false,
        k => {
            return Err(protocol(format!(
                "unexpected reply {k} to NBD_OPT_STRUCTURED_REPLY ({} bytes)",
                data.len()
            )))
        }
    };
    match go(s, export, structured)? {
        Some(found) => Ok(found),
        None => export_name(s, export, no_zeroes, structured),
    }
}

/// `NBD_OPT_GO`; None when the server does not know the option.
fn go<S: Read + Write>(s: &mut S, export: &str, structured: bool) -> io::Result<Option<Export>> {
    let mut data = Vec::with_capacity(8 + export.len());
    data.extend_from_slice(&(export.len() as u32).to_be_bytes());
    data.extend_from_slice(export.as_bytes());
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(s, OPT_GO, &data)?;
    let mut size_flags = None;
    let mut blocks = None;
    loop {
        let (kind, data) = read_reply(s, OPT_GO)?;
        match kind {
            REP_ACK => break,
            REP_INFO => {
                if data.len() < 2 {
                    return Err(protocol("short NBD_REP_INFO"));
                }
                let info = u16::from_be_bytes([data[0], data[1]]);
                let body = &data[2..];
                match info {
                    INFO_EXPORT if body.len() == 10 => {
                        let size = u64::from_be_bytes(body[..8].try_into().unwrap_or_default());
                        let flags = u16::from_be_bytes([body[8], body[9]]);
                        size_flags = Some((size, flags));
                    }
                    INFO_BLOCK_SIZE if body.len() == 12 => {
                        let word = |i: usize| {
                            u32::from_be_bytes(body[i..i + 4].try_into().unwrap_or_default())
                        };
                        blocks = Some((word(0), word(4), word(8)));
                    }
                    INFO_EXPORT | INFO_BLOCK_SIZE => {
                        return Err(protocol(format!("NBD_INFO {info} of the wrong length")))
                    }
                    // Names and descriptions, or items from newer servers.
                    _ => {}
                }
            }
            REP_ERR_UNSUP => return Ok(None),
            k if k & REP_ERR_BIT != 0 => return Err(refused("NBD_OPT_GO", k, &data)),
            k => return Err(protocol(format!("unexpected reply {k} to NBD_OPT_GO"))),
        }
    }
    let (size, flags) =
        size_flags.ok_or_else(|| protocol("NBD_OPT_GO succeeded without NBD_INFO_EXPORT"))?;
    let (min_block, pref_block, max_payload) = block_sizes(blocks);
    Ok(Some(Export {
        size,
        flags,
        min_block,
        pref_block,
        max_payload,
        structured,
        go: true,
    }))
}

/// The constraints to honour, from what the server sent (min, preferred,
/// max). A set that breaks the protocol's rules is ignored (a server that
/// sends nonsense gets the defaults: any alignment, 32 MiB payloads).
fn block_sizes(sent: Option<(u32, u32, u32)>) -> (u32, u32, u32) {
    let default = (1, 4096, DEFAULT_MAX_PAYLOAD);
    let Some((min, pref, max)) = sent else {
        return default;
    };
    let valid = min.is_power_of_two()
        && min <= 64 << 10
        && pref.is_power_of_two()
        && pref >= min
        && max >= min
        && (max == u32::MAX || max.is_multiple_of(min));
    if !valid {
        log::warn!(
            "NBD server sent invalid block sizes (minimum {min}, preferred {pref}, maximum {max}); ignoring them"
        );
        return default;
    }
    let max = max.min(DEFAULT_MAX_PAYLOAD.max(min));
    (min, pref, max / min * min)
}

/// `NBD_OPT_EXPORT_NAME`: the server answers with the export or hangs up.
fn export_name<S: Read + Write>(
    s: &mut S,
    export: &str,
    no_zeroes: bool,
    structured: bool,
) -> io::Result<Export> {
    send_option(s, OPT_EXPORT_NAME, export.as_bytes())?;
    let answer = (|| -> io::Result<(u64, u16)> {
        let size = read_u64(s)?;
        let flags = read_u16(s)?;
        if !no_zeroes {
            let mut zeros = [0u8; 124];
            s.read_exact(&mut zeros)?;
        }
        Ok((size, flags))
    })();
    let (size, flags) = answer.map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => io::Error::new(
            io::ErrorKind::NotFound,
            "the server closed the connection at NBD_OPT_EXPORT_NAME (no such export?)",
        ),
        _ => e,
    })?;
    Ok(Export {
        size,
        flags,
        min_block: 1,
        pref_block: 4096,
        max_payload: DEFAULT_MAX_PAYLOAD,
        structured,
        go: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sizes_are_checked_and_capped() {
        assert_eq!(block_sizes(None), (1, 4096, 32 << 20));
        assert_eq!(
            block_sizes(Some((512, 4096, u32::MAX))),
            (512, 4096, 32 << 20)
        );
        assert_eq!(
            block_sizes(Some((4096, 65536, 1 << 20))),
            (4096, 65536, 1 << 20)
        );
        // Not a power of two: ignored.
        assert_eq!(block_sizes(Some((3, 4096, 1 << 20))), (1, 4096, 32 << 20));
    }
}
