//! The NBD wire protocol's numbers (the NBD project's `doc/proto.md`):
//! magics, options and their replies, transmission flags, commands and
//! reply chunks, and the protocol's error values. Nothing here does I/O.

/// `NBDMAGIC`, the first thing a server sends.
pub const INIT_MAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`: the newstyle server greeting and every option's prefix.
pub const OPT_MAGIC: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply.
pub const OPT_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;

/// Handshake flags (server) and client flags.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
pub const CLIENT_FIXED_NEWSTYLE: u32 = 1 << 0;
pub const CLIENT_NO_ZEROES: u32 = 1 << 1;

/// Options.
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;

/// Option reply types; errors have bit 31 set.
pub const REP_ACK: u32 = 1;
pub const REP_INFO: u32 = 3;
pub const REP_ERR_BIT: u32 = 1 << 31;
pub const REP_ERR_UNSUP: u32 = REP_ERR_BIT | 1;
pub const REP_ERR_POLICY: u32 = REP_ERR_BIT | 2;
pub const REP_ERR_INVALID: u32 = REP_ERR_BIT | 3;
pub const REP_ERR_PLATFORM: u32 = REP_ERR_BIT | 4;
pub const REP_ERR_TLS_REQD: u32 = REP_ERR_BIT | 5;
pub const REP_ERR_UNKNOWN: u32 = REP_ERR_BIT | 6;
pub const REP_ERR_SHUTDOWN: u32 = REP_ERR_BIT | 7;
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_ERR_BIT | 8;
pub const REP_ERR_TOO_BIG: u32 = REP_ERR_BIT | 9;

/// Information items of `NBD_OPT_GO`.
pub const INFO_EXPORT: u16 = 0;
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flags.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
pub const FLAG_READ_ONLY: u16 = 1 << 1;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_ROTATIONAL: u16 = 1 << 4;
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;

/// Requests.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command flags.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// Replies.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;
pub const REPLY_FLAG_DONE: u16 = 1 << 0;
pub const REPLY_TYPE_NONE: u16 = 0;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
pub const REPLY_TYPE_ERROR_BIT: u16 = 1 << 15;
pub const REPLY_TYPE_ERROR: u16 = REPLY_TYPE_ERROR_BIT | 1;
pub const REPLY_TYPE_ERROR_OFFSET: u16 = REPLY_TYPE_ERROR_BIT | 2;

/// Largest payload a client may send or ask for when the server states no
/// maximum (the protocol's advice).
pub const DEFAULT_MAX_PAYLOAD: u32 = 32 << 20;

/// The protocol's error values are Linux's errno numbers for the same
/// conditions; anything else a server sends is treated as EIO.
pub fn errno(value: u32) -> i32 {
    match value {
        1 => libc::EPERM,
        5 => libc::EIO,
        12 => libc::ENOMEM,
        22 => libc::EINVAL,
        28 => libc::ENOSPC,
        75 => libc::EOVERFLOW,
        95 => libc::EOPNOTSUPP,
        108 => libc::ESHUTDOWN,
        _ => libc::EIO,
    }
}

/// An option error reply in words.
pub fn option_error(reply: u32) -> &'static str {
    match reply {
        REP_ERR_UNSUP => "option not supported by the server",
        REP_ERR_POLICY => "refused by the server's policy (no such export, or access denied)",
        REP_ERR_INVALID => "invalid request",
        REP_ERR_PLATFORM => "not supported on the server's platform",
        REP_ERR_TLS_REQD => "the server requires TLS, which raidfs does not speak",
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        REP_ERR_BLOCK_SIZE_REQD => "the server requires block size negotiation",
        REP_ERR_TOO_BIG => "request too big",
        _ => "error",
    }
}
