//! The FUSE adapter end to end: a filesystem over an in-memory store,
//! mounted in this process, driven through ordinary system calls.

mod common;

use std::ffi::CString;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use common::{fuse_available, mem_store, mount_mem, mount_store, Aligned};
use raidfs::fuse::MountConfig;

fn cstr(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn errno_of(result: std::io::Result<impl Sized>) -> i32 {
    match result {
        Ok(_) => 0,
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

#[test]
fn files_and_directories_through_std_fs() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let file = mnt.join("hello.txt");
    fs::write(&file, b"hello, raid").unwrap();
    assert_eq!(fs::read(&file).unwrap(), b"hello, raid");
    assert_eq!(fs::metadata(&file).unwrap().len(), 11);

    fs::create_dir(mnt.join("dir")).unwrap();
    fs::rename(&file, mnt.join("dir/moved.txt")).unwrap();
    assert!(!file.exists());
    assert_eq!(fs::read(mnt.join("dir/moved.txt")).unwrap(), b"hello, raid");

    let mut names: Vec<_> = fs::read_dir(mnt.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, vec!["dir"]);

    // Errors come back as the right errnos.
    assert_eq!(errno_of(fs::read(mnt.join("missing"))), libc::ENOENT);
    assert_eq!(errno_of(fs::create_dir(mnt.join("dir"))), libc::EEXIST);
    assert_eq!(errno_of(fs::remove_dir(mnt.join("dir"))), libc::ENOTEMPTY);

    fs::remove_file(mnt.join("dir/moved.txt")).unwrap();
    fs::remove_dir(mnt.join("dir")).unwrap();
    assert_eq!(fs::read_dir(mnt.path()).unwrap().count(), 0);
    mnt.unmount().unwrap();
}

#[test]
fn large_directory_lists_every_entry_once() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let count = 600;
    for i in 0..count {
        File::create(mnt.join(&format!("entry-with-a-longish-name-{i:04}"))).unwrap();
    }
    let mut names: Vec<String> = fs::read_dir(mnt.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    let expected: Vec<String> = (0..count)
        .map(|i| format!("entry-with-a-longish-name-{i:04}"))
        .collect();
    assert_eq!(names, expected);
    // readdirplus gave the kernel attributes: stat of each agrees.
    for entry in fs::read_dir(mnt.path()).unwrap().take(5) {
        let entry = entry.unwrap();
        assert_eq!(entry.metadata().unwrap().ino(), entry.ino());
    }
}

/// Every name libc's readdir returns for `dir`, in order, from an open
/// stream (rewound first when `rewind`).
fn read_stream(dir: *mut libc::DIR, rewind: bool) -> Vec<String> {
    let mut names = Vec::new();
    // SAFETY: `dir` is an open stream from opendir; each dirent stays valid
    // until the next readdir on it.
    unsafe {
        if rewind {
            libc::rewinddir(dir);
        }
        loop {
            let entry = libc::readdir(dir);
            if entry.is_null() {
                break;
            }
            let name = std::ffi::CStr::from_ptr((*entry).d_name.as_ptr());
            names.push(name.to_string_lossy().into_owned());
        }
    }
    names
}

#[test]
fn readdir_while_renaming_ends_and_lists_each_entry_once() {
    use std::collections::BTreeSet;
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let dir = mnt.join("busy");
    fs::create_dir(&dir).unwrap();
    let kept = 1000;
    for i in 0..kept {
        File::create(dir.join(format!("keep-{i:04}"))).unwrap();
    }
    let doomed = 100;
    for i in 0..doomed {
        File::create(dir.join(format!("doomed-{i:03}"))).unwrap();
    }
    // As generic/736: each entry read is renamed away and back (so it is
    // inserted afresh) before the next is read; every other one is moved
    // to a new name instead, and files are created and unlinked beside.
    let mut seen = BTreeSet::new();
    let mut current = BTreeSet::new();
    let mut gone = BTreeSet::new();
    let mut count = 0usize;
    for entry in fs::read_dir(&dir).unwrap() {
        count += 1;
        assert!(count <= 3 * (kept + doomed), "the listing does not end");
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(seen.insert(name.clone()), "{name} listed twice");
        // Unlinked here after libc had read it into its buffer.
        if gone.contains(&name) {
            continue;
        }
        let path = dir.join(&name);
        if count.is_multiple_of(2) {
            fs::rename(&path, dir.join("TEMPFILE")).unwrap();
            fs::rename(dir.join("TEMPFILE"), &path).unwrap();
            current.insert(name);
        } else {
            let new = format!("renamed-{count}");
            fs::rename(&path, dir.join(&new)).unwrap();
            current.insert(new);
        }
        if count.is_multiple_of(10) {
            File::create(dir.join(format!("created-{count}"))).unwrap();
            let victim = format!("doomed-{:03}", doomed - count / 10);
            if count / 10 <= doomed && !seen.contains(&victim) {
                fs::remove_file(dir.join(&victim)).unwrap();
                gone.insert(victim);
            }
        }
    }
    for i in 0..kept {
        assert!(
            seen.contains(&format!("keep-{i:04}")),
            "keep-{i:04} missing"
        );
    }
    for name in &seen {
        assert!(
            name.starts_with("keep-") || name.starts_with("doomed-"),
            "{name} was inserted after the listing began"
        );
    }
    assert!(!gone.is_empty());

    // A rewound stream sees the directory as it is now.
    let c_dir = cstr(&dir);
    // SAFETY: a valid NUL-terminated path.
    let stream = unsafe { libc::opendir(c_dir.as_ptr()) };
    assert!(!stream.is_null());
    let first: BTreeSet<String> = read_stream(stream, false).into_iter().collect();
    File::create(dir.join("after-opendir")).unwrap();
    let again = read_stream(stream, true);
    // SAFETY: `stream` is open and not used after this.
    assert_eq!(unsafe { libc::closedir(stream) }, 0);
    let mut expected: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(expected.contains("after-opendir"));
    assert!(expected.is_superset(&current));
    expected.insert(".".into());
    expected.insert("..".into());
    let rewound: BTreeSet<String> = again.iter().cloned().collect();
    assert_eq!(rewound.len(), again.len(), "an entry listed twice");
    assert_eq!(rewound, expected);
    expected.remove("after-opendir");
    assert_eq!(first, expected);
    mnt.unmount().unwrap();
}

#[test]
fn symlinks_hard_links_and_rename_flags() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    fs::write(mnt.join("target"), b"data").unwrap();
    std::os::unix::fs::symlink("target", mnt.join("link")).unwrap();
    assert_eq!(
        fs::read_link(mnt.join("link")).unwrap(),
        Path::new("target")
    );
    assert_eq!(fs::read(mnt.join("link")).unwrap(), b"data");
    assert!(fs::symlink_metadata(mnt.join("link"))
        .unwrap()
        .file_type()
        .is_symlink());

    fs::hard_link(mnt.join("target"), mnt.join("hard")).unwrap();
    let a = fs::metadata(mnt.join("target")).unwrap();
    let b = fs::metadata(mnt.join("hard")).unwrap();
    assert_eq!(a.ino(), b.ino());
    assert_eq!(a.nlink(), 2);
    fs::remove_file(mnt.join("target")).unwrap();
    assert_eq!(fs::metadata(mnt.join("hard")).unwrap().nlink(), 1);
    assert_eq!(fs::read(mnt.join("hard")).unwrap(), b"data");

    // renameat2(RENAME_NOREPLACE) refuses to overwrite.
    fs::write(mnt.join("other"), b"x").unwrap();
    let (from, to) = (cstr(&mnt.join("hard")), cstr(&mnt.join("other")));
    // SAFETY: valid NUL-terminated paths relative to AT_FDCWD.
    let rc = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::RENAME_NOREPLACE,
        )
    };
    assert_eq!(rc, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EEXIST)
    );
    assert_eq!(fs::read(mnt.join("other")).unwrap(), b"x");
}

#[test]
fn extended_attributes_follow_the_size_probe_protocol() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let file = mnt.join("f");
    fs::write(&file, b"").unwrap();
    let path = cstr(&file);
    let name = CString::new("user.colour").unwrap();
    let value = b"ultramarine";
    // SAFETY: all pointers are valid for the lengths given.
    unsafe {
        assert_eq!(
            libc::setxattr(
                path.as_ptr(),
                name.as_ptr(),
                value.as_ptr().cast(),
                value.len(),
                0
            ),
            0
        );
        // Size probe, then a too-small buffer, then the value.
        assert_eq!(
            libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0),
            value.len() as isize
        );
        let mut small = [0u8; 4];
        assert_eq!(
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                small.as_mut_ptr().cast(),
                small.len()
            ),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ERANGE)
        );
        let mut buf = [0u8; 64];
        let n = libc::getxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        );
        assert_eq!(&buf[..n as usize], value);

        let list_len = libc::listxattr(path.as_ptr(), std::ptr::null_mut(), 0);
        assert_eq!(list_len, b"user.colour\0".len() as isize);
        let mut list = [0u8; 64];
        let n = libc::listxattr(path.as_ptr(), list.as_mut_ptr().cast(), list.len());
        assert_eq!(&list[..n as usize], b"user.colour\0");

        assert_eq!(libc::removexattr(path.as_ptr(), name.as_ptr()), 0);
        assert_eq!(
            libc::getxattr(
                path.as_ptr(),
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len()
            ),
            -1
        );
        assert_eq!(
            std::io::Error::last_os_error().raw_os_error(),
            Some(libc::ENODATA)
        );
    }
}

#[test]
fn o_direct_large_aligned_writes_and_reads() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let len = 4 << 20;
    let mut out = Aligned::new(len);
    for (i, b) in out.as_mut().iter_mut().enumerate() {
        *b = (i * 7 % 251) as u8;
    }
    let file = mnt.join("direct.bin");
    let mut w = OpenOptions::new()
        .create(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file)
        .unwrap();
    w.write_all(out.as_mut()).unwrap();
    w.sync_all().unwrap();
    drop(w);

    let mut back = Aligned::new(len);
    let mut r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT)
        .open(&file)
        .unwrap();
    r.read_exact(back.as_mut()).unwrap();
    assert!(
        out.as_mut() == back.as_mut(),
        "O_DIRECT read differs from what was written"
    );
    // An unaligned offset within the file reads correctly through the page cache too.
    let mut plain = File::open(&file).unwrap();
    plain.seek(SeekFrom::Start(12345)).unwrap();
    let mut some = [0u8; 100];
    plain.read_exact(&mut some).unwrap();
    assert_eq!(&some[..], &out.as_mut()[12345..12445]);
}

/// Writes are answered before they are done (`fs::deferred`): a read from
/// another descriptor, a stat, an overwrite and a truncate right after the
/// answer must each see the write, with and without the page cache.
#[test]
fn what_follows_a_write_sees_it() {
    if !fuse_available() {
        return;
    }
    for direct_io in [false, true] {
        let config = MountConfig {
            direct_io,
            ..MountConfig::default()
        };
        let mnt = mount_mem(&config);
        let file = mnt.join("f.bin");
        let mut writer = File::create(&file).unwrap();
        // O_DIRECT, so every read reaches the filesystem rather than the
        // pages the writer's copy left in the kernel.
        let reader = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(&file)
            .unwrap();
        let chunk = 1 << 20;
        let mut back = Aligned::new(chunk);
        let mut expected = Vec::new();
        for i in 0..16usize {
            let data: Vec<u8> = (0..chunk)
                .map(|j| ((i * 131 + j * 7) % 251) as u8)
                .collect();
            writer.write_all(&data).unwrap();
            expected.extend_from_slice(&data);
            std::os::unix::fs::FileExt::read_exact_at(&reader, back.as_mut(), (i * chunk) as u64)
                .unwrap();
            assert!(
                back.as_mut() == &data[..],
                "chunk {i} read back (direct_io {direct_io})"
            );
            assert_eq!(reader.metadata().unwrap().len(), ((i + 1) * chunk) as u64);
        }
        // An overwrite of the middle, then a truncate inside it.
        writer.seek(SeekFrom::Start(3 * chunk as u64 + 5)).unwrap();
        writer.write_all(&[0xEE; 4096]).unwrap();
        expected[3 * chunk + 5..3 * chunk + 5 + 4096].fill(0xEE);
        writer.set_len(3 * chunk as u64 + 100).unwrap();
        expected.truncate(3 * chunk + 100);
        writer.sync_all().unwrap();
        drop(writer);
        assert!(
            fs::read(&file).unwrap() == expected,
            "direct_io {direct_io}"
        );
        assert!(
            mnt.fs()
                .read(fs::metadata(&file).unwrap().ino(), 0, expected.len())
                .unwrap()
                == expected
        );
    }
}

#[test]
fn direct_io_mount_serves_unaligned_parallel_and_mapped_io() {
    if !fuse_available() {
        return;
    }
    let config = MountConfig {
        direct_io: true,
        ..MountConfig::default()
    };
    let mnt = mount_mem(&config);
    let file = mnt.join("shared.bin");
    // Writers of disjoint, unaligned parts of one file at once (the kernel
    // passes direct writes straight through, unaligned buffers included).
    let part = 300_001usize;
    let writers = 4;
    File::create(&file).unwrap();
    std::thread::scope(|scope| {
        for w in 0..writers {
            let file = &file;
            scope.spawn(move || {
                let data: Vec<u8> = (0..part).map(|i| ((i * 13 + w * 7) % 251) as u8).collect();
                let f = OpenOptions::new().write(true).open(file).unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &data[1..], (w * part + 1) as u64)
                    .unwrap();
                std::os::unix::fs::FileExt::write_all_at(&f, &data[..1], (w * part) as u64)
                    .unwrap();
            });
        }
    });
    let expected: Vec<u8> = (0..writers)
        .flat_map(|w| (0..part).map(move |i| ((i * 13 + w * 7) % 251) as u8))
        .collect();
    assert!(
        fs::read(&file).unwrap() == expected,
        "parallel writes differ"
    );
    // A shared read-only mapping still works (FUSE_DIRECT_IO_ALLOW_MMAP).
    let f = File::open(&file).unwrap();
    let len = expected.len();
    // SAFETY: a fresh read-only mapping of an open file, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            std::os::unix::io::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(
        map,
        libc::MAP_FAILED,
        "mmap: {}",
        std::io::Error::last_os_error()
    );
    // SAFETY: the mapping is `len` readable bytes until munmap.
    let mapped = unsafe { std::slice::from_raw_parts(map as *const u8, len) };
    assert!(mapped == &expected[..], "mapped bytes differ");
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(map, len) };

    // No page cache: a change made below the kernel is seen by the next
    // read of an already open (and already read) file.
    let ino = fs::metadata(&file).unwrap().ino();
    let reader = File::open(&file).unwrap();
    let mut first = [0u8; 16];
    std::os::unix::fs::FileExt::read_exact_at(&reader, &mut first, 0).unwrap();
    assert_eq!(&first[..], &expected[..16]);
    mnt.fs().write(ino, 0, &[0xAB; 16]).unwrap();
    std::os::unix::fs::FileExt::read_exact_at(&reader, &mut first, 0).unwrap();
    assert_eq!(first, [0xAB; 16], "a read was served from the page cache");
}

#[test]
fn fsync_fdatasync_and_o_sync_writes() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let mut f = File::create(mnt.join("synced")).unwrap();
    f.write_all(&[1u8; 100_000]).unwrap();
    f.sync_data().unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut s = OpenOptions::new()
        .create(true)
        .write(true)
        .custom_flags(libc::O_SYNC)
        .open(mnt.join("osync"))
        .unwrap();
    s.write_all(b"durable").unwrap();
    drop(s);
    assert_eq!(fs::read(mnt.join("osync")).unwrap(), b"durable");
    let dir = File::open(mnt.path()).unwrap();
    dir.sync_all().unwrap();
}

#[test]
fn fallocate_and_statfs() {
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig::default());
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(mnt.join("prealloc"))
        .unwrap();
    use std::os::fd::AsRawFd;
    // SAFETY: f is an open file descriptor.
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 1 << 20) }, 0);
    assert_eq!(f.metadata().unwrap().len(), 1 << 20);
    drop(f);

    let path = cstr(mnt.path());
    // SAFETY: st is a valid out pointer and path a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(path.as_ptr(), &mut st) }, 0);
    assert!(
        st.f_blocks > 0 && st.f_bfree <= st.f_blocks,
        "statfs: {} of {}",
        st.f_bfree,
        st.f_blocks
    );
    assert!(st.f_bsize > 0);
}

#[test]
fn data_survives_unmount_and_remount() {
    if !fuse_available() {
        return;
    }
    let store = mem_store();
    let mnt = mount_store(store.clone(), &MountConfig::default());
    fs::create_dir(mnt.join("keep")).unwrap();
    fs::write(mnt.join("keep/file"), vec![42u8; 300_000]).unwrap();
    mnt.unmount().expect("clean unmount");

    let again = mount_store(store, &MountConfig::default());
    assert_eq!(
        fs::read(again.join("keep/file")).unwrap(),
        vec![42u8; 300_000]
    );
}

/// `security.capability` granting CAP_NET_RAW (a VFS_CAP_REVISION_2 value
/// with the effective flag), as `setcap cap_net_raw+ep` writes it.
const NET_RAW_CAPABILITY: [u8; 20] = [
    0x01, 0x00, 0x00, 0x02, 0x00, 0x20, 0x00, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
];

/// The mount clears set-ID bits and capabilities itself (it asks the kernel
/// to leave that to it, `FUSE_HANDLE_KILLPRIV_V2`, which spares a GETXATTR
/// round trip before every write): a write by an unprivileged user takes
/// the set-user-ID bit and, on a group-executable file, the set-group-ID
/// bit; so does a truncate; any write takes the capabilities.
#[test]
fn writes_and_truncates_clear_set_id_bits_and_capabilities() {
    use std::os::unix::fs::PermissionsExt;
    if !fuse_available() {
        return;
    }
    let mnt = mount_mem(&MountConfig {
        allow_other: true,
        ..MountConfig::default()
    });
    let parent = mnt.path().parent().expect("mount point has a parent");
    fs::set_permissions(parent, fs::Permissions::from_mode(0o755)).unwrap();
    let file = mnt.join("tool");
    fs::write(&file, b"#!/bin/sh\n").unwrap();
    let path = cstr(&file);
    let name = CString::new("security.capability").unwrap();
    let set_mode =
        |mode: u32| fs::set_permissions(&file, fs::Permissions::from_mode(mode)).unwrap();
    // Only the mode, as `stat -c %a` asks: served from the kernel's
    // attribute cache while that is valid.
    let mode = || {
        // SAFETY: statx fills the zeroed struct it is given; the path is valid.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        let rc =
            unsafe { libc::statx(libc::AT_FDCWD, path.as_ptr(), 0, libc::STATX_MODE, &mut stx) };
        assert_eq!(rc, 0, "statx: {}", std::io::Error::last_os_error());
        u32::from(stx.stx_mode) & 0o7777
    };
    // SAFETY: the pointers are valid for the lengths given.
    let set_caps = || unsafe {
        let value = NET_RAW_CAPABILITY;
        let rc = libc::setxattr(
            path.as_ptr(),
            name.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        );
        assert_eq!(rc, 0, "setxattr: {}", std::io::Error::last_os_error());
    };
    // SAFETY: a size probe: no buffer is passed.
    let has_caps =
        || unsafe { libc::getxattr(path.as_ptr(), name.as_ptr(), std::ptr::null_mut(), 0) >= 0 };
    let as_nobody = |script: &str| {
        let status = std::process::Command::new("setpriv")
            .args([
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "sh",
                "-c",
                script,
            ])
            .arg("sh")
            .arg(&file)
            .output()
            .expect("run setpriv");
        assert!(
            status.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&status.stderr)
        );
    };

    // Root (CAP_FSETID) keeps the set-ID bits, not the capabilities.
    set_mode(0o6777);
    set_caps();
    assert!(has_caps());
    OpenOptions::new()
        .append(true)
        .open(&file)
        .unwrap()
        .write_all(b"true\n")
        .unwrap();
    assert_eq!(mode(), 0o6777);
    assert!(!has_caps(), "a write kept the capabilities");

    // An unprivileged writer loses both set-ID bits, and the capabilities.
    set_caps();
    as_nobody("printf x >> \"$1\"");
    assert_eq!(mode(), 0o777, "a write by nobody kept set-ID bits");
    assert!(!has_caps(), "a write by nobody kept the capabilities");

    // Set-group-ID without group execute goes when the writer is not in
    // the file's group (the VFS's setattr_should_drop_sgid) ...
    set_mode(0o6767);
    as_nobody("printf x >> \"$1\"");
    assert_eq!(mode(), 0o767);
    // ... and stays for a writer in it.
    std::os::unix::fs::chown(&file, None, Some(65534)).unwrap();
    set_mode(0o6767);
    as_nobody("printf x >> \"$1\"");
    assert_eq!(mode(), 0o2767);
    std::os::unix::fs::chown(&file, None, Some(0)).unwrap();

    // A truncate by nobody clears them too.
    set_mode(0o6777);
    as_nobody("truncate -s 1 \"$1\"");
    assert_eq!(mode(), 0o777, "a truncate by nobody kept set-ID bits");
    assert_eq!(fs::metadata(&file).unwrap().len(), 1);

    // A new owner takes the set-ID bits and the capabilities, even from root.
    set_mode(0o6777);
    set_caps();
    std::os::unix::fs::chown(&file, Some(1000), Some(1000)).unwrap();
    assert_eq!(mode(), 0o777);
    assert!(!has_caps(), "chown kept the capabilities");
}

/// A mount whose session ended because someone unmounted it (umount(8),
/// not `raidfs umount`) must not unmount whatever was mounted on the same
/// directory since: a script that unmounts and mounts the next array at
/// once lost the new mount when the old daemon's session was joined.
#[test]
fn a_session_ended_by_umount_leaves_the_next_mount_on_its_directory_alone() {
    if !fuse_available() {
        return;
    }
    use raidfs::fs::{FileSystem, FsOptions};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let open = || Arc::new(FileSystem::open(mem_store(), FsOptions::default()).unwrap());
    let config = MountConfig::default();
    for round in 0..5 {
        let first = raidfs::fuse::mount(open(), dir.path(), &config).unwrap();
        fs::write(dir.path().join("first"), b"1").unwrap();
        // SAFETY: umount2 with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::umount2(cstr(dir.path()).as_ptr(), 0) }, 0);
        let second = raidfs::fuse::mount(open(), dir.path(), &config).unwrap();
        // The first session ends (it was unmounted) and is joined.
        let _ = first.wait();
        assert!(
            second.is_mounted(),
            "round {round}: the first mount's end unmounted the second"
        );
        assert!(!dir.path().join("first").exists());
        fs::write(dir.path().join("second"), b"2").unwrap();
        second.unmount().unwrap();
    }
}
