//! The messages on a control socket: one JSON object per line each way.

use super::report::ArrayReport;
use serde::{Deserialize, Serialize};

/// What a client asks of a mount daemon.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// The array's state, members, background work and limits.
    Status,
    /// Mark a member faulty (by path, name or slot number).
    Fail { member: String },
    /// Take a faulty member (or a spare) out of the array.
    Remove { member: String },
    /// Add an image: it rebuilds a failed slot or waits as a hot spare.
    /// `size` is used when the image does not exist yet; `force` allows
    /// overwriting a member of another array.
    Add {
        path: String,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    /// Copy an active member onto a new image, then swap them.
    Replace {
        old: String,
        new: String,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
    },
    /// Start a scrub; `repair` rewrites redundancy that disagrees. A paused
    /// one of the same kind resumes from its checkpoint unless `restart`.
    Check {
        repair: bool,
        #[serde(default)]
        restart: bool,
    },
    /// Reshape to `level` and/or onto more members (`raidfs grow --level
    /// --add`), grow onto larger members (`member_size`, `--size max`),
    /// or, with none of them, go on with a reshape that was stopped.
    Grow {
        #[serde(default)]
        level: Option<crate::geometry::Level>,
        /// Images to add as new members (`--add`); `size` and `force` as
        /// for `Add`.
        #[serde(default)]
        add: Vec<String>,
        #[serde(default)]
        size: Option<u64>,
        #[serde(default)]
        force: bool,
        /// The data area every member should have (`grow --size`), alone.
        #[serde(default)]
        member_size: Option<crate::array::SizeTarget>,
    },
    /// Stop the running background work (it checkpoints first).
    Stop,
    /// Set md's speed_limit_min / speed_limit_max, bytes per second (0 = none).
    SpeedLimit {
        #[serde(default)]
        min: Option<u64>,
        #[serde(default)]
        max: Option<u64>,
    },
    /// Commit the journal and flush every member now (`raidfs sync`).
    Sync,
    /// `mount -o remount,ro|rw`: stop taking changes (commit, mark the
    /// array clean) or take them again (mark it in use). The kernel side
    /// of the remount is the helper's.
    Remount { read_only: bool },
}

impl Request {
    /// Whether the request changes the array (and so needs root or the owner).
    /// A sync only makes durable what was already written, like sync(2),
    /// which anyone may call; on a read-only mount it has nothing to commit.
    pub fn changes_array(&self) -> bool {
        !matches!(self, Request::Status | Request::Sync)
    }
}

/// The daemon's answer: `ok` with a message and the array's state after
/// the request, or the reason it was refused.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<ArrayReport>,
}

impl Response {
    pub fn refused(error: impl Into<String>) -> Response {
        Response {
            ok: false,
            error: Some(error.into()),
            message: None,
            report: None,
        }
    }

    pub fn done(message: Option<String>, report: ArrayReport) -> Response {
        Response {
            ok: true,
            error: None,
            message,
            report: Some(report),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_tagged_json_objects() {
        let add = Request::Add {
            path: "/img/new".into(),
            size: Some(1 << 26),
            force: false,
        };
        let text = serde_json::to_string(&add).expect("serialise");
        assert_eq!(
            text,
            r#"{"op":"add","path":"/img/new","size":67108864,"force":false}"#
        );
        let back: Request =
            serde_json::from_str(r#"{"op":"add","path":"/img/new"}"#).expect("parse");
        assert_eq!(
            back,
            Request::Add {
                path: "/img/new".into(),
                size: None,
                force: false
            }
        );
        let status: Request = serde_json::from_str(r#"{"op":"status"}"#).expect("parse");
        assert!(!status.changes_array());
        assert!(Request::Stop.changes_array());
        let sync: Request = serde_json::from_str(r#"{"op":"sync"}"#).expect("parse");
        assert_eq!(sync, Request::Sync);
        assert!(!sync.changes_array());
    }
}
