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

/// What makes two member names the same member: the file or device they
/// reach, whatever the path (a symlink, a hard link, a bind mount), or
/// the URI as written for an NBD export.
#[derive(Debug, PartialEq, Eq, Hash)]
enum Identity {
    /// A regular file: its device and inode.
    File(u64, u64),
    /// A block device: the device it is (two nodes for one device match).
    Device(u64),
    Uri(String),
    /// Not there yet (create makes it): the absolute path.
    Missing(std::path::PathBuf),
}

fn identity(name: &Path) -> Option<Identity> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if is_uri(name) {
        return Some(Identity::Uri(name.to_string_lossy().into_owned()));
    }
    // A name that cannot be stat'ed is compared as written (absolute);
    // the open says why it cannot be used.
    let Ok(meta) = std::fs::metadata(name) else {
        return std::path::absolute(name).ok().map(Identity::Missing);
    };
    if meta.file_type().is_block_device() {
        Some(Identity::Device(meta.rdev()))
    } else {
        Some(Identity::File(meta.dev(), meta.ino()))
    }
}

/// The first member named twice, as an error naming both arguments: a
/// member listed twice would otherwise wait for its own lock, or be
/// written as two members.
pub fn refuse_repeated(names: &[impl AsRef<Path>]) -> Result<(), String> {
    let mut seen = std::collections::HashMap::new();
    for (i, name) in names.iter().enumerate() {
        let name = name.as_ref();
        let Some(id) = identity(name) else { continue };
        if let Some(&first) = seen.get(&id) {
            let earlier: &Path = AsRef::<Path>::as_ref(&names[first]);
            return Err(if earlier == name {
                format!("member {} is named twice", name.display())
            } else {
                format!(
                    "members {} and {} are the same {}",
                    earlier.display(),
                    name.display(),
                    match id {
                        Identity::Device(_) => "device",
                        Identity::Uri(_) => "export",
                        Identity::File(..) | Identity::Missing(_) => "file",
                    }
                )
            });
        }
        seen.insert(id, i);
    }
    Ok(())
}
