//! raidfs: a RAID filesystem in userspace.
//!
//! The modules are layers; each depends only on those listed above it:
//!
//! 0. [`notice`]: messages for the person at the terminal (relayed by a mount daemon);
//!    [`features`]: the compat / ro-compat / incompat rules every on-disk header follows;
//!    [`handoff`]: the queue that hands work between threads without spinning.
//! 1. [`member`]: member devices (image files, block devices, a simulated disk;
//!    in-memory and fault-injecting doubles for tests, with the `testing` feature).
//! 2. [`parity`]: XOR and RAID6 P+Q kernels, benchmarked and chosen at start.
//! 3. [`geometry`]: where a logical byte lives on which member, for every RAID level.
//! 4. [`superblock`]: the per-member identity and state record.
//! 5. [`array`]: the engine (groups, reads, writes, degraded mode, assembly).
//! 6. [`fs`]: the POSIX filesystem on the array's logical space (inodes, journal).
//! 7. [`volume`]: an array with its filesystem open, started and stopped in order.
//! 8. [`fuse`]: the only module that speaks FUSE.
//! 9. [`control`]: the control socket of a running mount (status, member changes).
//! 10. [`cli`]: the `raidfs` command.

pub mod array;
pub mod cli;
pub mod control;
pub mod features;
pub mod fs;
pub mod fuse;
pub mod geometry;
pub mod handoff;
pub mod member;
pub mod notice;
pub mod parity;
pub mod superblock;
pub mod volume;
