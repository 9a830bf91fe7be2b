//! The ranker (paper 3 §4.2): the ranking algorithm of Fig. 5 and the walk over the rank
//! queues of Fig. 6 that decides which files to deduplicate and how.
//!
//! The queues are LRU lists of inodes (see `engine::FileSystem::queues`): a write moves a
//! file to the top of Q_Rank0, a read to the top of the queue it is in (a cold, rank-3 file
//! to the top of Q_Rank0). When the ranker runs it
//!
//! 1. takes cold files from the LRU end of Q_Rank1 and Q_Rank2 (rank 3: small chunks), until
//!    the last entry of each is hot;
//! 2. walks Q_Rank0 from its LRU end to its top and ranks each file by [`rank`]; a file that
//!    stays rank 0 (modified within MIN_EVALUATION_INT, or read fewer than
//!    MIN_EVALUATION_CNT times) is left for a later run.
//!
//! The walk is pure ([`plan_ranks`]): it reads the queues and the monitor records and
//! returns what to do; the deduplicator executes it.

use crate::node::{Chunking, Monitor, Rank};
use crate::options::FsOptions;

const NANOS_PER_SECOND: i64 = 1_000_000_000;

/// The ranking algorithm of paper 3, Fig. 5.
pub fn rank(monitor: &Monitor, now_ns: i64, options: &FsOptions) -> Rank {
    let seconds = |ns: i64| ns / NANOS_PER_SECOND;
    let since_modified = seconds(now_ns.saturating_sub(monitor.modify_ns));
    let since_accessed = seconds(now_ns.saturating_sub(monitor.access_ns));
    if since_modified < options.min_evaluation_interval_seconds as i64 {
        0
    } else if since_accessed > options.max_hot_interval_seconds as i64 {
        3
    } else if monitor.sequential_reads + monitor.random_reads < options.min_evaluation_count {
        0
    } else if monitor.sequential_reads > monitor.random_reads {
        1
    } else {
        2
    }
}

/// Files of at most this many small chunks are cut small whatever their rank.
///
/// Why: the I/O monitor cannot rank them. The kernel reads ahead from a read at offset 0
/// (16 KiB for a 4 KiB read), so a random read at the start of a small file reaches the file
/// system as the start of a sequential one, and a small file often gets no second read that
/// would tell. And their layout matters little: read whole, such a file costs at most this
/// many chunk reads where its data is shared, one where it is not (its new small chunks are
/// stored in file order).
pub const SMALL_FILE_CHUNKS_MAX: u64 = 8;

/// How a file of `rank` and `bytes` is chunked (paper 3, Table 1; see
/// [`SMALL_FILE_CHUNKS_MAX`]).
pub fn chunking_of(rank: Rank, bytes: u64, options: &FsOptions) -> Chunking {
    match rank {
        0 => Chunking::Plain,
        1 if bytes > SMALL_FILE_CHUNKS_MAX * options.small_chunk_bytes => Chunking::Big,
        _ => Chunking::Small,
    }
}

/// One file the ranker gave a new rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ranked {
    pub ino: u64,
    pub rank_before: Rank,
    pub rank: Rank,
}

/// The ranker's walk (see the module documentation) over queues given LRU end first, each
/// entry an inode and its monitor record. Returns the files whose rank changes to 1, 2 or 3
/// (or that are rank 0 with a rank to take), in the order to deduplicate them.
pub fn plan_ranks(
    queues: [Vec<(u64, Monitor)>; 3],
    now_ns: i64,
    options: &FsOptions,
) -> Vec<Ranked> {
    let [queue_0, queue_1, queue_2] = queues;
    let mut ranked = Vec::new();
    for queue in [queue_1, queue_2] {
        for (ino, monitor) in queue {
            let cold = now_ns.saturating_sub(monitor.access_ns) / NANOS_PER_SECOND
                > options.max_hot_interval_seconds as i64;
            if !cold {
                break;
            }
            ranked.push(Ranked {
                ino,
                rank_before: monitor.rank,
                rank: 3,
            });
        }
    }
    for (ino, monitor) in queue_0 {
        let rank = rank(&monitor, now_ns, options);
        if rank != 0 {
            ranked.push(Ranked {
                ino,
                rank_before: monitor.rank,
                rank,
            });
        }
    }
    ranked
}

#[cfg(test)]
mod tests {
    use super::*;

    fn monitor(modified_ago: i64, accessed_ago: i64, sequential: u64, random: u64) -> Monitor {
        let now = 1_000_000 * NANOS_PER_SECOND;
        Monitor {
            modify_ns: now - modified_ago * NANOS_PER_SECOND,
            access_ns: now - accessed_ago * NANOS_PER_SECOND,
            sequential_reads: sequential,
            random_reads: random,
            ..Monitor::default()
        }
    }

    /// Goal: each branch of Fig. 5 with Table 2's defaults. Method: one monitor record per
    /// branch, ranked at a fixed now.
    #[test]
    fn ranking_algorithm_follows_fig_5() {
        let now = 1_000_000 * NANOS_PER_SECOND;
        let options = FsOptions::default();
        let day = 24 * 3600;
        // Modified within MIN_EVALUATION_INT (2 days): rank 0 whatever its reads.
        assert_eq!(rank(&monitor(day, 0, 500, 0), now, &options), 0);
        // Not accessed for more than MAX_HOT_INT (2 weeks): cold.
        assert_eq!(rank(&monitor(20 * day, 15 * day, 500, 0), now, &options), 3);
        // Hot but fewer than MIN_EVALUATION_CNT (100) reads.
        assert_eq!(rank(&monitor(3 * day, 0, 60, 39), now, &options), 0);
        assert_eq!(rank(&monitor(3 * day, 0, 61, 39), now, &options), 1);
        assert_eq!(rank(&monitor(3 * day, 0, 50, 50), now, &options), 2);
    }

    /// Goal: the queue walk takes cold files from the LRU ends of Q1 and Q2 only until a hot
    /// one, and ranks Q0 in full. Method: hand-built queues.
    #[test]
    fn queue_walk_stops_at_first_hot_file() {
        let now = 1_000_000 * NANOS_PER_SECOND;
        let options = FsOptions {
            min_evaluation_interval_seconds: 10,
            max_hot_interval_seconds: 100,
            min_evaluation_count: 2,
            ..FsOptions::default()
        };
        let cold = monitor(1000, 1000, 5, 0);
        let hot = monitor(1000, 1, 5, 0);
        let plan = plan_ranks(
            [
                vec![(10, monitor(5, 5, 9, 0)), (11, monitor(50, 1, 1, 4))],
                vec![(20, cold), (21, hot), (22, cold)],
                vec![(30, cold)],
            ],
            now,
            &options,
        );
        let inos: Vec<(u64, Rank)> = plan.iter().map(|r| (r.ino, r.rank)).collect();
        assert_eq!(inos, vec![(20, 3), (30, 3), (11, 2)]);
    }
}
