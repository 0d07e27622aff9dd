//! NFS-style file handles on a raidfs mount: name_to_handle_at, evict the
//! kernel's caches, then open_by_handle_at must still find the inode.

mod common;

use std::ffi::CString;
use std::fs::{self, File};
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::{fuse_available, mount_mem};
use raidfs::fuse::MountConfig;

const MAX_HANDLE_SZ: usize = 128;

/// `struct file_handle` with room for the handle bytes.
#[repr(C)]
struct FileHandle {
    handle_bytes: u32,
    handle_type: i32,
    f_handle: [u8; MAX_HANDLE_SZ],
}

fn name_to_handle(path: &Path) -> FileHandle {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    let mut handle = FileHandle {
        handle_bytes: MAX_HANDLE_SZ as u32,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE_SZ],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: handle has room for MAX_HANDLE_SZ bytes as declared in handle_bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c_path.as_ptr(),
            &mut handle as *mut FileHandle,
            &mut mount_id as *mut libc::c_int,
            0,
        )
    };
    assert_eq!(
        rc,
        0,
        "name_to_handle_at({}): {}",
        path.display(),
        std::io::Error::last_os_error()
    );
    handle
}

fn open_by_handle(
    mount_fd: &File,
    handle: &mut FileHandle,
    flags: i32,
) -> std::io::Result<OwnedFd> {
    // SAFETY: handle is a valid file_handle filled by name_to_handle_at.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            mount_fd.as_raw_fd(),
            handle as *mut FileHandle,
            flags,
        )
    } as i32;
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a new descriptor owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drop_caches() {
    fs::write("/proc/sys/vm/drop_caches", b"2").expect("write /proc/sys/vm/drop_caches");
}

#[test]
fn handles_of_a_file_and_a_directory_survive_cache_eviction() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    fs::create_dir(mnt.join("dir")).unwrap();
    fs::write(mnt.join("dir/file"), b"exported").unwrap();
    let file_ino = fs::metadata(mnt.join("dir/file")).unwrap().ino();
    let dir_ino = fs::metadata(mnt.join("dir")).unwrap().ino();

    let mut file_handle = name_to_handle(&mnt.join("dir/file"));
    let mut dir_handle = name_to_handle(&mnt.join("dir"));
    let mount_fd = File::open(mnt.path()).unwrap();
    drop_caches();

    let fd = open_by_handle(&mount_fd, &mut file_handle, libc::O_RDONLY)
        .expect("open_by_handle_at(file)");
    let mut file = File::from(fd);
    assert_eq!(file.metadata().unwrap().ino(), file_ino);
    let mut text = String::new();
    file.read_to_string(&mut text).unwrap();
    assert_eq!(text, "exported");

    let fd = open_by_handle(
        &mount_fd,
        &mut dir_handle,
        libc::O_RDONLY | libc::O_DIRECTORY,
    )
    .expect("open_by_handle_at(dir)");
    let dir = File::from(fd);
    assert_eq!(dir.metadata().unwrap().ino(), dir_ino);
    drop((file, dir, mount_fd));
}

#[test]
fn handle_of_a_deleted_file_is_stale() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    fs::write(mnt.join("gone"), b"x").unwrap();
    let mut handle = name_to_handle(&mnt.join("gone"));
    fs::remove_file(mnt.join("gone")).unwrap();
    let mount_fd = File::open(mnt.path()).unwrap();
    drop_caches();
    let err = open_by_handle(&mount_fd, &mut handle, libc::O_RDONLY)
        .expect_err("deleted file must not open");
    assert_eq!(err.raw_os_error(), Some(libc::ESTALE), "{err}");
}
