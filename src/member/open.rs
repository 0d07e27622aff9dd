//! Opening a member by what the user wrote for it: an NBD URI
//! (`nbd://…`, `nbd+unix://…`, see [`super::nbd::uri`]) or a path to an
//! image file or block device. Every place that opens a member by name
//! comes through here, so a URI is never canonicalized, stat'ed or
//! created as a file.

use super::file::{FileMember, OpenOptions};
use super::nbd::{self, NbdMember, NbdOptions};
use super::Member;
use std::io;
use std::path::Path;
use std::sync::Arc;

/// Whether a member argument names an NBD export rather than a path.
pub fn is_uri(member: &Path) -> bool {
    nbd::is_uri(member)
}

/// Open the member `name` names. For a path, `options` apply as to
/// [`FileMember::open`] (creating a sparse image with `create_size`). An
/// NBD export is connected to; it has no lock (the protocol has none) and
/// cannot be created (`create_size` is an error), and it must be writable
/// unless `read_only`.
pub fn open(name: &Path, options: &OpenOptions) -> io::Result<Arc<dyn Member>> {
    if !is_uri(name) {
        return Ok(Arc::new(FileMember::open(name, options.clone())?));
    }
    let text = name.to_str().unwrap_or_default();
    if options.create_size.is_some() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "{text}: an NBD export cannot be created here; serve it first (docs/remote.md)"
            ),
        ));
    }
    let nbd_options = NbdOptions {
        read_only: options.read_only,
        ..NbdOptions::default()
    };
    Ok(Arc::new(NbdMember::connect(text, &nbd_options)?))
}

/// [`open`] for reading only, without taking the lock: for tools that
/// inspect a member that may be in use (examine, probes).
pub fn peek(name: &Path) -> io::Result<Arc<dyn Member>> {
    open(
        name,
        &OpenOptions {
            read_only: true,
            lock: false,
            ..OpenOptions::default()
        },
    )
}
