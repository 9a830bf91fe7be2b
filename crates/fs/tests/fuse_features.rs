//! Features of the mounted file system one at a time: 1 MiB requests, mmap, concurrent
//! requests, holes and SEEK_DATA/SEEK_HOLE, statfs, timestamps, unlinked open files, and
//! renameat2's flags.

mod support;

use std::ffi::CString;
use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::time::Duration;

use onecopy_fs::node::ROOT;
use onecopy_fs::FsOptions;
use support::TestMount;

fn mount() -> (tempfile::TempDir, TestMount) {
    let base = tempfile::tempdir().unwrap();
    let test = TestMount::create(
        base.path(),
        FsOptions {
            idle_seconds: 0,
            ..FsOptions::default()
        },
    );
    (base, test)
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Goal: the kernel sends writes of 1 MiB (max_write), each stored as one plain chunk, laid
/// out contiguously. Method: one 4 MiB write(2), then the file's layout.
#[test]
fn one_mebibyte_requests_are_stored_contiguously() {
    let (_base, test) = mount();
    let data: Vec<u8> = (0..4u32 << 20).map(|i| (i % 253) as u8).collect();
    let mut file = std::fs::File::create(test.mount_point.join("big")).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    let engine = test.engine();
    let ino = engine.lookup(test.fs, ROOT, b"big").unwrap().ino;
    let layout = engine.file_layout(test.fs, ino).unwrap();
    assert_eq!(layout.len(), 4, "{layout:?}");
    for pair in layout.windows(2) {
        assert_eq!(pair[0].length, 1 << 20);
        assert!(
            pair[1].container == pair[0].container + 1
                || pair[1].container_offset > pair[0].container_offset,
            "{pair:?}"
        );
    }
    assert_eq!(std::fs::read(test.mount_point.join("big")).unwrap(), data);
}

/// Goal: a shared writable mapping writes the file. Method: mmap, write through memory,
/// msync, read with read(2) after dropping the page cache's copy by remounting.
#[test]
fn shared_mmap_writes_reach_the_file() {
    let (_base, mut test) = mount();
    let path = test.mount_point.join("mapped");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(65536).unwrap();
    // SAFETY: a fresh shared mapping of a file we own, unmapped below before the file closes.
    unsafe {
        let memory = libc::mmap(
            std::ptr::null_mut(),
            65536,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            0,
        );
        assert_ne!(
            memory,
            libc::MAP_FAILED,
            "{}",
            std::io::Error::last_os_error()
        );
        let bytes = std::slice::from_raw_parts_mut(memory.cast::<u8>(), 65536);
        bytes[100..105].copy_from_slice(b"mmap!");
        bytes[65000] = 7;
        assert_eq!(libc::msync(memory, 65536, libc::MS_SYNC), 0);
        assert_eq!(libc::munmap(memory, 65536), 0);
    }
    file.sync_all().unwrap();
    drop(file);
    test.unmount(true);
    test.mount();
    let read = std::fs::read(&path).unwrap();
    assert_eq!(&read[100..105], b"mmap!");
    assert_eq!(read[65000], 7);
    assert_eq!(read.len(), 65536);
}

/// Goal: several threads reading and writing their own files at once get their own data.
/// Method: 8 threads, each writing then reading back 40 pieces.
#[test]
fn concurrent_requests_keep_files_apart() {
    let (_base, test) = mount();
    std::thread::scope(|scope| {
        for thread in 0..8u8 {
            let path = test.mount_point.join(format!("t{thread}"));
            scope.spawn(move || {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create(true)
                    .truncate(true)
                    .open(&path)
                    .unwrap();
                for piece in 0..40u64 {
                    let data = vec![thread.wrapping_mul(31).wrapping_add(piece as u8); 20_000];
                    file.write_all_at(&data, piece * 20_000).unwrap();
                    let mut back = vec![0u8; 20_000];
                    file.read_exact_at(&mut back, piece * 20_000).unwrap();
                    assert_eq!(back, data);
                }
            });
        }
    });
    for thread in 0..8u8 {
        let read = std::fs::read(test.mount_point.join(format!("t{thread}"))).unwrap();
        for (piece, block) in read.chunks(20_000).enumerate() {
            assert!(block
                .iter()
                .all(|&b| b == thread.wrapping_mul(31).wrapping_add(piece as u8)));
        }
    }
}

/// Goal: holes are not stored, read as zeros, and SEEK_DATA/SEEK_HOLE find them; st_blocks
/// counts only data. Method: a 64 MiB file with data at two places.
#[test]
fn holes_and_seek_data() {
    let (_base, test) = mount();
    let path = test.mount_point.join("sparse");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(64 << 20).unwrap();
    file.write_all_at(&[1u8; 8192], 10 << 20).unwrap();
    file.write_all_at(&[2u8; 100], 40 << 20).unwrap();
    let seek = |offset: i64, whence: i32| {
        // SAFETY: lseek on an open descriptor.
        unsafe { libc::lseek(file.as_raw_fd(), offset, whence) }
    };
    assert_eq!(seek(0, libc::SEEK_DATA), 10 << 20);
    assert_eq!(seek(10 << 20, libc::SEEK_HOLE), (10 << 20) + 8192);
    assert_eq!(seek((10 << 20) + 8192, libc::SEEK_DATA), 40 << 20);
    assert_eq!(seek(40 << 20, libc::SEEK_HOLE), (40 << 20) + 100);
    assert_eq!(seek((40 << 20) + 100, libc::SEEK_DATA), -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENXIO)
    );
    let metadata = file.metadata().unwrap();
    assert_eq!(metadata.len(), 64 << 20);
    assert_eq!(
        metadata.blocks(),
        (8192 + 4096) / 512,
        "holes take no blocks"
    );
    let mut zeros = vec![9u8; 4096];
    file.read_exact_at(&mut zeros, 20 << 20).unwrap();
    assert!(zeros.iter().all(|&b| b == 0));
    let stats = test.engine().stats(test.fs).unwrap();
    assert_eq!(stats.logical_bytes, 8192 + 100);
}

/// Goal: statfs reports the disk under the repository (real sizes, free space, names).
/// Method: statvfs of the mount against statvfs of the repository's directory.
#[test]
fn statfs_reports_real_numbers() {
    let (_base, test) = mount();
    let statvfs = |path: &Path| {
        let mut out: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: statvfs fills `out`.
        assert_eq!(unsafe { libc::statvfs(c_path(path).as_ptr(), &mut out) }, 0);
        out
    };
    let mounted = statvfs(&test.mount_point);
    let disk = statvfs(&test.repository);
    assert_eq!(
        mounted.f_blocks * mounted.f_frsize,
        disk.f_blocks * disk.f_frsize
    );
    assert!(mounted.f_bavail > 0);
    assert_eq!(mounted.f_namemax, 255);
    assert!(mounted.f_files > 0);
}

/// Goal: timestamps follow POSIX: a write sets mtime and ctime, chmod only ctime, utimensat
/// sets what it names. Method: stat after each step, with pauses so the clock moves.
#[test]
fn timestamps_follow_posix() {
    let (_base, test) = mount();
    let path = test.mount_point.join("times");
    std::fs::write(&path, b"one").unwrap();
    let first = std::fs::metadata(&path).unwrap();
    std::thread::sleep(Duration::from_millis(20));
    OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .write_all_at(b"two", 3)
        .unwrap();
    let written = std::fs::metadata(&path).unwrap();
    assert!(written.mtime_nsec() != first.mtime_nsec() || written.mtime() > first.mtime());
    assert_eq!(
        (written.ctime(), written.ctime_nsec()),
        (written.mtime(), written.mtime_nsec())
    );
    std::thread::sleep(Duration::from_millis(20));
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let changed = std::fs::metadata(&path).unwrap();
    assert_eq!(
        (changed.mtime(), changed.mtime_nsec()),
        (written.mtime(), written.mtime_nsec())
    );
    assert!((changed.ctime(), changed.ctime_nsec()) > (written.ctime(), written.ctime_nsec()));
    let times = [
        libc::timespec {
            tv_sec: 1_000,
            tv_nsec: 5,
        },
        libc::timespec {
            tv_sec: 0,
            tv_nsec: libc::UTIME_OMIT,
        },
    ];
    // SAFETY: the path and times outlive the call.
    assert_eq!(
        unsafe { libc::utimensat(libc::AT_FDCWD, c_path(&path).as_ptr(), times.as_ptr(), 0) },
        0
    );
    let set = std::fs::metadata(&path).unwrap();
    assert_eq!((set.atime(), set.atime_nsec()), (1_000, 5));
    assert_eq!(
        (set.mtime(), set.mtime_nsec()),
        (changed.mtime(), changed.mtime_nsec())
    );
}

/// Goal: an unlinked file stays readable through an open descriptor and its data is
/// released at the last close. Method: open, unlink, read, close, stats.
#[test]
fn unlinked_open_file_lives_until_closed() {
    let (_base, test) = mount();
    let path = test.mount_point.join("doomed");
    std::fs::write(&path, vec![5u8; 100_000]).unwrap();
    let mut file = std::fs::File::open(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(!path.exists());
    let mut read = Vec::new();
    file.read_to_end(&mut read).unwrap();
    assert_eq!(read, vec![5u8; 100_000]);
    assert_eq!(test.engine().stats(test.fs).unwrap().files, 1);
    drop(file);
    // The kernel sends the release asynchronously.
    for _ in 0..100 {
        if test.engine().stats(test.fs).unwrap().files == 0 {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let stats = test.engine().stats(test.fs).unwrap();
    assert_eq!((stats.files, stats.logical_bytes), (0, 0), "{stats:?}");
}

/// Goal: renameat2 with RENAME_NOREPLACE refuses an existing target and RENAME_EXCHANGE
/// swaps a file and a directory. Method: the raw system call.
#[test]
fn rename_flags() {
    let (_base, test) = mount();
    let root = &test.mount_point;
    std::fs::write(root.join("file"), b"f").unwrap();
    std::fs::create_dir(root.join("dir")).unwrap();
    std::fs::write(root.join("dir/inner"), b"i").unwrap();
    let rename = |from: &str, to: &str, flags: libc::c_uint| {
        let (from, to) = (c_path(&root.join(from)), c_path(&root.join(to)));
        // SAFETY: both paths outlive the call.
        let result = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                from.as_ptr(),
                libc::AT_FDCWD,
                to.as_ptr(),
                flags,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error().unwrap())
        }
    };
    assert_eq!(
        rename("file", "dir", libc::RENAME_NOREPLACE),
        Err(libc::EEXIST)
    );
    rename("file", "dir", libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(std::fs::read(root.join("dir")).unwrap(), b"f");
    assert_eq!(std::fs::read(root.join("file/inner")).unwrap(), b"i");
    assert_eq!(std::fs::metadata(root).unwrap().nlink(), 3);
    assert_eq!(rename("file", "file/inner/x", 0), Err(libc::ENOTDIR));
    std::fs::create_dir(root.join("file/sub")).unwrap();
    assert_eq!(rename("file", "file/sub/x", 0), Err(libc::EINVAL));
}

/// Goal: by default every opening's reading reaches the engine (and the I/O monitor); with
/// `keep_cache` the kernel keeps an unchanged file's pages across opens and a second reading
/// costs no request, while a write through another descriptor is seen at once. Method: the
/// I/O monitor's counters of the file between readings, without and with the option.
#[test]
fn page_cache_across_opens() {
    for keep_cache in [false, true] {
        let (_base, mut test) = mount();
        test.unmount(true);
        test.mount_with(&onecopy_fs::mount::MountOptions {
            keep_cache,
            ..Default::default()
        });
        let path = test.mount_point.join("cached");
        std::fs::write(&path, vec![3u8; 1 << 20]).unwrap();
        let engine = test.engine().clone();
        let ino = engine.lookup(test.fs, ROOT, b"cached").unwrap().ino;
        let reads = || {
            let ranks = engine.ranks(test.fs).unwrap();
            let file = ranks.iter().find(|file| file.ino == ino).unwrap().clone();
            file.sequential_reads + file.random_reads
        };
        let before = reads();
        assert_eq!(std::fs::read(&path).unwrap(), vec![3u8; 1 << 20]);
        assert_eq!(std::fs::read(&path).unwrap(), vec![3u8; 1 << 20]);
        if keep_cache {
            assert_eq!(reads(), before, "both readings come from the page cache");
        } else {
            assert!(reads() >= before + 2, "each opening reads through");
        }
        OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .write_all_at(b"new", 4096)
            .unwrap();
        let read = std::fs::read(&path).unwrap();
        assert_eq!(&read[4096..4099], b"new");
        assert_eq!(read[4099], 3);
    }
}

/// Goal: with `no_monitor` reads reach the engine but not the I/O monitor (no counts, no
/// move out of rank 0's evaluation), and the option parses. Method: the monitor's counters
/// of a file before and after two readings on a mount with the parsed option.
#[test]
fn no_monitor_leaves_reads_uncounted() {
    let options = onecopy_fs::mount::MountOptions::parse("no_monitor,threads=2").unwrap();
    assert!(options.no_monitor);
    let (_base, mut test) = mount();
    test.unmount(true);
    test.mount_with(&options);
    let path = test.mount_point.join("unwatched");
    std::fs::write(&path, vec![5u8; 1 << 20]).unwrap();
    let engine = test.engine().clone();
    let ino = engine.lookup(test.fs, ROOT, b"unwatched").unwrap().ino;
    let reads = || {
        let ranks = engine.ranks(test.fs).unwrap();
        let file = ranks.iter().find(|file| file.ino == ino).unwrap().clone();
        file.sequential_reads + file.random_reads
    };
    assert_eq!(reads(), 0);
    assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 1 << 20]);
    assert_eq!(std::fs::read(&path).unwrap(), vec![5u8; 1 << 20]);
    assert_eq!(reads(), 0, "reads on a no_monitor mount are not counted");
}

/// Goal: removing entries while a directory is being read skips none of the others (the
/// position of an entry must not shift under the reader). Method: 3,000 entries with long
/// names (many readdir requests), each removed as soon as it is read.
#[test]
fn removing_entries_while_reading_a_directory_skips_none() {
    let (_base, test) = mount();
    let directory = test.mount_point.join("many");
    std::fs::create_dir(&directory).unwrap();
    for index in 0..3000 {
        std::fs::write(
            directory.join(format!("an-entry-with-a-rather-long-name-{index:05}")),
            b"",
        )
        .unwrap();
    }
    let mut seen = 0;
    for entry in std::fs::read_dir(&directory).unwrap() {
        std::fs::remove_file(entry.unwrap().path()).unwrap();
        seen += 1;
    }
    assert_eq!(seen, 3000);
    std::fs::remove_dir(&directory).unwrap();
}

/// Goal: with the kernel's writeback cache (`-o writeback_cache`) the times are the
/// kernel's: a file's modification time is that of its write(2), not of the later request
/// that carries the data, and a time a program sets while data is still cached is kept; the
/// reads the kernel makes to fill pages that a write covers in part, through a file opened
/// for writing only, are not counted by the I/O monitor; and fsync hands everything to the
/// engine. Method: a mount with the option; stat after a delayed fsync, utimens while dirty,
/// a partial-page write through O_WRONLY with the monitor's counters around it.
#[test]
fn writeback_cache_keeps_times_and_the_monitor_right() {
    let options = onecopy_fs::mount::MountOptions::parse("writeback_cache").unwrap();
    assert!(options.writeback_cache);
    let (_base, mut test) = mount();
    test.unmount(true);
    test.mount_with(&options);
    let engine = test.engine().clone();

    let path = test.mount_point.join("timed");
    let before = std::time::SystemTime::now();
    let mut file = std::fs::File::create(&path).unwrap();
    for _ in 0..100 {
        file.write_all(&[7u8; 1000]).unwrap();
    }
    let written = std::time::SystemTime::now();
    let ino = engine.lookup(test.fs, ROOT, b"timed").unwrap().ino;
    assert!(
        engine.getattr(test.fs, ino).unwrap().attributes.size < 100_000,
        "the writes wait in the kernel's cache"
    );
    std::thread::sleep(Duration::from_millis(1500));
    file.sync_all().unwrap();
    let stored = engine.getattr(test.fs, ino).unwrap().attributes;
    assert_eq!(stored.size, 100_000, "fsync handed the data to the engine");
    let mtime = std::time::UNIX_EPOCH + Duration::from_nanos(stored.mtime_ns as u64);
    let slack = Duration::from_millis(20);
    assert!(
        mtime + slack >= before && mtime <= written + slack,
        "the modification time is the write's: {mtime:?} not in {before:?}..{written:?}"
    );
    // A time set while written data is still in the kernel's cache stays.
    file.write_all(b"more").unwrap();
    let set = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000_000);
    file.set_modified(set).unwrap();
    drop(file);
    std::fs::File::open(&path).unwrap().sync_all().unwrap();
    let metadata = std::fs::metadata(&path).unwrap();
    assert_eq!(metadata.len(), 100_004);
    assert_eq!(metadata.modified().unwrap(), set);
    let stored = engine.getattr(test.fs, ino).unwrap().attributes;
    assert_eq!(stored.mtime_ns, 1_000_000_000 * 1_000_000_000);

    let reads = || {
        let ranks = engine.ranks(test.fs).unwrap();
        let file = ranks.iter().find(|file| file.ino == ino).unwrap().clone();
        file.sequential_reads + file.random_reads
    };
    let counted = reads();
    let writer = OpenOptions::new().write(true).open(&path).unwrap();
    writer.write_all_at(b"patch", 5000).unwrap();
    writer.sync_all().unwrap();
    drop(writer);
    assert_eq!(
        reads(),
        counted,
        "the kernel's page fills are not program reads"
    );
    let read = std::fs::read(&path).unwrap();
    assert_eq!(&read[4999..5006], &[7, b'p', b'a', b't', b'c', b'h', 7]);
    assert!(reads() > counted, "a program's read is counted");

    // Files created and removed again (tar's placeholders for symbolic links): the kernel
    // flushes their times after they are gone, which must not fail a sync of the mount.
    for index in 0..20 {
        let placeholder = test.mount_point.join(format!("placeholder{index}"));
        drop(std::fs::File::create(&placeholder).unwrap());
        std::fs::remove_file(&placeholder).unwrap();
    }
    let root = std::fs::File::open(&test.mount_point).unwrap();
    // SAFETY: syncfs takes a descriptor, which `root` keeps open.
    let synced = unsafe { libc::syncfs(root.as_raw_fd()) };
    assert_eq!(synced, 0, "{}", std::io::Error::last_os_error());
}
