//! The mounted file system against a reference directory on the local disk: random
//! sequences of POSIX operations on both, trees compared after each phase (after the
//! operations, after an unmount and mount, after deduplication, after a crash following
//! an fsync).

mod support;

use std::collections::HashSet;
use std::ffi::{CString, OsStr};
use std::fs::OpenOptions;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use onecopy_fs::dedup::{self, Yield};
use onecopy_fs::mount::MountOptions;
use onecopy_fs::{FsOptions, OptionChanges};
use support::{compare_trees, TestMount};

/// xorshift64: a small, seeded, reproducible generator.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound.max(1)
    }

    fn bytes(&mut self, length: usize) -> Vec<u8> {
        // Runs of repeated blocks so that deduplication has something to find.
        let block = self.below(4) as u8;
        (0..length)
            .map(|index| {
                if block == 0 {
                    self.next() as u8
                } else {
                    ((index / 4096) as u8).wrapping_mul(block)
                }
            })
            .collect()
    }

    /// A name, sometimes not UTF-8.
    fn name(&mut self) -> Vec<u8> {
        let mut name = format!("n{}", self.below(40)).into_bytes();
        if self.below(5) == 0 {
            name.extend_from_slice(&[0xff, 0xfe, b'x']);
        }
        name
    }
}

/// Every path under `root` (relative), directories and the rest apart.
fn walk(root: &Path) -> (Vec<PathBuf>, Vec<PathBuf>) {
    let mut directories = vec![PathBuf::new()];
    let mut others = Vec::new();
    let mut index = 0;
    while index < directories.len() {
        let relative = directories[index].clone();
        index += 1;
        let mut entries: Vec<_> = std::fs::read_dir(root.join(&relative))
            .unwrap()
            .map(|entry| entry.unwrap())
            .collect();
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let path = relative.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                directories.push(path);
            } else {
                others.push(path);
            }
        }
    }
    (directories, others)
}

/// One operation, with its paths relative to a root.
#[derive(Clone, Debug)]
enum Operation {
    Write {
        path: PathBuf,
        offset: u64,
        data: Vec<u8>,
    },
    Truncate {
        path: PathBuf,
        size: u64,
    },
    Mkdir {
        path: PathBuf,
    },
    Rmdir {
        path: PathBuf,
    },
    Unlink {
        path: PathBuf,
    },
    Rename {
        from: PathBuf,
        to: PathBuf,
    },
    Link {
        from: PathBuf,
        to: PathBuf,
    },
    Symlink {
        path: PathBuf,
        target: Vec<u8>,
    },
    SetXattr {
        path: PathBuf,
        name: Vec<u8>,
        value: Vec<u8>,
    },
    RemoveXattr {
        path: PathBuf,
        name: Vec<u8>,
    },
    Chmod {
        path: PathBuf,
        mode: u32,
    },
    SetTimes {
        path: PathBuf,
        seconds: i64,
        nanoseconds: i64,
    },
    Fsync {
        path: PathBuf,
    },
    Exchange {
        from: PathBuf,
        to: PathBuf,
    },
    PunchHole {
        path: PathBuf,
        offset: u64,
        length: u64,
    },
    Fifo {
        path: PathBuf,
    },
    Rewrite {
        path: PathBuf,
        data: Vec<u8>,
    },
}

fn choose(random: &mut Random, reference: &Path) -> Operation {
    let (directories, others) = walk(reference);
    let files: Vec<PathBuf> = others
        .iter()
        .filter(|path| {
            std::fs::symlink_metadata(reference.join(path))
                .unwrap()
                .is_file()
        })
        .cloned()
        .collect();
    let pick = |random: &mut Random, list: &[PathBuf]| -> Option<PathBuf> {
        (!list.is_empty()).then(|| list[random.below(list.len() as u64) as usize].clone())
    };
    let fresh = |random: &mut Random| -> PathBuf {
        let directory = pick(random, &directories).unwrap();
        directory.join(OsStr::from_bytes(&random.name()))
    };
    let any: Vec<PathBuf> = directories[1..].iter().chain(&others).cloned().collect();
    loop {
        let operation = match random.below(20) {
            0..=3 => {
                let path = match pick(random, &files) {
                    Some(path) if random.below(3) > 0 => path,
                    _ => fresh(random),
                };
                let length = random.below(3) as usize * random.below(90_000) as usize;
                Operation::Write {
                    path,
                    offset: random.below(200_000),
                    data: random.bytes(length),
                }
            }
            4 => match pick(random, &files) {
                Some(path) => Operation::Truncate {
                    path,
                    size: random.below(250_000),
                },
                None => continue,
            },
            5 => Operation::Mkdir {
                path: fresh(random),
            },
            6 => match pick(random, &directories[1..]) {
                Some(path) => Operation::Rmdir { path },
                None => continue,
            },
            7 => match pick(random, &others) {
                Some(path) => Operation::Unlink { path },
                None => continue,
            },
            8 | 9 => match pick(random, &any) {
                Some(from) => {
                    let to = match pick(random, &any) {
                        Some(to) if random.below(2) == 0 => to,
                        _ => fresh(random),
                    };
                    Operation::Rename { from, to }
                }
                None => continue,
            },
            10 => match pick(random, &files) {
                Some(from) => Operation::Link {
                    from,
                    to: fresh(random),
                },
                None => continue,
            },
            11 => Operation::Symlink {
                path: fresh(random),
                target: random.name(),
            },
            12 => {
                let targets: Vec<PathBuf> = files.iter().chain(&directories).cloned().collect();
                let path = pick(random, &targets).unwrap();
                let name = format!("user.k{}", random.below(3)).into_bytes();
                if random.below(4) == 0 {
                    Operation::RemoveXattr { path, name }
                } else {
                    let length = random.below(100) as usize;
                    Operation::SetXattr {
                        path,
                        name,
                        value: random.bytes(length),
                    }
                }
            }
            13 => {
                let targets: Vec<PathBuf> =
                    files.iter().chain(&directories[1..]).cloned().collect();
                match pick(random, &targets) {
                    Some(path) => Operation::Chmod {
                        path,
                        mode: 0o700
                            | random.below(0o100) as u32
                            | (random.below(2) as u32 * 0o1000),
                    },
                    None => continue,
                }
            }
            14 => match pick(random, &files) {
                Some(path) => Operation::SetTimes {
                    path,
                    seconds: 1_000_000_000 + random.below(1_000_000_000) as i64,
                    nanoseconds: random.below(1_000_000_000) as i64,
                },
                None => continue,
            },
            15 => match pick(random, &files) {
                Some(path) => Operation::Fsync { path },
                None => continue,
            },
            16 => match (pick(random, &any), pick(random, &any)) {
                (Some(from), Some(to)) => Operation::Exchange { from, to },
                _ => continue,
            },
            17 => match pick(random, &files) {
                Some(path) => Operation::PunchHole {
                    path,
                    offset: random.below(300_000),
                    length: random.below(100_000),
                },
                None => continue,
            },
            18 => Operation::Fifo {
                path: fresh(random),
            },
            _ => {
                // O_TRUNC and a write of up to 2.5 MiB (several 1 MiB requests).
                let path = match pick(random, &files) {
                    Some(path) => path,
                    None => fresh(random),
                };
                let length = random.below(2_600_000) as usize;
                Operation::Rewrite {
                    path,
                    data: random.bytes(length),
                }
            }
        };
        return operation;
    }
}

fn c_path(path: &Path) -> CString {
    CString::new(path.as_os_str().as_bytes()).unwrap()
}

fn errno_of(result: std::io::Result<()>) -> Result<(), i32> {
    result.map_err(|error| error.raw_os_error().unwrap_or(-1))
}

fn check_libc(result: libc::c_int) -> std::io::Result<()> {
    if result < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Applies `operation` under `root`; the errno when it fails.
fn apply(root: &Path, operation: &Operation) -> Result<(), i32> {
    let at = |path: &PathBuf| root.join(path);
    errno_of(match operation {
        // O_NONBLOCK: a FIFO named like a file fails at once (ENXIO) instead of waiting for a
        // reader; regular files ignore the flag.
        Operation::Write { path, offset, data } => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .custom_flags(libc::O_NONBLOCK)
            .open(at(path))
            .and_then(|file| file.write_all_at(data, *offset)),
        Operation::Truncate { path, size } => OpenOptions::new()
            .write(true)
            .open(at(path))
            .and_then(|file| file.set_len(*size)),
        Operation::Mkdir { path } => std::fs::create_dir(at(path)),
        Operation::Rmdir { path } => std::fs::remove_dir(at(path)),
        Operation::Unlink { path } => std::fs::remove_file(at(path)),
        Operation::Rename { from, to } => std::fs::rename(at(from), at(to)),
        Operation::Link { from, to } => std::fs::hard_link(at(from), at(to)),
        Operation::Symlink { path, target } => {
            std::os::unix::fs::symlink(OsStr::from_bytes(target), at(path))
        }
        Operation::SetXattr { path, name, value } => {
            let (path, name) = (c_path(&at(path)), CString::new(name.clone()).unwrap());
            // SAFETY: the strings and the value outlive the call.
            check_libc(unsafe {
                libc::setxattr(
                    path.as_ptr(),
                    name.as_ptr(),
                    value.as_ptr().cast(),
                    value.len(),
                    0,
                )
            })
        }
        Operation::RemoveXattr { path, name } => {
            let (path, name) = (c_path(&at(path)), CString::new(name.clone()).unwrap());
            // SAFETY: the strings outlive the call.
            check_libc(unsafe { libc::removexattr(path.as_ptr(), name.as_ptr()) })
        }
        Operation::Chmod { path, mode } => {
            std::fs::set_permissions(at(path), std::fs::Permissions::from_mode(*mode))
        }
        Operation::SetTimes {
            path,
            seconds,
            nanoseconds,
        } => {
            let times = [
                libc::timespec {
                    tv_sec: *seconds,
                    tv_nsec: *nanoseconds,
                },
                libc::timespec {
                    tv_sec: *seconds + 7,
                    tv_nsec: *nanoseconds,
                },
            ];
            let path = c_path(&at(path));
            // SAFETY: the path and the times outlive the call.
            check_libc(unsafe { libc::utimensat(libc::AT_FDCWD, path.as_ptr(), times.as_ptr(), 0) })
        }
        Operation::Fsync { path } => std::fs::File::open(at(path)).and_then(|file| file.sync_all()),
        Operation::Exchange { from, to } => {
            let (from, to) = (c_path(&at(from)), c_path(&at(to)));
            // SAFETY: both paths outlive the call.
            check_libc(unsafe {
                libc::renameat2(
                    libc::AT_FDCWD,
                    from.as_ptr(),
                    libc::AT_FDCWD,
                    to.as_ptr(),
                    libc::RENAME_EXCHANGE,
                )
            })
        }
        Operation::PunchHole {
            path,
            offset,
            length,
        } => OpenOptions::new()
            .write(true)
            .open(at(path))
            .and_then(|file| {
                // SAFETY: fallocate on an open descriptor.
                check_libc(unsafe {
                    libc::fallocate(
                        file.as_raw_fd(),
                        libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                        *offset as i64,
                        *length as i64,
                    )
                })
            }),
        Operation::Fifo { path } => {
            let path = c_path(&at(path));
            // SAFETY: the path outlives the call.
            check_libc(unsafe { libc::mkfifo(path.as_ptr(), 0o640) })
        }
        Operation::Rewrite { path, data } => OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(at(path))
            .and_then(|mut file| std::io::Write::write_all(&mut file, data)),
    })
}

/// Runs `count` random operations on both trees, comparing outcomes, and keeps the set of
/// reference inodes whose mtime was set explicitly and not changed since.
fn run_operations(
    random: &mut Random,
    mounted: &Path,
    reference: &Path,
    count: usize,
    explicit_mtimes: &mut HashSet<u64>,
    log: &mut Vec<String>,
) {
    for _ in 0..count {
        let operation = choose(random, reference);
        log.push(format!("{operation:?}").chars().take(200).collect());
        let theirs = apply(reference, &operation);
        let ours = apply(mounted, &operation);
        assert_eq!(
            ours,
            theirs,
            "outcome of {operation:?} differs; operations so far:\n{}",
            log.join("\n")
        );
        match &operation {
            Operation::SetTimes { path, .. } if theirs.is_ok() => {
                let ino = std::fs::metadata(reference.join(path)).unwrap().ino();
                explicit_mtimes.insert(ino);
            }
            Operation::Write { path, .. }
            | Operation::Truncate { path, .. }
            | Operation::PunchHole { path, .. }
            | Operation::Rewrite { path, .. } => {
                if let Ok(metadata) = std::fs::metadata(reference.join(path)) {
                    explicit_mtimes.remove(&metadata.ino());
                }
            }
            _ => {}
        }
    }
}

fn compare(mounted: &Path, reference: &Path, explicit: &HashSet<u64>, phase: &str, log: &[String]) {
    if let Err(difference) = compare_trees(mounted, reference, explicit) {
        panic!("{phase}: {difference}\noperations:\n{}", log.join("\n"));
    }
}

/// Goal: the mounted file system behaves as the kernel's local file system for every
/// operation of a random sequence, and keeps the same tree across an unmount and mount, a
/// deduplication run, and a crash after an fsync. Method: seeded random operations on the
/// mount and on a reference directory, errno and trees compared after each phase.
#[test]
fn random_operations_match_a_local_directory() {
    for seed in [0x5eed_0001u64, 0x5eed_0002, 0x5eed_0003] {
        model_run(seed, &MountOptions::default());
    }
}

/// Goal: the same with the kernel's writeback cache on (`-o writeback_cache`), where writes
/// and times reach the engine late and merged. Method: as above, one seed.
#[test]
fn random_operations_match_with_the_writeback_cache() {
    let options = MountOptions {
        writeback_cache: true,
        ..MountOptions::default()
    };
    model_run(0x5eed_0004, &options);
}

/// One seeded run of the model test on a mount with `options`.
fn model_run(seed: u64, options: &MountOptions) {
    {
        let base = tempfile::tempdir().unwrap();
        let reference = base.path().join("reference");
        std::fs::create_dir(&reference).unwrap();
        let mut test = TestMount::create(
            base.path(),
            FsOptions {
                idle_seconds: 0,
                ..FsOptions::default()
            },
        );
        test.unmount(true);
        test.mount_with(options);
        let mounted = test.mount_point.clone();
        // The mount's root and the reference directory start alike.
        std::fs::set_permissions(&reference, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut random = Random(seed);
        let mut explicit = HashSet::new();
        let mut log = Vec::new();
        run_operations(
            &mut random,
            &mounted,
            &reference,
            300,
            &mut explicit,
            &mut log,
        );
        compare(
            &mounted,
            &reference,
            &explicit,
            "after the operations",
            &log,
        );

        test.unmount(true);
        test.mount_with(options);
        compare(&mounted, &reference, &explicit, "after a remount", &log);

        // Rank everything now and deduplicate.
        let engine = test.engine().clone();
        let changes = OptionChanges {
            min_evaluation_interval_seconds: Some(0),
            min_evaluation_count: Some(0),
            ..OptionChanges::default()
        };
        engine.configure(test.fs, &changes).unwrap();
        let plan = dedup::plan(&engine, test.fs).unwrap();
        dedup::execute(&engine, test.fs, &plan, Yield::Never).unwrap();
        let stats = engine.stats(test.fs).unwrap();
        assert_eq!(stats.pending_bytes, 0, "{stats:?}");
        compare(&mounted, &reference, &explicit, "after deduplication", &log);

        run_operations(
            &mut random,
            &mounted,
            &reference,
            150,
            &mut explicit,
            &mut log,
        );
        compare(
            &mounted,
            &reference,
            &explicit,
            "after more operations",
            &log,
        );
        // Everything is fsync'd (one journal orders all changes), then the process "dies".
        let (_, others) = walk(&reference);
        let file = others.iter().find(|path| {
            std::fs::symlink_metadata(mounted.join(path))
                .unwrap()
                .is_file()
        });
        match file {
            Some(path) => std::fs::File::open(mounted.join(path))
                .unwrap()
                .sync_all()
                .unwrap(),
            None => engine.flush().unwrap(),
        }
        drop(engine);
        test.unmount(false);
        test.mount_with(options);
        compare(
            &mounted,
            &reference,
            &explicit,
            "after a crash following fsync",
            &log,
        );
        let report = test
            .engine()
            .check(onecopy_core::check::CheckOptions {
                repair: false,
                read_data: true,
            })
            .unwrap();
        assert!(report.findings.is_empty(), "{:#?}", report.findings);
        test.unmount(true);
    }
}
