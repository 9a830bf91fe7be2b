//! The workload drivers of paper 1 §5, as plain file operations on a mounted file system.
//!
//! | paper 1 (filebench, `cp`)                               | driver                        |
//! | ------------------------------------------------------- | ----------------------------- |
//! | §5.3 warm-up: copy a kernel tree and a CentOS root      | [`copy_tree`] of a host tree  |
//! | §5.4.1 / §5.4.2 create empty files in one directory     | [`create_empty_files`]        |
//! | §5.4.2 create and delete empty files in a directory tree | [`create_and_delete`]        |
//! | §5.4.2 append 4 KiB blocks to one file, fsync every 100  | [`append_with_fsync`]         |
//! | §5.4.2 append 4 KiB blocks to many files, fsync every 10 | [`append_to_files`]          |
//! | §5.4.4 step 2: unique data to push hashes out of the cache | [`write_unique_file`]       |
//! | §5.4.4 step 3: `cp` of the tree in the same mount point | [`copy_tree`] with flushes    |
//! | §5.4.5 filebench's fileserver                           | [`FileServer`]                |
//!
//! Paper 1 modified filebench to write data drawn from a duplicate distribution; our
//! [`BlockSource`] does the same with one parameter, the fraction of blocks that repeat an
//! earlier block of the run. Like the paper's, one source is shared by all threads of a
//! workload.
//!
//! Drivers that start threads return the processor time of those threads
//! ([`crate::cpu::thread_seconds`]), so that the engine's share of the process's time can be
//! told from the workload's.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use onecopy_core::error::IoContext;
use serde::{Deserialize, Serialize};

use crate::cpu::thread_seconds;
use crate::error::Result;
use crate::mount::sync_file_system;
use crate::results::create_directory;

/// Bytes of one appended or generated block.
pub const BLOCK_BYTES: usize = 4096;
/// Buffer of the copy loop.
const COPY_BUFFER_BYTES: usize = 1 << 20;

/// What a tree copy copied.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreeCopy {
    pub files: u64,
    pub directories: u64,
    pub bytes: u64,
}

/// Copies the directories and regular files under `source` into `destination` (created),
/// visiting names in sorted order so every run copies the same files, and stops after the
/// file that reaches `bytes_max`. Symbolic links, special files and unreadable entries are
/// skipped. With `flush_every_bytes`, the destination file system is synced after each such
/// amount (paper 1 §5.4.4 ran `cp` on a 2 GB machine so that writeback ran while copying; a
/// sync every few MiB gives the same interleaving of reads and writes on a large machine).
pub fn copy_tree(
    source: &Path,
    destination: &Path,
    bytes_max: u64,
    flush_every_bytes: Option<u64>,
) -> Result<TreeCopy> {
    let mut copy = TreeCopy::default();
    let mut unflushed_bytes = 0u64;
    let mut buffer = vec![0u8; COPY_BUFFER_BYTES];
    create_directory(destination)?;
    copy.directories += 1;
    let mut stack = vec![(source.to_path_buf(), destination.to_path_buf())];
    while let Some((from, to)) = stack.pop() {
        let mut entries: Vec<_> = match fs::read_dir(&from) {
            Ok(entries) => entries.filter_map(|entry| entry.ok()).collect(),
            Err(_) => continue,
        };
        entries.sort_by_key(|entry| entry.file_name());
        let mut subdirectories = Vec::new();
        for entry in entries {
            if copy.bytes >= bytes_max {
                return Ok(copy);
            }
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue;
            };
            let target = to.join(entry.file_name());
            if metadata.is_dir() {
                create_directory(&target)?;
                copy.directories += 1;
                subdirectories.push((entry.path(), target));
            } else if metadata.is_file() {
                let Ok(mut input) = fs::File::open(entry.path()) else {
                    continue;
                };
                let copied = copy_file(&mut input, &target, &mut buffer)?;
                copy.files += 1;
                copy.bytes += copied;
                unflushed_bytes += copied;
                if let Some(every) = flush_every_bytes {
                    if unflushed_bytes >= every {
                        sync_file_system(destination)?;
                        unflushed_bytes = 0;
                    }
                }
            }
        }
        // Depth first in name order: push in reverse so the smallest name is visited next.
        stack.extend(subdirectories.into_iter().rev());
    }
    Ok(copy)
}

fn copy_file(input: &mut fs::File, target: &Path, buffer: &mut [u8]) -> Result<u64> {
    let mut output =
        fs::File::create(target).context_io(|| format!("creating {}", target.display()))?;
    let mut copied = 0u64;
    loop {
        // A source file that cannot be read further is copied as far as it could be read.
        let read = match input.read(buffer) {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        output
            .write_all(&buffer[..read])
            .context_io(|| format!("writing {}", target.display()))?;
        copied += read as u64;
    }
    Ok(copied)
}

/// Creates `count` empty files in `directory` from `threads` threads (names `t{thread}-{n}`),
/// each created and closed (paper 1 §5.4.2: 16 threads, 1.5 M files, one directory). Returns
/// the files created and the processor seconds of the threads.
pub fn create_empty_files(directory: &Path, count: u64, threads: usize) -> Result<(u64, f64)> {
    assert!(threads > 0, "at least one thread");
    create_directory(directory)?;
    let per_thread = count.div_ceil(threads as u64);
    let results: Vec<Result<(u64, f64)>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> Result<(u64, f64)> {
                    let cpu_before = thread_seconds();
                    let first = thread as u64 * per_thread;
                    let last = (first + per_thread).min(count);
                    for index in first..last {
                        let path = directory.join(format!("t{thread:02}-{index:09}"));
                        fs::File::create(&path)
                            .context_io(|| format!("creating {}", path.display()))?;
                    }
                    Ok((last.saturating_sub(first), thread_seconds() - cpu_before))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a create thread panicked"))
            .collect()
    });
    let (mut created, mut cpu) = (0, 0.0);
    for result in results {
        let (files, seconds) = result?;
        created += files;
        cpu += seconds;
    }
    assert_eq!(created, count);
    Ok((created, cpu))
}

/// Appends `appends` blocks from `source` to the file at `path`, calling `fsync` after every
/// `fsync_every` appends and once at the end (paper 1 §5.4.2: one thread, 4 KiB appends,
/// fsync every 100). Returns the number of fsync calls.
pub fn append_with_fsync(
    path: &Path,
    appends: u64,
    fsync_every: u64,
    source: &mut BlockSource,
) -> Result<u64> {
    assert!(fsync_every > 0, "fsync_every must be positive");
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .context_io(|| format!("opening {}", path.display()))?;
    let mut block = [0u8; BLOCK_BYTES];
    let mut fsyncs = 0;
    let fsync = |file: &fs::File| {
        file.sync_all()
            .context_io(|| format!("fsync of {}", path.display()))
    };
    for index in 1..=appends {
        source.next_block(&mut block);
        file.write_all(&block)
            .context_io(|| format!("appending to {}", path.display()))?;
        if index % fsync_every == 0 {
            fsync(&file)?;
            fsyncs += 1;
        }
    }
    if !appends.is_multiple_of(fsync_every) {
        fsync(&file)?;
        fsyncs += 1;
    }
    Ok(fsyncs)
}

/// Names of a file set laid out in directories of equal width under a root, as filebench
/// lays out a fileset: file `n` is `root/dNNNNN/fNNNNNNNNN`, `width` files per directory.
#[derive(Clone, Debug)]
pub struct FileSet {
    root: PathBuf,
    files: u64,
    width: u64,
}

impl FileSet {
    /// `files` names in directories of `width` files each.
    pub fn new(root: &Path, files: u64, width: u64) -> FileSet {
        assert!(
            files > 0 && width > 0,
            "a file set has files and directories"
        );
        FileSet {
            root: root.to_path_buf(),
            files,
            width,
        }
    }

    /// The directory width that gives a tree of `files` files a mean depth of `depth`, as
    /// filebench relates them (depth = ln files / ln width).
    pub fn width_for_depth(files: u64, depth: f64) -> u64 {
        assert!(depth >= 1.0, "a tree is at least one level deep");
        ((files as f64).powf(1.0 / depth).ceil() as u64).clamp(1, files.max(1))
    }

    /// Names in the set.
    pub fn files(&self) -> u64 {
        self.files
    }

    /// Directories holding them.
    pub fn directories(&self) -> u64 {
        self.files.div_ceil(self.width)
    }

    /// The path of file `index`.
    pub fn path(&self, index: u64) -> PathBuf {
        assert!(index < self.files, "file {index} of {}", self.files);
        self.root
            .join(format!("d{:05}", index / self.width))
            .join(format!("f{index:09}"))
    }

    /// Creates the root and every directory.
    pub fn create_directories(&self) -> Result<()> {
        for directory in 0..self.directories() {
            create_directory(&self.root.join(format!("d{directory:05}")))?;
        }
        Ok(())
    }
}

/// A small deterministic generator (SplitMix64) for the workloads' choices.
#[derive(Clone, Debug)]
pub struct Random(u64);

impl Random {
    pub fn new(seed: u64) -> Random {
        Random(seed ^ 0xD1B5_4A32_D192_ED03)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.0)
    }

    /// Uniform in `0..bound` (`bound` > 0).
    pub fn below(&mut self, bound: u64) -> u64 {
        assert!(bound > 0, "an empty range");
        self.next_u64() % bound
    }

    /// The values in a random order (Fisher-Yates).
    pub fn shuffle<T>(&mut self, values: &mut [T]) {
        for last in (1..values.len()).rev() {
            let pick = self.below(last as u64 + 1) as usize;
            values.swap(last, pick);
        }
    }
}

/// What [`create_and_delete`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CreateDelete {
    pub creates: u64,
    pub deletes: u64,
    /// Seconds from the start until the last create thread finished.
    pub create_seconds: f64,
    /// Seconds from the start until the last delete thread finished.
    pub delete_seconds: f64,
    /// Processor seconds of the driver's threads.
    pub thread_cpu_seconds: f64,
}

/// Paper 1 §5.4.2 (Fig. 5.2): `threads` threads create the files `absent` names while as
/// many others delete the files `present` names, all at once, each thread taking its share
/// of its list in the list's order. Every name in `absent` must be free and every name in
/// `present` an existing empty file.
pub fn create_and_delete(
    set: &FileSet,
    absent: &[u64],
    present: &[u64],
    threads: usize,
) -> Result<CreateDelete> {
    assert!(threads > 0, "at least one thread of each kind");
    let started = Instant::now();
    let share = |list: &[u64], thread: usize| {
        let per_thread = list.len().div_ceil(threads);
        let first = (thread * per_thread).min(list.len());
        let last = (first + per_thread).min(list.len());
        list[first..last].to_vec()
    };
    // (create?, operations, seconds from start, thread processor seconds)
    let outcomes: Vec<Result<(bool, u64, f64, f64)>> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for thread in 0..threads {
            for create in [true, false] {
                let names = share(if create { absent } else { present }, thread);
                handles.push(scope.spawn(move || -> Result<(bool, u64, f64, f64)> {
                    let cpu_before = thread_seconds();
                    for &index in &names {
                        let path = set.path(index);
                        if create {
                            fs::File::create(&path)
                                .context_io(|| format!("creating {}", path.display()))?;
                        } else {
                            fs::remove_file(&path)
                                .context_io(|| format!("deleting {}", path.display()))?;
                        }
                    }
                    Ok((
                        create,
                        names.len() as u64,
                        started.elapsed().as_secs_f64(),
                        thread_seconds() - cpu_before,
                    ))
                }));
            }
        }
        handles
            .into_iter()
            .map(|handle| handle.join().expect("a create or delete thread panicked"))
            .collect()
    });
    let mut outcome = CreateDelete::default();
    for result in outcomes {
        let (create, operations, seconds, cpu) = result?;
        outcome.thread_cpu_seconds += cpu;
        if create {
            outcome.creates += operations;
            outcome.create_seconds = outcome.create_seconds.max(seconds);
        } else {
            outcome.deletes += operations;
            outcome.delete_seconds = outcome.delete_seconds.max(seconds);
        }
    }
    assert_eq!(outcome.creates, absent.len() as u64);
    assert_eq!(outcome.deletes, present.len() as u64);
    Ok(outcome)
}

/// Creates empty files `names` of `set` (a file set's preallocation).
pub fn create_files(set: &FileSet, names: &[u64]) -> Result<()> {
    for &index in names {
        let path = set.path(index);
        fs::File::create(&path).context_io(|| format!("creating {}", path.display()))?;
    }
    Ok(())
}

/// What [`append_to_files`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Appends {
    pub appends: u64,
    pub fsyncs: u64,
    /// Processor seconds of the driver's threads.
    pub thread_cpu_seconds: f64,
}

/// Paper 1 §5.4.2 (Fig. 5.4): `threads` threads append 4 KiB blocks from `source` to the
/// `files` files of `directory` (created empty), `appends_per_fsync` blocks to one file and
/// then `fsync` of it, taking their files in turn (thread `t` owns files `t`, `t + threads`,
/// ...), until `appends` blocks are written in all (rounded up to whole fsync groups).
pub fn append_to_files(
    directory: &Path,
    files: u64,
    threads: usize,
    appends: u64,
    appends_per_fsync: u64,
    source: &Mutex<BlockSource>,
) -> Result<Appends> {
    assert!(threads > 0 && appends_per_fsync > 0 && files >= threads as u64);
    create_directory(directory)?;
    let groups = appends.div_ceil(appends_per_fsync);
    let outcomes: Vec<Result<Appends>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|thread| {
                scope.spawn(move || -> Result<Appends> {
                    let cpu_before = thread_seconds();
                    let owned: Vec<u64> = (thread as u64..files).step_by(threads).collect();
                    let my_groups = (thread as u64..groups).step_by(threads).count();
                    let mut buffer = vec![0u8; appends_per_fsync as usize * BLOCK_BYTES];
                    let mut outcome = Appends::default();
                    for group in 0..my_groups {
                        let index = owned[group % owned.len()];
                        let path = directory.join(format!("f{index:07}"));
                        source
                            .lock()
                            .expect("a thread holding the block source panicked")
                            .next_blocks(&mut buffer);
                        let mut file = fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&path)
                            .context_io(|| format!("opening {}", path.display()))?;
                        for block in buffer.chunks_exact(BLOCK_BYTES) {
                            file.write_all(block)
                                .context_io(|| format!("appending to {}", path.display()))?;
                        }
                        file.sync_all()
                            .context_io(|| format!("fsync of {}", path.display()))?;
                        outcome.appends += appends_per_fsync;
                        outcome.fsyncs += 1;
                    }
                    outcome.thread_cpu_seconds = thread_seconds() - cpu_before;
                    Ok(outcome)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|handle| handle.join().expect("an append thread panicked"))
            .collect()
    });
    let mut total = Appends::default();
    for outcome in outcomes {
        let outcome = outcome?;
        total.appends += outcome.appends;
        total.fsyncs += outcome.fsyncs;
        total.thread_cpu_seconds += outcome.thread_cpu_seconds;
    }
    assert_eq!(total.fsyncs, groups);
    Ok(total)
}

/// Filebench's fileserver personality (paper 1 §5.4.5): a file set of whole-block files; each
/// iteration of a thread is filebench's eleven operations: create a file, write it whole,
/// close; open a file, append to it, close; open a file, read it whole, close; delete a file;
/// stat a file. Thread `t` works on the files `t`, `t + threads`, ... (filebench draws from
/// the whole set; owning a share keeps threads from racing for one file without changing
/// what reaches the disk).
#[derive(Clone, Debug)]
pub struct FileServer {
    pub set: FileSet,
    /// Mean file size in blocks (sizes are uniform in `1..2 * mean`).
    pub mean_file_blocks: u64,
    /// Appends are uniform in `1..=append_blocks_max` blocks.
    pub append_blocks_max: u64,
    /// Bytes per read or write call (filebench's iosize).
    pub io_bytes: usize,
}

/// Filebench's operations of one fileserver iteration.
pub const FILESERVER_OPERATIONS_PER_ITERATION: u64 = 11;

/// What [`FileServer::run`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FileServerRun {
    /// Operations done (filebench counts every open, close and stat too).
    pub operations: u64,
    pub bytes_written: u64,
    pub bytes_read: u64,
    /// Processor seconds of the driver's threads.
    pub thread_cpu_seconds: f64,
}

impl FileServer {
    /// Creates the directories and the files whose index `Random` puts among the first
    /// `fraction` (filebench's prealloc), with their data; returns the files created.
    pub fn preallocate(
        &self,
        fraction: f64,
        source: &Mutex<BlockSource>,
        seed: u64,
    ) -> Result<u64> {
        self.set.create_directories()?;
        let mut random = Random::new(seed);
        let mut created = 0;
        for index in 0..self.set.files() {
            if (random.next_u64() >> 11) as f64 / (1u64 << 53) as f64 >= fraction {
                continue;
            }
            let blocks = self.file_blocks(&mut random);
            self.write_new(&self.set.path(index), blocks, source)?;
            created += 1;
        }
        Ok(created)
    }

    /// Runs `iterations` iterations on each of `threads` threads.
    pub fn run(
        &self,
        threads: usize,
        iterations: u64,
        source: &Mutex<BlockSource>,
        seed: u64,
    ) -> Result<FileServerRun> {
        assert!(threads > 0 && self.set.files() >= threads as u64);
        let outcomes: Vec<Result<FileServerRun>> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..threads)
                .map(|thread| {
                    scope.spawn(move || {
                        let mut random = Random::new(seed ^ ((thread as u64 + 1) * 0x1000_0001));
                        self.run_thread(thread, threads, iterations, source, &mut random)
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|handle| handle.join().expect("a fileserver thread panicked"))
                .collect()
        });
        let mut total = FileServerRun::default();
        for outcome in outcomes {
            let outcome = outcome?;
            total.operations += outcome.operations;
            total.bytes_written += outcome.bytes_written;
            total.bytes_read += outcome.bytes_read;
            total.thread_cpu_seconds += outcome.thread_cpu_seconds;
        }
        Ok(total)
    }

    fn run_thread(
        &self,
        thread: usize,
        threads: usize,
        iterations: u64,
        source: &Mutex<BlockSource>,
        random: &mut Random,
    ) -> Result<FileServerRun> {
        let cpu_before = thread_seconds();
        let owned: Vec<u64> = (thread as u64..self.set.files()).step_by(threads).collect();
        let mut exists: Vec<bool> = owned
            .iter()
            .map(|&index| self.set.path(index).exists())
            .collect();
        let mut run = FileServerRun::default();
        let mut buffer = vec![0u8; self.io_bytes];
        // A file of the thread's share that exists (or not), drawn at random.
        let pick = |random: &mut Random, exists: &[bool], wanted: bool| -> Option<usize> {
            let candidates: Vec<usize> =
                (0..exists.len()).filter(|&i| exists[i] == wanted).collect();
            (!candidates.is_empty())
                .then(|| candidates[random.below(candidates.len() as u64) as usize])
        };
        for _ in 0..iterations {
            // createfile, writewholefile, closefile
            if let Some(slot) = pick(random, &exists, false) {
                let blocks = self.file_blocks(random);
                run.bytes_written += self.write_new(&self.set.path(owned[slot]), blocks, source)?;
                exists[slot] = true;
                run.operations += 3;
            }
            // openfile, appendfilerand, closefile
            if let Some(slot) = pick(random, &exists, true) {
                let path = self.set.path(owned[slot]);
                let blocks = 1 + random.below(self.append_blocks_max);
                let mut file = fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .context_io(|| format!("opening {}", path.display()))?;
                run.bytes_written += self.write_blocks(&mut file, &path, blocks, source)?;
                run.operations += 3;
            }
            // openfile, readwholefile, closefile
            if let Some(slot) = pick(random, &exists, true) {
                let path = self.set.path(owned[slot]);
                let mut file =
                    fs::File::open(&path).context_io(|| format!("opening {}", path.display()))?;
                loop {
                    let read = file
                        .read(&mut buffer)
                        .context_io(|| format!("reading {}", path.display()))?;
                    if read == 0 {
                        break;
                    }
                    run.bytes_read += read as u64;
                }
                run.operations += 3;
            }
            // deletefile
            if let Some(slot) = pick(random, &exists, true) {
                let path = self.set.path(owned[slot]);
                fs::remove_file(&path).context_io(|| format!("deleting {}", path.display()))?;
                exists[slot] = false;
                run.operations += 1;
            }
            // statfile
            if let Some(slot) = pick(random, &exists, true) {
                let path = self.set.path(owned[slot]);
                fs::metadata(&path).context_io(|| format!("stat of {}", path.display()))?;
                run.operations += 1;
            }
        }
        run.thread_cpu_seconds = thread_seconds() - cpu_before;
        Ok(run)
    }

    fn file_blocks(&self, random: &mut Random) -> u64 {
        1 + random.below(2 * self.mean_file_blocks - 1)
    }

    /// Creates `path` with `blocks` blocks; returns the bytes written.
    fn write_new(&self, path: &Path, blocks: u64, source: &Mutex<BlockSource>) -> Result<u64> {
        let mut file =
            fs::File::create(path).context_io(|| format!("creating {}", path.display()))?;
        self.write_blocks(&mut file, path, blocks, source)
    }

    /// Writes `blocks` blocks from `source` in calls of at most `io_bytes`.
    fn write_blocks(
        &self,
        file: &mut fs::File,
        path: &Path,
        blocks: u64,
        source: &Mutex<BlockSource>,
    ) -> Result<u64> {
        let blocks_per_call = (self.io_bytes / BLOCK_BYTES).max(1) as u64;
        let mut buffer = vec![0u8; blocks_per_call as usize * BLOCK_BYTES];
        let mut left = blocks;
        while left > 0 {
            let now = left.min(blocks_per_call) as usize;
            let part = &mut buffer[..now * BLOCK_BYTES];
            source
                .lock()
                .expect("a thread holding the block source panicked")
                .next_blocks(part);
            file.write_all(part)
                .context_io(|| format!("writing {}", path.display()))?;
            left -= now as u64;
        }
        Ok(blocks * BLOCK_BYTES as u64)
    }
}

/// Writes `bytes` of never-repeating data to a new file at `path` and syncs its file system
/// (paper 1 §5.4.4 step 2: unique data that replaces the cached fingerprints).
pub fn write_unique_file(path: &Path, bytes: u64, seed: u64) -> Result<()> {
    let mut source = BlockSource::new(seed, 0.0);
    let mut file = fs::File::create(path).context_io(|| format!("creating {}", path.display()))?;
    let mut block = [0u8; BLOCK_BYTES];
    for _ in 0..bytes.div_ceil(BLOCK_BYTES as u64) {
        source.next_block(&mut block);
        file.write_all(&block)
            .context_io(|| format!("writing {}", path.display()))?;
    }
    drop(file);
    sync_file_system(path.parent().unwrap_or(path))
}

/// Deterministic 4 KiB blocks of which a chosen fraction repeats an earlier block of the same
/// source (chosen uniformly), the rest being new pseudo-random content. The same seed and
/// fraction always give the same sequence.
#[derive(Clone, Debug)]
pub struct BlockSource {
    state: u64,
    duplicate_fraction: f64,
    /// Seeds of the distinct blocks generated so far.
    seeds: Vec<u64>,
}

impl BlockSource {
    /// A source whose blocks repeat an earlier one with probability `duplicate_fraction`.
    pub fn new(seed: u64, duplicate_fraction: f64) -> BlockSource {
        assert!(
            (0.0..=1.0).contains(&duplicate_fraction),
            "duplicate_fraction {duplicate_fraction} is not a probability"
        );
        BlockSource {
            state: seed ^ 0x9E37_79B9_7F4A_7C15,
            duplicate_fraction,
            seeds: Vec::new(),
        }
    }

    /// Fills `block` with the next block.
    pub fn next_block(&mut self, block: &mut [u8; BLOCK_BYTES]) {
        let draw = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        let seed = if draw < self.duplicate_fraction && !self.seeds.is_empty() {
            let pick = self.next_random() % self.seeds.len() as u64;
            self.seeds[pick as usize]
        } else {
            let seed = self.next_random();
            self.seeds.push(seed);
            seed
        };
        fill_block(seed, block);
    }

    /// Fills `blocks` (a whole number of blocks) with the next blocks.
    pub fn next_blocks(&mut self, blocks: &mut [u8]) {
        assert!(
            blocks.len().is_multiple_of(BLOCK_BYTES),
            "whole blocks only"
        );
        for block in blocks.chunks_exact_mut(BLOCK_BYTES) {
            self.next_block(block.try_into().expect("a whole block"));
        }
    }

    /// Distinct blocks generated so far.
    pub fn distinct_blocks(&self) -> usize {
        self.seeds.len()
    }

    fn next_random(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        splitmix(self.state)
    }
}

fn splitmix(mut value: u64) -> u64 {
    value = (value ^ (value >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    value = (value ^ (value >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    value ^ (value >> 31)
}

/// Pseudo-random content determined by `seed` (never all zeros in practice).
fn fill_block(seed: u64, block: &mut [u8; BLOCK_BYTES]) {
    let mut state = seed;
    for word in block.chunks_exact_mut(8) {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        word.copy_from_slice(&splitmix(state).to_le_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    /// Goal: the duplicate fraction is honoured and sequences are reproducible; method: count
    /// distinct blocks of 4,000 draws at 25% and compare two sources with one seed.
    #[test]
    fn block_source_repeats_the_chosen_fraction() {
        let mut source = BlockSource::new(7, 0.25);
        let mut again = BlockSource::new(7, 0.25);
        let mut distinct = HashSet::new();
        let (mut block, mut other) = ([0u8; BLOCK_BYTES], [0u8; BLOCK_BYTES]);
        for _ in 0..4000 {
            source.next_block(&mut block);
            again.next_block(&mut other);
            assert_eq!(block, other);
            distinct.insert(block);
        }
        let unique_fraction = distinct.len() as f64 / 4000.0;
        assert!((0.72..0.78).contains(&unique_fraction), "{unique_fraction}");
        assert_eq!(distinct.len(), source.distinct_blocks());
        let mut unique = BlockSource::new(1, 0.0);
        let mut seen = HashSet::new();
        for _ in 0..1000 {
            unique.next_block(&mut block);
            assert!(seen.insert(block));
        }
    }

    /// Goal: a tree copy copies files in name order up to the byte limit and skips symlinks;
    /// method: copy a small tree with and without a limit.
    #[test]
    fn copy_tree_copies_in_order_up_to_the_limit() {
        let directory = tempfile::tempdir().unwrap();
        let source = directory.path().join("source");
        fs::create_dir_all(source.join("b/inner")).unwrap();
        fs::write(source.join("a.txt"), vec![1u8; 1000]).unwrap();
        fs::write(source.join("b/inner/c.txt"), vec![2u8; 3000]).unwrap();
        fs::write(source.join("d.txt"), vec![3u8; 500]).unwrap();
        std::os::unix::fs::symlink("a.txt", source.join("link")).unwrap();
        let all = copy_tree(&source, &directory.path().join("all"), u64::MAX, None).unwrap();
        assert_eq!(
            all,
            TreeCopy {
                files: 3,
                directories: 3,
                bytes: 4500
            }
        );
        assert_eq!(
            fs::read(directory.path().join("all/b/inner/c.txt")).unwrap(),
            vec![2u8; 3000]
        );
        assert!(!directory.path().join("all/link").exists());
        // a.txt (1000) then d.txt (500) come before the directory b is entered.
        let part = copy_tree(&source, &directory.path().join("part"), 1200, Some(1)).unwrap();
        assert_eq!(part.files, 2);
        assert_eq!(part.bytes, 1500);
        assert!(!directory.path().join("part/b/inner/c.txt").exists());
    }

    /// Goal: file creation and append drivers do what they count; method: run them in a
    /// temporary directory and inspect the result.
    #[test]
    fn create_and_append_drivers_count_their_work() {
        let directory = tempfile::tempdir().unwrap();
        let files = directory.path().join("files");
        assert_eq!(create_empty_files(&files, 103, 4).unwrap().0, 103);
        assert_eq!(fs::read_dir(&files).unwrap().count(), 103);
        let log = directory.path().join("log");
        let mut source = BlockSource::new(3, 0.5);
        assert_eq!(append_with_fsync(&log, 250, 100, &mut source).unwrap(), 3);
        assert_eq!(fs::metadata(&log).unwrap().len(), 250 * BLOCK_BYTES as u64);
        let unique = directory.path().join("unique");
        write_unique_file(&unique, 10_000, 9).unwrap();
        assert_eq!(fs::metadata(&unique).unwrap().len(), 3 * BLOCK_BYTES as u64);
    }

    /// Goal: a file set lays names out in directories of its width, and the width of a mean
    /// depth follows filebench (depth 1 is one flat directory).
    #[test]
    fn file_sets_lay_out_names() {
        assert_eq!(FileSet::width_for_depth(100_000, 1.0), 100_000);
        assert_eq!(FileSet::width_for_depth(10_000, 2.0), 100);
        assert_eq!(FileSet::width_for_depth(100_000, 1.3), 7_018);
        let set = FileSet::new(Path::new("/r"), 45, 20);
        assert_eq!(set.directories(), 3);
        assert_eq!(set.path(0), Path::new("/r/d00000/f000000000"));
        assert_eq!(set.path(44), Path::new("/r/d00002/f000000044"));
        let mut values: Vec<u64> = (0..100).collect();
        Random::new(5).shuffle(&mut values);
        assert_ne!(values, (0..100).collect::<Vec<_>>());
        values.sort_unstable();
        assert_eq!(values, (0..100).collect::<Vec<_>>());
    }

    /// Goal: creates and deletes run at once and do exactly their lists; method: a set of
    /// 40 names, 20 created first, 10 deleted and 10 created by two threads of each kind.
    #[test]
    fn create_and_delete_do_their_lists() {
        let directory = tempfile::tempdir().unwrap();
        let set = FileSet::new(&directory.path().join("tree"), 40, 7);
        set.create_directories().unwrap();
        let present: Vec<u64> = (0..20).collect();
        create_files(&set, &present).unwrap();
        let absent: Vec<u64> = (20..30).collect();
        let done = create_and_delete(&set, &absent, &present[..10], 2).unwrap();
        assert_eq!((done.creates, done.deletes), (10, 10));
        assert!(done.create_seconds > 0.0 && done.delete_seconds > 0.0);
        for index in 0..40 {
            assert_eq!(
                set.path(index).exists(),
                (10..30).contains(&index),
                "{index}"
            );
        }
    }

    /// Goal: appends to many files write every block and fsync once per group; method: 3
    /// threads, 5 files, 47 appends in groups of 10 (rounded up to 50).
    #[test]
    fn appends_to_files_fsync_per_group() {
        let directory = tempfile::tempdir().unwrap();
        let source = Mutex::new(BlockSource::new(1, 0.5));
        let done = append_to_files(&directory.path().join("logs"), 5, 3, 47, 10, &source).unwrap();
        assert_eq!((done.appends, done.fsyncs), (50, 5));
        let total: u64 = fs::read_dir(directory.path().join("logs"))
            .unwrap()
            .map(|entry| entry.unwrap().metadata().unwrap().len())
            .sum();
        assert_eq!(total, 50 * BLOCK_BYTES as u64);
    }

    /// Goal: the file server preallocates about its fraction and counts filebench's eleven
    /// operations per iteration; method: 60 files, 80% preallocated, 2 threads of 5
    /// iterations.
    #[test]
    fn file_server_counts_filebench_operations() {
        let directory = tempfile::tempdir().unwrap();
        let server = FileServer {
            set: FileSet::new(&directory.path().join("fs"), 60, 20),
            mean_file_blocks: 4,
            append_blocks_max: 7,
            io_bytes: 16 << 10,
        };
        let source = Mutex::new(BlockSource::new(2, 0.25));
        let created = server.preallocate(0.8, &source, 3).unwrap();
        assert!((36..=58).contains(&created), "{created}");
        let run = server.run(2, 5, &source, 4).unwrap();
        assert_eq!(run.operations, 2 * 5 * FILESERVER_OPERATIONS_PER_ITERATION);
        assert!(run.bytes_written >= 2 * 5 * 2 * BLOCK_BYTES as u64);
        assert!(run.bytes_read > 0);
    }
}
