//! The transmission phase of one connection: a reader parses and validates requests, a small
//! pool of workers executes them against the export, and replies go out through one shared,
//! lock-protected writer.
//!
//! Data path of a request:
//! 1. The reader (the connection's own thread) reads a 28-byte header from a buffered
//!    stream and validates it ([`request::validate`]). Rejected requests are answered right
//!    away (after skipping a rejected write's payload).
//! 2. It waits for *admission* ([`Dispatch::admit`]): at most `requests_in_flight_max`
//!    requests and `in_flight_payload_bytes_max` payload bytes may be between admission and
//!    reply. This is the connection's only memory bound, and the reason a client that sends
//!    faster than the export works simply stops being read.
//! 3. It takes a buffer from the connection's pool, reads a write's payload into it, and
//!    queues the job; jobs reach the workers in batches (see [`crate::dispatch`]).
//! 4. A worker runs the export call, then writes the reply under the writer lock. Replies are
//!    collected in a buffered writer that is flushed only when no other worker is waiting for
//!    the lock, so a burst of small replies costs one system call.
//! 5. The worker returns the buffer and releases the admission as it takes its next job.
//!
//! Replies may leave in any order, as the protocol allows. On `CMD_DISC`, end of stream or a
//! protocol violation the reader stops; in-flight requests still complete and are answered
//! before the connection closes (a client that only closed its sending side still gets its
//! replies). Once the client is gone — a reply cannot be sent, reading fails, or the stream
//! ends with the socket hung up in both directions — the connection is abandoned: queued
//! requests are dropped unexecuted, no more are admitted, and only requests already running
//! finish (see [`crate::dispatch`]). If sending a reply fails, the connection is also shut
//! down so the reader wakes up, and the error is returned.

use std::io::{self, BufReader, BufWriter, IoSlice, Read, Write};
use std::panic::{self, AssertUnwindSafe};
use std::thread;

use parking_lot::Mutex;

use crate::codec::{self, RequestHeader};
use crate::config::ServerConfig;
use crate::dispatch::{Dispatch, Intake, Job};
use crate::error::{Event, EventSink, NbdError};
use crate::export::{AllocationExtent, Export, ExportError, WriteRequest, ZeroOptions};
use crate::handshake::{Session, BASE_ALLOCATION_CONTEXT_ID};
use crate::protocol;
use crate::request::{self, Command, Decision};
use crate::transport::{peer_hung_up, Activity, Transport};

/// Capacity of the buffered reader: enough for many queued request headers per system call.
const READ_BUFFER_BYTES: usize = 256 << 10;
/// Capacity of the buffered writer that batches small replies.
const WRITE_BUFFER_BYTES: usize = 64 << 10;

/// How the reader stopped.
enum End {
    /// `CMD_DISC`, or the client closed its sending side: queued requests are answered.
    Disconnected,
    /// The client closed the connection in both directions: nothing can be answered.
    HungUp,
}

/// Runs the transmission phase until the client disconnects. Returns after every admitted
/// request has been answered, or dropped if the client is gone.
pub(crate) fn transmit<T: Transport>(
    stream: T,
    session: &Session,
    config: &ServerConfig,
    activity: &Activity,
) -> Result<(), NbdError> {
    let clone = |stream: &T| {
        stream
            .try_clone()
            .map_err(|error| NbdError::io("duplicating the connection socket", error))
    };
    let mut reader = BufReader::with_capacity(READ_BUFFER_BYTES, clone(&stream)?);
    let dispatch = Dispatch::new(
        config.requests_in_flight_max,
        config.in_flight_payload_bytes_max,
        activity,
    );
    let writer = ReplyWriter {
        output: Mutex::new(BufWriter::with_capacity(
            WRITE_BUFFER_BYTES,
            clone(&stream)?,
        )),
        waiting: std::sync::atomic::AtomicUsize::new(0),
        failure: Mutex::new(None),
        dispatch: &dispatch,
        stream,
    };
    let shared = Shared {
        session,
        writer: &writer,
        dispatch: &dispatch,
        events: &config.events,
    };

    let read_result = thread::scope(|scope| {
        let mut workers = 0;
        for index in 0..config.workers_per_connection {
            let shared = &shared;
            let spawned = thread::Builder::new()
                .name(format!("nbd-worker-{index}"))
                .spawn_scoped(scope, move || work(shared));
            if spawned.is_ok() {
                workers += 1;
            }
        }
        if workers == 0 {
            return Err(NbdError::io(
                "starting connection workers",
                io::Error::other("no worker thread could be started"),
            ));
        }
        let mut intake = dispatch.intake();
        let result = read_requests(&mut reader, &shared, &mut intake);
        // Closing the queue lets the workers finish what is queued and exit.
        intake.close();
        result
    });

    let write_result = writer.finish();
    if write_result.is_ok() && !dispatch.is_abandoned() {
        // Best effort: the client may be gone already.
        let _ = writer.stream.close_session();
    }
    match read_result {
        // Replies to requests that were running when the client left could not be sent;
        // that is the client's choice, not a failure.
        Ok(End::HungUp) => Ok(()),
        Ok(End::Disconnected) => write_result,
        Err(error) => Err(error),
    }
}

/// What the reader and the workers share.
struct Shared<'a, T: Transport> {
    session: &'a Session,
    writer: &'a ReplyWriter<'a, T>,
    dispatch: &'a Dispatch<'a>,
    events: &'a EventSink,
}

fn read_requests<T: Transport>(
    reader: &mut BufReader<T>,
    shared: &Shared<'_, T>,
    intake: &mut Intake<'_, '_>,
) -> Result<End, NbdError> {
    let limits = &shared.session.limits;
    // Stops the reader once the client is gone, with the send error that showed it.
    let gone = |shared: &Shared<'_, T>| {
        shared
            .writer
            .take_failure(io::Error::from(io::ErrorKind::BrokenPipe))
    };
    loop {
        if shared.dispatch.is_abandoned() {
            return gone(shared).map(|()| End::HungUp);
        }
        if reader.buffer().len() < protocol::REQUEST_HEADER_BYTES {
            // The next read may block: queued jobs must be running meanwhile.
            intake.publish();
        }
        let mut bytes = [0; protocol::REQUEST_HEADER_BYTES];
        match reader.read_exact(&mut bytes) {
            Ok(()) => {}
            // A client that closes without CMD_DISC (or a server shutdown) ends the
            // connection the same way; if it closed both directions, nobody is left to
            // answer.
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                if peer_hung_up(reader.get_ref().as_raw_fd()) {
                    shared.dispatch.abandon();
                    return Ok(End::HungUp);
                }
                return Ok(End::Disconnected);
            }
            Err(error) => {
                shared.dispatch.abandon();
                if shared.writer.failed() {
                    return shared.writer.take_failure(error).map(|()| End::HungUp);
                }
                return Err(NbdError::io("reading a request header", error));
            }
        }
        let header = RequestHeader::decode(&bytes)?;
        match request::validate(&header, limits) {
            Decision::Execute(command) => {
                let buffer_bytes = command.buffer_bytes();
                let Some(mut buffer) = intake.admit(buffer_bytes) else {
                    return gone(shared).map(|()| End::HungUp);
                };
                if let Command::Write { length, .. } = command {
                    let length = length as usize;
                    if reader.buffer().len() < length {
                        intake.publish();
                    }
                    if let Err(error) = reader.read_exact(&mut buffer[..length]) {
                        intake.cancel(buffer_bytes);
                        shared.dispatch.abandon();
                        return Err(NbdError::io("reading a write payload", error));
                    }
                }
                intake.push(Job {
                    cookie: header.cookie,
                    command,
                    buffer,
                });
            }
            Decision::Reject {
                error,
                message,
                payload_bytes,
            } => {
                intake.publish();
                let skipped = io::copy(
                    &mut reader.by_ref().take(u64::from(payload_bytes)),
                    &mut io::sink(),
                )
                .map_err(|error| NbdError::io("skipping a rejected write payload", error))?;
                if skipped != u64::from(payload_bytes) {
                    return Err(NbdError::io(
                        "skipping a rejected write payload",
                        io::Error::from(io::ErrorKind::UnexpectedEof),
                    ));
                }
                let mut scratch = Vec::new();
                send_error(shared, &mut scratch, header.cookie, error, message);
            }
            Decision::Disconnect => return Ok(End::Disconnected),
            Decision::Close(violation) => return Err(violation.into()),
        }
    }
}

/// A worker: executes queued jobs until the queue closes.
fn work<T: Transport>(shared: &Shared<'_, T>) {
    let mut extents: Vec<AllocationExtent> = Vec::new();
    let mut scratch: Vec<u8> = Vec::new();
    let mut finished = Vec::new();
    let mut jobs = Vec::new();
    let mut results = Vec::new();
    while shared.dispatch.next_jobs(&mut finished, &mut jobs) {
        let executed = panic::catch_unwind(AssertUnwindSafe(|| match jobs.as_mut_slice() {
            [job] => execute(shared, job, &mut extents, &mut scratch),
            batch => execute_writes(shared, batch, &mut results, &mut scratch),
        }));
        if let Err(payload) = executed {
            // A bug in the export must not leave the client waiting forever or stall the
            // connection's in-flight accounting: answer EIO and report it. (A panic comes
            // before any reply of its jobs: replies are sent after the export call.)
            let message = payload
                .downcast_ref::<&str>()
                .map(|text| text.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let error = ExportError::failed(format!("the export panicked: {message}"));
            for job in &jobs {
                report_failure(shared, &job.command, &error);
                send_error(
                    shared,
                    &mut scratch,
                    job.cookie,
                    protocol::EIO,
                    &error.to_string(),
                );
            }
        }
        finished.extend(jobs.drain(..).map(|job| {
            let bytes = job.command.buffer_bytes();
            (job.buffer, bytes)
        }));
    }
}

/// Executes a run of writes as one [`Export::write_batch`] and answers each; the successful
/// ones with one send.
fn execute_writes<T: Transport>(
    shared: &Shared<'_, T>,
    jobs: &[Job],
    results: &mut Vec<Result<(), ExportError>>,
    scratch: &mut Vec<u8>,
) {
    let writes: Vec<WriteRequest<'_>> = jobs
        .iter()
        .map(|job| match job.command {
            Command::Write {
                offset,
                length,
                fua,
            } => WriteRequest {
                offset,
                data: &job.buffer[..length as usize],
                fua,
            },
            _ => unreachable!("batches hold writes only"),
        })
        .collect();
    results.clear();
    shared.session.export.write_batch(&writes, results);
    assert_eq!(results.len(), jobs.len(), "one result per write");
    let mut headers = Vec::with_capacity(jobs.len());
    for (job, result) in jobs.iter().zip(results.drain(..)) {
        match result {
            Ok(()) => headers.push(codec::encode_simple_reply(0, job.cookie)),
            Err(error) => {
                report_failure(shared, &job.command, &error);
                let message = error.to_string();
                send_error(shared, scratch, job.cookie, error.errno(), &message);
            }
        }
    }
    let mut parts: Vec<IoSlice<'_>> = headers.iter().map(|header| IoSlice::new(header)).collect();
    if !parts.is_empty() {
        shared.writer.send(&mut parts);
    }
}

fn report_failure<T: Transport>(shared: &Shared<'_, T>, command: &Command, error: &ExportError) {
    let (offset, length) = command.range();
    (shared.events)(&Event::ExportFailed {
        export: &shared.session.export_name,
        command: command.name(),
        offset,
        length: u64::from(length),
        errno: error.errno(),
        error,
    });
}

fn execute<T: Transport>(
    shared: &Shared<'_, T>,
    job: &mut Job,
    extents: &mut Vec<AllocationExtent>,
    scratch: &mut Vec<u8>,
) {
    let export: &dyn Export = shared.session.export.as_ref();
    let structured = shared.session.limits.structured_replies;
    let cookie = job.cookie;
    let result = match job.command {
        Command::Read { offset, length } => {
            let data = &mut job.buffer[..length as usize];
            let result = if length == 0 {
                Ok(())
            } else {
                export.read(offset, data)
            };
            if result.is_ok() {
                send_read_data(shared, cookie, offset, data);
                return;
            }
            result
        }
        Command::Write {
            offset,
            length,
            fua,
        } => match length {
            0 => Ok(()),
            _ => export.write(offset, &job.buffer[..length as usize], fua),
        },
        Command::Flush => export.flush(),
        Command::Trim {
            offset,
            length,
            fua,
        } => match length {
            0 => Ok(()),
            _ => export.trim(offset, u64::from(length), fua),
        },
        Command::Cache { offset, length } => match length {
            0 => Ok(()),
            _ => export.cache(offset, u64::from(length)),
        },
        Command::WriteZeroes {
            offset,
            length,
            fua,
            may_punch_hole,
            fast_only,
        } => match length {
            0 => Ok(()),
            _ => export.write_zeroes(
                offset,
                u64::from(length),
                ZeroOptions {
                    fua,
                    may_punch_hole,
                    fast_only,
                },
            ),
        },
        Command::BlockStatus {
            offset,
            length,
            single_extent,
        } => {
            assert!(
                structured,
                "validation allows block status only with structured replies"
            );
            extents.clear();
            match export.block_status(offset, u64::from(length), extents) {
                Ok(()) => {
                    scratch.clear();
                    let encoded = codec::put_block_status_chunk(
                        scratch,
                        cookie,
                        BASE_ALLOCATION_CONTEXT_ID,
                        length,
                        single_extent,
                        extents,
                    );
                    match encoded {
                        Ok(_) => shared.writer.send(&mut [IoSlice::new(scratch)]),
                        Err(reason) => {
                            (shared.events)(&Event::ExportContractBroken {
                                export: &shared.session.export_name,
                                reason,
                            });
                            send_error(shared, scratch, cookie, protocol::EIO, reason);
                        }
                    }
                    return;
                }
                Err(error) => Err(error),
            }
        }
    };
    match result {
        Ok(()) => {
            let header = codec::encode_simple_reply(0, cookie);
            shared.writer.send(&mut [IoSlice::new(&header)]);
        }
        Err(error) => {
            let errno = error.errno();
            // A refused fast zero is an expected answer, not a failure worth logging.
            if !matches!(error, ExportError::FastZeroUnsupported) {
                report_failure(shared, &job.command, &error);
            }
            let message = error.to_string();
            send_error(shared, scratch, cookie, errno, &message);
        }
    }
}

fn send_read_data<T: Transport>(shared: &Shared<'_, T>, cookie: u64, offset: u64, data: &[u8]) {
    if !shared.session.limits.structured_replies {
        let header = codec::encode_simple_reply(0, cookie);
        shared
            .writer
            .send(&mut [IoSlice::new(&header), IoSlice::new(data)]);
        return;
    }
    if data.is_empty() {
        // An empty read needs no content chunk: the final "none" chunk alone means success.
        let header = codec::encode_structured_reply(
            protocol::REPLY_FLAG_DONE,
            protocol::REPLY_TYPE_NONE,
            cookie,
            0,
        );
        shared.writer.send(&mut [IoSlice::new(&header)]);
        return;
    }
    // The whole read goes in one data chunk, which also satisfies CMD_FLAG_DF.
    let header = codec::encode_structured_reply(
        protocol::REPLY_FLAG_DONE,
        protocol::REPLY_TYPE_OFFSET_DATA,
        cookie,
        8 + data.len() as u32,
    );
    let offset = offset.to_be_bytes();
    shared.writer.send(&mut [
        IoSlice::new(&header),
        IoSlice::new(&offset),
        IoSlice::new(data),
    ]);
}

/// Sends an error reply: an error chunk with `message` when structured replies are in use,
/// otherwise a simple reply.
fn send_error<T: Transport>(
    shared: &Shared<'_, T>,
    scratch: &mut Vec<u8>,
    cookie: u64,
    errno: u32,
    message: &str,
) {
    assert!(errno != 0);
    if shared.session.limits.structured_replies {
        scratch.clear();
        codec::put_error_chunk(scratch, cookie, errno, message);
        shared.writer.send(&mut [IoSlice::new(scratch)]);
    } else {
        let header = codec::encode_simple_reply(errno, cookie);
        shared.writer.send(&mut [IoSlice::new(&header)]);
    }
}

/// The connection's output, shared by all workers and the reader.
struct ReplyWriter<'a, T: Transport> {
    output: Mutex<BufWriter<T>>,
    /// Senders that want the lock or hold it; the last one out flushes.
    waiting: std::sync::atomic::AtomicUsize,
    /// The first send error; once set, nothing more is sent.
    failure: Mutex<Option<io::Error>>,
    /// Abandoned when sending fails: the client is gone.
    dispatch: &'a Dispatch<'a>,
    /// Used to shut the connection down when sending fails, which wakes the reader.
    stream: T,
}

impl<T: Transport> ReplyWriter<'_, T> {
    /// Sends one reply made of `parts`. Errors are recorded, not returned: the reader notices
    /// through the shut-down socket and the connection ends with the recorded error.
    fn send(&self, parts: &mut [IoSlice<'_>]) {
        use std::sync::atomic::Ordering;
        self.waiting.fetch_add(1, Ordering::AcqRel);
        let mut output = self.output.lock();
        let mut result = write_all_vectored(&mut *output, parts);
        // Decremented under the lock: whoever brings it to zero flushes, and anyone who
        // arrived meanwhile will take the lock after us and flush for both.
        if self.waiting.fetch_sub(1, Ordering::AcqRel) == 1 && result.is_ok() {
            result = output.flush();
        }
        drop(output);
        if let Err(error) = result {
            self.fail(error);
        }
    }

    fn fail(&self, error: io::Error) {
        let mut failure = self.failure.lock();
        if failure.is_none() {
            *failure = Some(error);
            // Best effort: the socket may already be gone.
            let _ = self.stream.shutdown(std::net::Shutdown::Both);
            drop(failure);
            self.dispatch.abandon();
        }
    }

    fn failed(&self) -> bool {
        self.failure.lock().is_some()
    }

    /// Reports the recorded send error in preference to the read error it caused.
    fn take_failure(&self, read_error: io::Error) -> Result<(), NbdError> {
        let error = self.failure.lock().take().unwrap_or(read_error);
        Err(NbdError::io("sending a reply", error))
    }

    /// Flushes what is left and reports a send failure, if any.
    fn finish(&self) -> Result<(), NbdError> {
        if let Some(error) = self.failure.lock().take() {
            return Err(NbdError::io("sending a reply", error));
        }
        self.output
            .lock()
            .flush()
            .map_err(|error| NbdError::io("sending the last replies", error))
    }
}

fn write_all_vectored(output: &mut impl Write, mut parts: &mut [IoSlice<'_>]) -> io::Result<()> {
    IoSlice::advance_slices(&mut parts, 0);
    while !parts.is_empty() {
        match output.write_vectored(parts) {
            Ok(0) => return Err(io::Error::from(io::ErrorKind::WriteZero)),
            Ok(written) => IoSlice::advance_slices(&mut parts, written),
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}
