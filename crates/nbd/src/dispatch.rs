//! The hand-off between a connection's reader and its workers: a job queue, the in-flight
//! admission limits and the payload buffer pool.
//!
//! Waking a sleeping thread, and contending for a lock, are the dominant costs of a small
//! request on a machine with few cores. So:
//! - The reader collects jobs in its own [`Intake`] and *publishes* them to the shared queue
//!   in batches, taking the lock once per batch: when the reader is about to block (on the
//!   socket or on admission), or when [`PUBLISH_BATCH_JOBS`] jobs have piled up. Publishing
//!   wakes at most one idle worker per published job.
//! - A worker that finishes a job takes the next one without sleeping, so under load
//!   workers rarely sleep at all.
//! - Admission counts are atomics: the reader takes the lock only when a limit forces it to
//!   wait; workers release under the queue lock they take anyway for their next job.
//! - Payload buffers return to the pool under the worker's queue lock and reach the reader in
//!   batches when it publishes.
//!
//! When the client is gone (a reply could not be sent, or the socket hung up), the connection
//! is *abandoned* ([`Dispatch::abandon`]): queued jobs are dropped without being executed or
//! answered, workers stop taking jobs, and the reader stops admitting requests. Jobs already
//! running finish; their replies go nowhere.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::{Condvar, Mutex};

use crate::protocol;
use crate::request::Command;
use crate::transport::Activity;

/// Jobs the reader collects before publishing them even though it is not about to block.
pub(crate) const PUBLISH_BATCH_JOBS: usize = 8;
/// Most writes a worker takes from the queue at once (see [`Dispatch::next_jobs`]).
pub(crate) const WRITE_BATCH_JOBS_MAX: usize = 16;
/// Writes are batched while the payload of the run stays within this. Batching pays for
/// small writes, whose fixed costs (a wake-up, a lock, a hash set-up) rival their work; a
/// large write amortises those alone, and a batch of large ones would only hold the engine
/// lock longer while the other worker waits.
pub(crate) const WRITE_BATCH_BYTES_MAX: usize = 64 << 10;
/// Pooled buffers larger than this are freed after use instead of being kept.
const POOLED_BUFFER_BYTES_MAX: usize = 1 << 20;
/// Most buffers a connection's pool keeps.
const POOLED_BUFFERS_MAX: usize = 32;

/// One admitted request on its way to a worker.
pub(crate) struct Job {
    pub cookie: u64,
    pub command: Command,
    /// A write's payload or room for a read's data; empty for other commands. May be longer
    /// than the command's length (pooled buffers keep their size).
    pub buffer: Vec<u8>,
}

/// The state shared by the reader and the workers of one connection.
pub(crate) struct Dispatch<'a> {
    state: Mutex<State>,
    /// Workers wait here for jobs.
    work_available: Condvar,
    /// The reader waits here for admission.
    capacity_released: Condvar,
    /// Payload bytes of requests admitted and not yet answered; their number is
    /// [`Activity::requests_in_flight`], where the server sees it. Only the reader increases
    /// them, so a check followed by an increase cannot overshoot.
    in_flight_bytes: AtomicUsize,
    activity: &'a Activity,
    /// Set by [`Dispatch::abandon`]; read without the lock by the reader.
    abandoned: AtomicBool,
    /// Set while the reader waits for admission; releasing workers then notify it.
    reader_waiting: AtomicBool,
    requests_max: usize,
    bytes_max: usize,
}

struct State {
    queue: VecDeque<Job>,
    idle_workers: usize,
    closed: bool,
    abandoned: bool,
    free_buffers: Vec<Vec<u8>>,
}

impl<'a> Dispatch<'a> {
    pub(crate) fn new(requests_max: usize, bytes_max: usize, activity: &'a Activity) -> Self {
        assert!(requests_max > 0);
        assert!(bytes_max >= protocol::PAYLOAD_BYTES_MAX as usize);
        assert_eq!(activity.requests_in_flight(), 0);
        Dispatch {
            state: Mutex::new(State {
                queue: VecDeque::with_capacity(requests_max.min(1024)),
                idle_workers: 0,
                closed: false,
                abandoned: false,
                free_buffers: Vec::new(),
            }),
            work_available: Condvar::new(),
            capacity_released: Condvar::new(),
            in_flight_bytes: AtomicUsize::new(0),
            activity,
            abandoned: AtomicBool::new(false),
            reader_waiting: AtomicBool::new(false),
            requests_max,
            bytes_max,
        }
    }

    /// The reader's side. There must be exactly one per connection.
    pub(crate) fn intake(&self) -> Intake<'_, 'a> {
        Intake {
            dispatch: self,
            pending: Vec::with_capacity(PUBLISH_BATCH_JOBS),
            buffers: Vec::new(),
        }
    }

    /// The client is gone: drops every queued job (releasing its admission) and makes
    /// [`next_jobs`](Self::next_jobs) return false and [`Intake::admit`] return `None` from now
    /// on. Idempotent.
    pub(crate) fn abandon(&self) {
        let mut state = self.state.lock();
        if state.abandoned {
            return;
        }
        state.abandoned = true;
        self.abandoned.store(true, Ordering::SeqCst);
        let dropped: Vec<Job> = state.queue.drain(..).collect();
        for job in &dropped {
            self.release_locked(job.command.buffer_bytes());
        }
        drop(state);
        self.work_available.notify_all();
        self.capacity_released.notify_all();
    }

    /// True once [`abandon`](Self::abandon) was called.
    pub(crate) fn is_abandoned(&self) -> bool {
        self.abandoned.load(Ordering::SeqCst)
    }

    /// Worker: reports the previous jobs done (their buffers and payload bytes, drained from
    /// `finished`) and waits for the next job, or the next run of writes, which it puts in
    /// `jobs` (empty on entry). Returns false once the reader has closed the queue and it is
    /// empty, or once the connection is abandoned.
    ///
    /// Writes waiting one after the other at the front of the queue are taken together, so
    /// the export can execute them as one batch ([`crate::Export::write_batch`]); a worker
    /// takes half of such a run (rounded up, at most [`WRITE_BATCH_JOBS_MAX`]) and leaves the
    /// rest to the other workers, which work on them meanwhile. Only small writes are batched
    /// ([`WRITE_BATCH_BYTES_MAX`]).
    pub(crate) fn next_jobs(
        &self,
        finished: &mut Vec<(Vec<u8>, usize)>,
        jobs: &mut Vec<Job>,
    ) -> bool {
        assert!(jobs.is_empty());
        let mut state = self.state.lock();
        for (buffer, bytes) in finished.drain(..) {
            if !buffer.is_empty()
                && buffer.len() <= POOLED_BUFFER_BYTES_MAX
                && state.free_buffers.len() < POOLED_BUFFERS_MAX
            {
                state.free_buffers.push(buffer);
            }
            self.release_locked(bytes);
        }
        loop {
            if state.abandoned {
                return false;
            }
            if let Some(job) = state.queue.pop_front() {
                let batchable = job.command.is_batchable_write()
                    && job.command.buffer_bytes() <= WRITE_BATCH_BYTES_MAX;
                jobs.push(job);
                if batchable {
                    let mut bytes = 0;
                    let run = state
                        .queue
                        .iter()
                        .take(2 * WRITE_BATCH_JOBS_MAX)
                        .take_while(|job| {
                            bytes += job.command.buffer_bytes();
                            job.command.is_batchable_write() && bytes <= 2 * WRITE_BATCH_BYTES_MAX
                        })
                        .count();
                    // Half of the whole run (this job included), rounded up.
                    let share = (run + 1).div_ceil(2).min(WRITE_BATCH_JOBS_MAX);
                    jobs.extend(state.queue.drain(..share - 1));
                }
                return true;
            }
            if state.closed {
                return false;
            }
            state.idle_workers += 1;
            self.work_available.wait(&mut state);
            state.idle_workers -= 1;
        }
    }

    fn fits(&self, bytes: usize) -> bool {
        self.activity.requests_in_flight() < self.requests_max
            && self.in_flight_bytes.load(Ordering::SeqCst) + bytes <= self.bytes_max
    }

    /// Ends an admission. The caller must hold the state lock: the reader checks the counts
    /// and starts waiting under that lock, so a release cannot slip between its check and its
    /// wait unnoticed.
    fn release_locked(&self, bytes: usize) {
        let requests = self.activity.request_ended();
        let previous_bytes = self.in_flight_bytes.fetch_sub(bytes, Ordering::SeqCst);
        assert!(requests > 0, "released more requests than admitted");
        assert!(previous_bytes >= bytes, "released more bytes than admitted");
        if self.reader_waiting.load(Ordering::SeqCst) {
            self.capacity_released.notify_one();
        }
    }
}

/// The reader's handle on a [`Dispatch`]: admits requests and queues jobs in batches.
pub(crate) struct Intake<'d, 'a> {
    dispatch: &'d Dispatch<'a>,
    /// Jobs not yet published to the shared queue.
    pending: Vec<Job>,
    /// Pooled buffers taken from the shared pool at the last publish.
    buffers: Vec<Vec<u8>>,
}

impl Intake<'_, '_> {
    /// Waits until one more request with `bytes` of payload fits in the limits, counts it as
    /// in flight and returns a buffer of at least `bytes` initialised bytes (empty if `bytes`
    /// is zero). Returns `None`, admitting nothing, once the connection is abandoned.
    pub(crate) fn admit(&mut self, bytes: usize) -> Option<Vec<u8>> {
        let dispatch = self.dispatch;
        assert!(bytes <= dispatch.bytes_max);
        if dispatch.is_abandoned() {
            return None;
        }
        if !dispatch.fits(bytes) {
            // The jobs holding the capacity must be running, or the wait never ends.
            self.publish();
            let mut state = dispatch.state.lock();
            dispatch.reader_waiting.store(true, Ordering::SeqCst);
            while !dispatch.fits(bytes) && !state.abandoned {
                dispatch.capacity_released.wait(&mut state);
            }
            dispatch.reader_waiting.store(false, Ordering::SeqCst);
            if state.abandoned {
                return None;
            }
        }
        dispatch.activity.request_started();
        dispatch.in_flight_bytes.fetch_add(bytes, Ordering::SeqCst);
        if bytes == 0 {
            return Some(Vec::new());
        }
        let mut buffer = self.buffers.pop().unwrap_or_default();
        if buffer.len() < bytes {
            buffer.resize(bytes, 0);
        }
        Some(buffer)
    }

    /// Gives back an admission whose job will not be queued (its payload could not be read).
    pub(crate) fn cancel(&mut self, bytes: usize) {
        let _state = self.dispatch.state.lock();
        self.dispatch.release_locked(bytes);
    }

    /// Queues an admitted job; it reaches the workers at the next publish.
    pub(crate) fn push(&mut self, job: Job) {
        self.pending.push(job);
        if self.pending.len() >= PUBLISH_BATCH_JOBS {
            self.publish();
        }
    }

    /// Hands the pending jobs to the workers, waking idle ones. Must be called before the
    /// reader blocks.
    pub(crate) fn publish(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let published = self.pending.len();
        let mut state = self.dispatch.state.lock();
        if state.abandoned {
            for job in self.pending.drain(..) {
                self.dispatch.release_locked(job.command.buffer_bytes());
            }
            return;
        }
        state.queue.extend(self.pending.drain(..));
        let spare = state.free_buffers.len().min(PUBLISH_BATCH_JOBS);
        let keep = state.free_buffers.len() - spare;
        self.buffers.extend(state.free_buffers.drain(keep..));
        let wake = published.min(state.idle_workers);
        drop(state);
        for _ in 0..wake {
            self.dispatch.work_available.notify_one();
        }
    }

    /// Publishes what is pending and tells the workers no more jobs will come; they finish
    /// the queue and exit.
    pub(crate) fn close(mut self) {
        self.publish();
        let mut state = self.dispatch.state.lock();
        state.closed = true;
        drop(state);
        self.dispatch.work_available.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(cookie: u64, command: Command) -> Job {
        let bytes = command.buffer_bytes();
        Job {
            cookie,
            command,
            buffer: vec![0; bytes],
        }
    }

    fn write(cookie: u64, length: u32) -> Job {
        job(
            cookie,
            Command::Write {
                offset: cookie * 4096,
                length,
                fua: false,
            },
        )
    }

    /// Goal: a worker takes half of a run of small writes (rounded up), never a read or a
    /// large write with them, and at most the batch limits. Method: queue jobs, take them.
    #[test]
    fn workers_take_half_of_a_run_of_small_writes() {
        let activity = Activity::new();
        let dispatch = Dispatch::new(1024, 64 << 20, &activity);
        let mut intake = dispatch.intake();
        let mut queued = Vec::new();
        for cookie in 0..5 {
            queued.push(write(cookie, 4096));
        }
        queued.push(job(
            5,
            Command::Read {
                offset: 0,
                length: 4096,
            },
        ));
        queued.push(write(6, 4096));
        queued.push(write(7, 1 << 20));
        for cookie in 8..48 {
            queued.push(write(cookie, 4096));
        }
        for queued in queued {
            let bytes = queued.command.buffer_bytes();
            let _ = intake.admit(bytes).expect("admitted");
            intake.push(queued);
        }
        intake.close();
        let mut taken = Vec::new();
        let mut finished = Vec::new();
        let mut jobs = Vec::new();
        while dispatch.next_jobs(&mut finished, &mut jobs) {
            taken.push(jobs.iter().map(|job| job.cookie).collect::<Vec<_>>());
            finished.extend(jobs.drain(..).map(|job| {
                let bytes = job.command.buffer_bytes();
                (job.buffer, bytes)
            }));
        }
        assert_eq!(taken[0], vec![0, 1, 2], "half of five, rounded up");
        assert_eq!(taken[1], vec![3], "half of two");
        assert_eq!(taken[2], vec![4]);
        assert_eq!(taken[3], vec![5], "a read goes alone");
        assert_eq!(taken[4], vec![6], "a large write ends the run");
        assert_eq!(taken[5], vec![7], "a large write goes alone");
        // 40 small writes: the limits count 32 of them, half is 16 (the job limit).
        assert_eq!(taken[6], (8..24).collect::<Vec<_>>());
        assert!(taken[7..]
            .iter()
            .all(|batch| batch.len() <= WRITE_BATCH_JOBS_MAX));
        let all: Vec<u64> = taken.concat();
        assert_eq!(all, (0..48).collect::<Vec<_>>(), "every job once, in order");
        assert_eq!(activity.requests_in_flight(), 0);
    }

    /// Goal: abandoning a connection drops its queued jobs (releasing their admissions),
    /// stops the workers and refuses further admissions, also to a reader waiting for room.
    /// Method: fill the admission limit, wait for room on another thread, abandon.
    #[test]
    fn abandoning_drops_queued_jobs_and_wakes_the_reader() {
        let activity = Activity::new();
        let dispatch = Dispatch::new(4, 64 << 20, &activity);
        let mut intake = dispatch.intake();
        for cookie in 0..4 {
            let buffer = intake.admit(4096).expect("admitted");
            intake.push(Job {
                cookie,
                command: Command::Read {
                    offset: 0,
                    length: 4096,
                },
                buffer,
            });
        }
        assert_eq!(activity.requests_in_flight(), 4);
        std::thread::scope(|scope| {
            let waiting = scope.spawn(move || intake.admit(4096).is_none());
            while !dispatch.reader_waiting.load(Ordering::SeqCst) {
                std::thread::yield_now();
            }
            dispatch.abandon();
            assert!(waiting.join().unwrap(), "the waiting reader is refused");
        });
        assert_eq!(activity.requests_in_flight(), 0, "queued jobs released");
        let mut jobs = Vec::new();
        assert!(!dispatch.next_jobs(&mut Vec::new(), &mut jobs));
        assert!(jobs.is_empty(), "no job reaches a worker");
    }
}
