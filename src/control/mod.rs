//! The control channel of a running mount: a Unix socket per mount daemon
//! carrying newline-delimited JSON requests (status, fail, remove, add,
//! replace, check/repair, stop, speed limits, sync) and their responses.
//!
//! The daemon runs a [`ControlServer`] holding the array and its
//! filesystem; `raidfs status`, `detail`, `fail` and friends talk to it
//! through a [`ControlClient`]. Anyone who can open the socket may ask for
//! status or a sync; only root or the mount's owner (checked with
//! `SO_PEERCRED`) may change the array.

mod client;
pub mod metrics;
pub mod metrics_http;
mod ops;
mod protocol;
mod report;
mod server;

pub use client::{ControlClient, ControlError};
pub use protocol::{Request, Response};
pub use report::{
    ArrayReport, DamagedReport, DataErrorReport, IoReport, LastSyncReport, MemberReport,
    ReplacementReport, SpeedLimitReport, SyncReport, REPORT_VERSION,
};
pub use server::{load_saved_limits, saved_limits_path, ControlServer, MountContext};
