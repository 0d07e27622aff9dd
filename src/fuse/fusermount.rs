//! Mounting through `fusermount3`, the setuid helper that lets a user who
//! is not root mount FUSE: it opens /dev/fuse (which may be root's alone,
//! mode 0600), mounts it on a directory the user may write and passes the
//! open device back over a socket named by `_FUSE_COMMFD`. fuser reaches
//! the helper only after opening /dev/fuse itself, which fails where the
//! device is root's, so raidfs asks the helper directly for users.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};

use fuser::{MountOption, SessionACL};

/// The helper, found on `PATH` as libfuse finds it.
pub const FUSERMOUNT: &str = "fusermount3";

/// The `-o` text fusermount3 takes for these options.
pub fn option_text(options: &[MountOption], acl: SessionACL) -> String {
    let mut words: Vec<String> = options
        .iter()
        .map(|option| match option {
            MountOption::FSName(name) => format!("fsname={name}"),
            MountOption::Subtype(subtype) => format!("subtype={subtype}"),
            MountOption::CUSTOM(text) => text.clone(),
            MountOption::AutoUnmount => "auto_unmount".into(),
            MountOption::DefaultPermissions => "default_permissions".into(),
            MountOption::Dev => "dev".into(),
            MountOption::NoDev => "nodev".into(),
            MountOption::Suid => "suid".into(),
            MountOption::NoSuid => "nosuid".into(),
            MountOption::RO => "ro".into(),
            MountOption::RW => "rw".into(),
            MountOption::Exec => "exec".into(),
            MountOption::NoExec => "noexec".into(),
            MountOption::Atime => "atime".into(),
            MountOption::NoAtime => "noatime".into(),
            MountOption::DirSync => "dirsync".into(),
            MountOption::Sync => "sync".into(),
            MountOption::Async => "async".into(),
        })
        .collect();
    match acl {
        // fuser itself turns away everyone but root and the owner.
        SessionACL::All | SessionACL::RootAndOwner => words.push("allow_other".into()),
        SessionACL::Owner => {}
    }
    words.join(",")
}

/// Mount FUSE on `mount_point` through fusermount3 with `options` (as
/// [`option_text`] makes them); returns the connection's /dev/fuse.
pub fn mount(mount_point: &Path, options: &str) -> io::Result<OwnedFd> {
    let (ours, theirs) = UnixStream::pair()?;
    let their_fd = theirs.as_raw_fd();
    let mut command = Command::new(FUSERMOUNT);
    command
        .arg("-o")
        .arg(options)
        .arg("--")
        .arg(mount_point)
        .env("_FUSE_COMMFD", their_fd.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs between fork and exec and calls only fcntl,
    // which is async-signal-safe. The helper's end of the socket must
    // survive the exec; every other descriptor keeps its close-on-exec.
    unsafe {
        command.pre_exec(move || {
            let flags = libc::fcntl(their_fd, libc::F_GETFD);
            if flags < 0 || libc::fcntl(their_fd, libc::F_SETFD, flags & !libc::FD_CLOEXEC) < 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("cannot run {FUSERMOUNT} (needed to mount as a user other than root): {e}"),
        )
    })?;
    drop(theirs);
    let received = receive_fd(&ours);
    // The helper exits once it has sent the device (or failed); its
    // message says why it refused.
    drop(ours);
    let output = child.wait_with_output()?;
    let said = String::from_utf8_lossy(&output.stderr).trim().to_string();
    match received {
        Ok(fd) if output.status.success() => Ok(fd),
        Ok(_) | Err(_) if !said.is_empty() => {
            Err(io::Error::other(format!("{FUSERMOUNT}: {said}")))
        }
        Ok(_) => Err(io::Error::other(format!(
            "{FUSERMOUNT} failed ({})",
            output.status
        ))),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!("{FUSERMOUNT} ({}) sent no FUSE device: {e}", output.status),
        )),
    }
}

/// One byte carrying one descriptor (SCM_RIGHTS), as fusermount3 sends it.
fn receive_fd(socket: &UnixStream) -> io::Result<OwnedFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: byte.len(),
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = [0u64; 8];
    // SAFETY: msghdr is plain data; the fields set below make it valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&control) as _;
    let n = loop {
        // SAFETY: msg points at iov and control, both alive for the call.
        let n = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n >= 0 {
            break n;
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    };
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "the socket closed first",
        ));
    }
    // SAFETY: msg was filled by recvmsg; CMSG_FIRSTHDR checks the length.
    let header = unsafe { libc::CMSG_FIRSTHDR(&msg) };
    if header.is_null() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a message without a descriptor",
        ));
    }
    // SAFETY: header points into control, within msg_controllen.
    let (level, kind, len) = unsafe {
        (
            (*header).cmsg_level,
            (*header).cmsg_type,
            (*header).cmsg_len,
        )
    };
    // SAFETY: CMSG_LEN only computes a size.
    let wanted = unsafe { libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    if level != libc::SOL_SOCKET || kind != libc::SCM_RIGHTS || len < wanted {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a control message other than one descriptor",
        ));
    }
    // SAFETY: the checks above make CMSG_DATA hold at least one c_int.
    let fd = unsafe { std::ptr::read_unaligned(libc::CMSG_DATA(header).cast::<libc::c_int>()) };
    if fd < 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "a negative descriptor",
        ));
    }
    // SAFETY: SCM_RIGHTS made fd a new descriptor of this process, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_spelled_as_fusermount3_takes_them() {
        let options = [
            MountOption::FSName("raidfs".into()),
            MountOption::Subtype("raidfs".into()),
            MountOption::RW,
            MountOption::DefaultPermissions,
        ];
        assert_eq!(
            option_text(&options, SessionACL::Owner),
            "fsname=raidfs,subtype=raidfs,rw,default_permissions"
        );
        assert_eq!(
            option_text(&[MountOption::RO], SessionACL::All),
            "ro,allow_other"
        );
    }

    #[test]
    fn a_descriptor_passed_over_the_socket_arrives() {
        let (a, b) = UnixStream::pair().unwrap();
        let file = tempfile::tempfile().unwrap();
        let byte = [0u8; 1];
        let iov = libc::iovec {
            iov_base: byte.as_ptr() as *mut _,
            iov_len: 1,
        };
        let mut control = [0u64; 8];
        // SAFETY: test-only mirror of what fusermount3 sends.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &iov as *const _ as *mut _;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let h = libc::CMSG_FIRSTHDR(&msg);
            (*h).cmsg_level = libc::SOL_SOCKET;
            (*h).cmsg_type = libc::SCM_RIGHTS;
            (*h).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<libc::c_int>(), file.as_raw_fd());
            assert_eq!(libc::sendmsg(a.as_raw_fd(), &msg, 0), 1);
        }
        let got = receive_fd(&b).unwrap();
        let same = |fd: i32| {
            // SAFETY: fstat fills st for an open descriptor.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            assert_eq!(unsafe { libc::fstat(fd, &mut st) }, 0);
            (st.st_dev, st.st_ino)
        };
        assert_eq!(same(got.as_raw_fd()), same(file.as_raw_fd()));
        drop(a);
        assert_eq!(
            receive_fd(&b).unwrap_err().kind(),
            io::ErrorKind::UnexpectedEof
        );
    }
}
