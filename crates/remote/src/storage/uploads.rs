//! Uploads of synced objects in the background.
//!
//! On object storage nothing a command writes is durable for anyone until its commit publishes
//! the catalog that names it, so a container's sync does not need to wait for its upload: it
//! hands the object to a few uploader threads and returns, and the backup goes on cutting and
//! hashing while the object travels. [`crate::Session::commit`] waits for every upload
//! ([`super::RemoteStorage::wait_for_uploads`]) before it publishes, and a failed upload fails
//! the commit (the object is a leftover the next writer removes). At most
//! [`QUEUED_AT_MOST`] objects wait or travel at once: a sync beyond that waits, so that a
//! source read faster than the network does not pile up copies on the local disk.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use onecopy_core::{Error, Result};
use parking_lot::{Condvar, Mutex};

use super::Inner;

/// Uploader threads at most: each blocks on one request, so a few hide the round trips.
pub const UPLOADERS: usize = 4;
/// Objects queued or in flight at most before a sync waits.
pub const QUEUED_AT_MOST: usize = 8;

const _: () = assert!(UPLOADERS <= QUEUED_AT_MOST);
// A command killed with this many uploads outstanding, and a few containers still open, leaves
// at most as many container numbers missing in a row below one uploaded: the store's recovery
// probes that far.
const _: () = assert!(2 * QUEUED_AT_MOST as u64 <= onecopy_core::storage::UNORDERED_CREATIONS_MAX);

/// The uploads of one storage.
#[derive(Debug, Default)]
pub struct Uploads {
    state: Mutex<State>,
    /// Signalled whenever an upload ends.
    ended: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Objects waiting for an uploader, oldest first.
    queued: VecDeque<String>,
    /// Objects an uploader is sending.
    in_flight: HashSet<String>,
    /// Objects synced again while in flight: sent once more when the flight ends, since the
    /// flight may have read the copy before the last write.
    again: HashSet<String>,
    /// Uploader threads running.
    uploaders: usize,
    /// The first failed upload's message; every later sync and the commit fail with it.
    failure: Option<String>,
}

impl State {
    fn outstanding(&self) -> usize {
        self.queued.len() + self.in_flight.len()
    }
}

fn failed(message: &str) -> Error {
    Error::io(
        message.to_string(),
        std::io::Error::other("an upload of this command failed; nothing was committed"),
    )
}

impl Uploads {
    /// Hands object `name` of `inner` to the uploaders; waits while [`QUEUED_AT_MOST`] are
    /// outstanding. Fails when an earlier upload failed.
    pub fn queue(&self, inner: &Arc<Inner>, name: &str) -> Result<()> {
        let mut state = self.state.lock();
        while state.outstanding() >= QUEUED_AT_MOST && state.failure.is_none() {
            self.ended.wait(&mut state);
        }
        if let Some(message) = &state.failure {
            return Err(failed(message));
        }
        if state.in_flight.contains(name) {
            state.again.insert(name.to_string());
        } else if !state.queued.iter().any(|queued| queued == name) {
            state.queued.push_back(name.to_string());
        }
        if state.uploaders < UPLOADERS && state.uploaders < state.outstanding() {
            let inner = Arc::clone(inner);
            std::thread::Builder::new()
                .name("onecopy-upload".into())
                .spawn(move || inner.uploads.upload_queued(&inner))
                .map_err(|error| Error::io("starting an upload thread", error))?;
            // Counted under the lock the new thread waits for first.
            state.uploaders += 1;
        }
        Ok(())
    }

    /// An uploader: sends queued objects until none is left.
    fn upload_queued(&self, inner: &Arc<Inner>) {
        let mut state = self.state.lock();
        while let Some(name) = state.queued.pop_front() {
            state.in_flight.insert(name.clone());
            drop(state);
            let result = inner.upload(&name);
            state = self.state.lock();
            state.in_flight.remove(&name);
            if let Err(error) = result {
                state.failure.get_or_insert_with(|| error.to_string());
            }
            if state.again.remove(&name) && state.failure.is_none() {
                state.queued.push_back(name);
            }
            self.ended.notify_all();
        }
        state.uploaders -= 1;
        self.ended.notify_all();
    }

    /// Waits until object `name` is neither queued nor in flight; a queued upload is dropped
    /// (the object is being removed).
    pub fn forget(&self, name: &str) {
        let mut state = self.state.lock();
        state.queued.retain(|queued| queued != name);
        state.again.remove(name);
        while state.in_flight.contains(name) {
            self.ended.wait(&mut state);
        }
    }

    /// Waits for every upload; the first failure, if any.
    pub fn wait(&self) -> Result<()> {
        let mut state = self.state.lock();
        while state.outstanding() > 0 && state.failure.is_none() {
            self.ended.wait(&mut state);
        }
        // After a failure the others still in flight are let run: their objects are leftovers
        // either way.
        match &state.failure {
            Some(message) => Err(failed(message)),
            None => Ok(()),
        }
    }
}
