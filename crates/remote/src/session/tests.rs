//! Sessions against object_store's in-memory store, which honours create-only PUTs as S3
//! does: commits, what a second client sees, locks, lapsed leases and leftovers.

use std::sync::Arc;
use std::time::Duration;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use onecopy_core::repository::{Encryption, Repository};
use onecopy_core::storage::Storage;

use super::*;

const LEASE: Duration = Duration::from_secs(2);

fn url() -> ObjectUrl {
    ObjectUrl::parse("s3:http://memory/bucket/repository").unwrap()
}

/// A client of `store` with its own cache, like a process on another host.
fn client(store: &Arc<InMemory>, cache: &tempfile::TempDir) -> RemoteRepository {
    client_of(Arc::clone(store) as Arc<dyn ObjectStore>, cache)
}

/// A client of any store (a wrapper of the in-memory one) with its own cache.
fn client_of(store: Arc<dyn ObjectStore>, cache: &tempfile::TempDir) -> RemoteRepository {
    let client = ObjectClient::over(store, &url()).unwrap();
    RemoteRepository::with_client(client, cache.path(), LEASE).unwrap()
}

/// A client of an existing repository with its cache, its configuration and keys pulled.
fn another_client(store: &Arc<InMemory>) -> (tempfile::TempDir, RemoteRepository) {
    let cache = tempfile::tempdir().unwrap();
    let remote = client(store, &cache);
    remote.pull_root().unwrap();
    (cache, remote)
}

/// A changing command's session.
fn writing(remote: &RemoteRepository) -> Session {
    remote
        .session("backup", LockKind::Exclusive, "test", WAIT)
        .unwrap()
}

/// A reading command's session.
fn reading(remote: &RemoteRepository) -> Session {
    remote
        .session("backup", LockKind::Shared, "test", WAIT)
        .unwrap()
}

/// A repository made by a first client.
fn initialised() -> (Arc<InMemory>, tempfile::TempDir, RemoteRepository) {
    let store = Arc::new(InMemory::new());
    let cache = tempfile::tempdir().unwrap();
    let remote = client(&store, &cache);
    Repository::init_with(&remote.mirror(), Encryption::None).unwrap();
    remote.publish_new().unwrap();
    (store, cache, remote)
}

/// Writes what a face's command would: a container (uploaded at its sync) and its catalog.
fn write_work(session: &Session, container: &str, content: &[u8], catalog: &[u8]) {
    let storage = session.storage();
    let file = storage.open(container, true).unwrap();
    file.write_at(0, content).unwrap();
    file.sync_data().unwrap();
    let file = storage.open(CATALOG_FILE, true).unwrap();
    file.set_len(0).unwrap();
    file.write_at(0, catalog).unwrap();
    file.sync_data().unwrap();
}

/// The published catalog generations of the backup face.
fn generation_numbers(remote: &RemoteRepository) -> Vec<u64> {
    let generations = remote.generations("backup").unwrap();
    generations
        .into_iter()
        .map(|(generation, _)| generation)
        .collect()
}

fn read(storage: &Arc<dyn Storage>, name: &str) -> Vec<u8> {
    onecopy_core::storage::read_all(storage.as_ref(), name).unwrap()
}

const WAIT: Duration = Duration::from_secs(30);

/// Goal: a commit publishes the catalog and the containers so that a second client with an
/// empty cache reads exactly them. Method: client A writes and commits twice; client B opens
/// a shared session and reads the newest catalog and both containers.
#[test]
fn second_client_reads_what_was_committed() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/1",
        b"first container",
        b"catalog one",
    );
    assert_eq!(session.commit(Removal::Now).unwrap().unwrap().generation, 1);
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/2",
        b"second container",
        b"catalog two",
    );
    assert_eq!(session.commit(Removal::Now).unwrap().unwrap().generation, 2);

    let (_cache_b, b) = another_client(&store);
    assert!(b.mirror().join(CONFIG_OBJECT).exists());
    let session = reading(&b);
    let storage = session.storage();
    assert_eq!(read(&storage, CATALOG_FILE), b"catalog two");
    assert_eq!(
        storage.list("containers/00").unwrap(),
        vec!["containers/00/1".to_string(), "containers/00/2".to_string()]
    );
    assert_eq!(read(&storage, "containers/00/1"), b"first container");
    assert_eq!(read(&storage, "containers/00/2"), b"second container");
    // Only the newest generation stays: no reader can be reading an older one.
    assert_eq!(generation_numbers(&a), vec![2]);
}

/// Goal: an exclusive lock keeps other writers and readers out, shared locks coexist, and a
/// released lock lets the next one in. Method: take locks from two clients with short waits.
#[test]
fn locks_exclude_as_their_kinds_say() {
    let (store, _cache, a) = initialised();
    let (_cache_b, b) = another_client(&store);
    let short = Duration::from_millis(300);

    let writing = a
        .session("backup", LockKind::Exclusive, "writer", WAIT)
        .unwrap();
    for kind in [LockKind::Exclusive, LockKind::Shared] {
        match b.session("backup", kind, "other", short) {
            Err(RemoteError::Locked { holder, .. }) => {
                assert!(holder.contains("writer"), "{holder}")
            }
            other => panic!(
                "{kind:?} lock taken beside an exclusive one: {:?}",
                other.is_ok()
            ),
        }
    }
    drop(writing);

    let reading = a
        .session("backup", LockKind::Shared, "reader", WAIT)
        .unwrap();
    let reading_too = b
        .session("backup", LockKind::Shared, "reader too", short)
        .unwrap();
    assert!(matches!(
        b.session("backup", LockKind::Exclusive, "writer", short),
        Err(RemoteError::Locked { .. })
    ));
    drop(reading);
    drop(reading_too);
    b.session("backup", LockKind::Exclusive, "writer", short)
        .unwrap();
}

/// Goal: a client that stops renewing its lock loses it, and its late commit is refused
/// rather than overwriting the work of the client that took over. Method: A stops renewing;
/// B waits out the lease, takes the lock and commits; A's commit fails and B's catalog stays.
#[test]
fn lapsed_lease_cannot_commit() {
    let (store, _cache, a) = initialised();
    let mut late = a
        .session("backup", LockKind::Exclusive, "frozen", WAIT)
        .unwrap();
    late.stop_renewing();
    write_work(&late, "containers/00/1", b"late container", b"late catalog");

    let (_cache_b, b) = another_client(&store);
    let session = b
        .session("backup", LockKind::Exclusive, "taker", WAIT)
        .unwrap();
    write_work(
        &session,
        "containers/00/2",
        b"taker container",
        b"taker catalog",
    );
    assert_eq!(session.commit(Removal::Now).unwrap().unwrap().generation, 1);

    match late.commit(Removal::Now) {
        Err(RemoteError::CommitRefused { .. }) => {}
        other => panic!(
            "a lapsed client committed: {:?}",
            other.map(|c| c.map(|c| c.generation))
        ),
    }
    let (_cache_c, c) = another_client(&store);
    let session = c
        .session("backup", LockKind::Shared, "reader", WAIT)
        .unwrap();
    assert_eq!(read(&session.storage(), CATALOG_FILE), b"taker catalog");
}

/// Goal: the commit point is create-only, so two commits of one generation never both land
/// on a server with conditional writes. Method: publish generation 1 behind a session's back
/// and commit that session, whose lease is fine.
#[test]
fn commit_of_a_taken_generation_is_refused() {
    let (_store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"container", b"catalog");
    a.client
        .put(
            &catalog_object("backup", 1),
            b"someone else's catalog".to_vec(),
        )
        .unwrap();
    assert!(matches!(
        session.commit(Removal::Now),
        Err(RemoteError::CommitRefused { .. })
    ));
    assert_eq!(
        a.client.get(&catalog_object("backup", 1)).unwrap().unwrap(),
        b"someone else's catalog"
    );
}

/// Goal: work that was never committed is invisible, and the cache does not keep it. Method:
/// a session writes and is dropped without commit; the next session of the same client sees
/// the published catalog again, and the first writer of a repository without any catalog
/// removes the containers nothing refers to.
#[test]
fn uncommitted_work_is_dropped() {
    let (_store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/1",
        b"never committed",
        b"uncommitted catalog",
    );
    drop(session);
    let session = writing(&a);
    let storage = session.storage();
    assert!(
        !storage.exists(CATALOG_FILE).unwrap(),
        "an uncommitted catalog was kept"
    );
    assert!(
        storage.list("containers/00").unwrap().is_empty(),
        "leftover containers stayed"
    );
    write_work(&session, "containers/00/1", b"committed", b"catalog");
    session.commit(Removal::Now).unwrap();
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/2",
        b"never committed",
        b"uncommitted catalog",
    );
    drop(session);
    let session = reading(&a);
    assert_eq!(read(&session.storage(), CATALOG_FILE), b"catalog");
}

/// Goal: requests are counted, and a container costs one upload and one download. Method:
/// count the requests of a write session and of a read of its container.
#[test]
fn requests_are_counted() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    let before = a.client().count();
    write_work(&session, "containers/00/1", &vec![7u8; 1 << 20], b"catalog");
    session.wait_for_uploads().unwrap();
    let after = a.client().count();
    assert_eq!(after.puts - before.puts, 1, "one PUT per container");
    assert_eq!(after.bytes_sent - before.bytes_sent, 1 << 20);
    session.commit(Removal::Now).unwrap();

    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    let storage = session.storage();
    let before = b.client().count();
    let file = storage.open("containers/00/1", false).unwrap();
    let mut buffer = vec![0u8; 4096];
    for offset in (0..(1u64 << 20)).step_by(4096) {
        file.read_at(offset, &mut buffer).unwrap();
    }
    let after = b.client().count();
    assert_eq!(
        after.gets - before.gets,
        1,
        "one GET per container, not per read"
    );
}

/// Goal: a container removed by a command stays in the store until that command's commit,
/// so a client killed after removing it but before publishing leaves the published catalog
/// whole. Method: remove a committed container and drop the session; a second client still
/// reads it; a committed removal deletes the object.
#[test]
fn removals_wait_for_the_commit() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/1",
        b"kept until committed",
        b"catalog one",
    );
    session.commit(Removal::Now).unwrap();

    let session = writing(&a);
    let storage = session.storage();
    storage.remove("containers/00/1").unwrap();
    assert!(!storage.exists("containers/00/1").unwrap());
    assert!(storage.list("containers/00").unwrap().is_empty());
    drop(storage);
    drop(session);
    let object = "backup/containers/00/1";
    assert!(
        a.client().size(object).unwrap().is_some(),
        "removed before any commit"
    );

    let session = writing(&a);
    session.storage().remove("containers/00/1").unwrap();
    write_work(&session, "containers/00/2", b"new", b"catalog two");
    session.commit(Removal::Now).unwrap();
    assert!(
        a.client().size(object).unwrap().is_none(),
        "not deleted after the commit"
    );
    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    assert_eq!(
        session.storage().list("containers/00").unwrap(),
        vec!["containers/00/2"]
    );
}

/// Goal: threads reading one object at once share its one download. Method: eight threads
/// open and read the same container of a fresh client; all read it whole, with one GET.
#[test]
fn concurrent_readers_share_one_download() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    let content = vec![3u8; 4 << 20];
    write_work(&session, "containers/00/1", &content, b"catalog");
    session.commit(Removal::Now).unwrap();
    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    let storage = session.storage();
    let before = b.client().count().gets;
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| assert_eq!(read(&storage, "containers/00/1"), content));
        }
    });
    assert_eq!(b.client().count().gets - before, 1);
}

/// Goal: containers a client uploaded in a committed command serve its later commands without
/// a download, while an uncommitted command's uploads and a command's downloads are not kept
/// (a leftover's name may later hold another object). Method: count GETs of container reads
/// across sessions of one client.
#[test]
fn committed_uploads_are_kept_for_later_commands() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"committed here", b"catalog");
    session.commit(Removal::Now).unwrap();
    let session = writing(&a);
    write_work(
        &session,
        "containers/00/2",
        b"never committed",
        b"uncommitted catalog",
    );
    drop(session);

    let session = reading(&a);
    let before = a.client().count().gets;
    assert_eq!(
        read(&session.storage(), "containers/00/1"),
        b"committed here"
    );
    assert_eq!(
        a.client().count().gets,
        before,
        "a kept copy was downloaded again"
    );
    assert!(
        !a.cache.join("objects/backup/containers/00/2").exists(),
        "an uncommitted copy stayed"
    );
    drop(session);

    // Another client's copies are its own: it downloads.
    let (_cache_b, b) = another_client(&store);
    let session = writing(&b);
    let before = b.client().count().gets;
    assert_eq!(
        read(&session.storage(), "containers/00/1"),
        b"committed here"
    );
    assert_eq!(b.client().count().gets, before + 1);
    write_work(&session, "containers/00/3", b"from b", b"catalog b");
    session.commit(Removal::Now).unwrap();
    // The downloaded copy is not kept; the uploaded one is.
    let session = reading(&b);
    let before = b.client().count().gets;
    read(&session.storage(), "containers/00/3");
    assert_eq!(b.client().count().gets, before);
    read(&session.storage(), "containers/00/1");
    assert_eq!(b.client().count().gets, before + 1);
}

/// The in-memory store with PUTs of containers that fail while `failing` is set, as a server
/// that keeps refusing them after the client's retries.
#[derive(Debug)]
struct FailingContainers {
    inner: Arc<InMemory>,
    failing: std::sync::atomic::AtomicBool,
}

impl std::fmt::Display for FailingContainers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("FailingContainers")
    }
}

#[async_trait::async_trait]
impl ObjectStore for FailingContainers {
    async fn put_opts(
        &self,
        location: &object_store::path::Path,
        payload: object_store::PutPayload,
        opts: object_store::PutOptions,
    ) -> object_store::Result<object_store::PutResult> {
        if self.failing.load(std::sync::atomic::Ordering::Relaxed)
            && location.as_ref().contains("/containers/")
        {
            return Err(object_store::Error::Generic {
                store: "FailingContainers",
                source: "refused".into(),
            });
        }
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &object_store::path::Path,
        opts: object_store::PutMultipartOptions,
    ) -> object_store::Result<Box<dyn object_store::MultipartUpload>> {
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(
        &self,
        location: &object_store::path::Path,
        options: object_store::GetOptions,
    ) -> object_store::Result<object_store::GetResult> {
        self.inner.get_opts(location, options).await
    }

    fn delete_stream(
        &self,
        locations: futures::stream::BoxStream<
            'static,
            object_store::Result<object_store::path::Path>,
        >,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::path::Path>> {
        self.inner.delete_stream(locations)
    }

    fn list(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> futures::stream::BoxStream<'static, object_store::Result<object_store::ObjectMeta>> {
        self.inner.list(prefix)
    }

    async fn list_with_delimiter(
        &self,
        prefix: Option<&object_store::path::Path>,
    ) -> object_store::Result<object_store::ListResult> {
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy_opts(
        &self,
        from: &object_store::path::Path,
        to: &object_store::path::Path,
        options: object_store::CopyOptions,
    ) -> object_store::Result<()> {
        self.inner.copy_opts(from, to, options).await
    }
}

/// Goal: a container's sync returns before its upload, but a commit never publishes a
/// catalog whose containers failed to upload. Method: a store that refuses container PUTs;
/// the session syncs a container (which succeeds), then its commit fails, and a second
/// client still sees the previous generation and nothing of the failed work.
#[test]
fn a_failed_upload_fails_the_commit() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"committed", b"catalog 1");
    session.commit(Removal::Now).unwrap();

    let failing = Arc::new(FailingContainers {
        inner: Arc::clone(&store),
        failing: std::sync::atomic::AtomicBool::new(true),
    });
    let cache = tempfile::tempdir().unwrap();
    let c = client_of(Arc::clone(&failing) as Arc<dyn ObjectStore>, &cache);
    c.pull_root().unwrap();
    let session = writing(&c);
    write_work(&session, "containers/00/2", b"refused", b"catalog 2");
    let error = session.commit(Removal::Now).unwrap_err();
    assert!(
        error.to_string().contains("containers/00/2"),
        "the error names the object: {error}"
    );

    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    assert_eq!(read(&session.storage(), CATALOG_FILE), b"catalog 1");
    assert_eq!(session.generations.len(), 1);
    assert_eq!(session.generations[0].0, 1);
    assert!(!session.storage().exists("containers/00/2").unwrap());
}

/// The in-memory store with every PUT slowed down, so that uploads are still in flight when
/// the session goes on.
fn slow_store(store: &Arc<InMemory>) -> Arc<dyn ObjectStore> {
    Arc::new(object_store::throttle::ThrottledStore::new(
        Arc::clone(store),
        object_store::throttle::ThrottleConfig {
            wait_put_per_call: Duration::from_millis(150),
            ..Default::default()
        },
    ))
}

/// Goal: a container written again after its sync, while its first upload is in flight, is
/// uploaded again after it, so the store ends with its last content. Method: slow PUTs; write,
/// sync, append, sync, commit; a second client reads the whole content.
#[test]
fn a_container_synced_during_its_upload_ends_with_its_last_content() {
    let (store, _cache, _a) = initialised();
    let cache = tempfile::tempdir().unwrap();
    let a = client_of(slow_store(&store), &cache);
    a.pull_root().unwrap();
    let session = writing(&a);
    let storage = session.storage();
    let file = storage.open("containers/00/1", true).unwrap();
    file.write_at(0, b"first half ").unwrap();
    file.sync_data().unwrap();
    // The uploader reads the copy at once, then waits in the slow PUT.
    std::thread::sleep(Duration::from_millis(50));
    file.write_at(11, b"second half").unwrap();
    file.sync_data().unwrap();
    drop(file);
    write_work(&session, "containers/00/2", b"other", b"catalog");
    session.commit(Removal::Now).unwrap();

    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    assert_eq!(
        read(&session.storage(), "containers/00/1"),
        b"first half second half"
    );
}

/// Goal: a container removed while its upload is queued or in flight leaves no object behind
/// (no leftover the listing would miss). Method: slow PUTs; sync three containers and remove
/// them at once; after the commit the store holds none of them.
#[test]
fn a_container_removed_during_its_upload_leaves_no_object() {
    let (store, _cache, _a) = initialised();
    let cache = tempfile::tempdir().unwrap();
    let a = client_of(slow_store(&store), &cache);
    a.pull_root().unwrap();
    let session = writing(&a);
    let storage = session.storage();
    let names = ["containers/00/1", "containers/00/2", "containers/00/3"];
    for name in names {
        let file = storage.open(name, true).unwrap();
        file.write_at(0, b"soon removed").unwrap();
        file.sync_data().unwrap();
    }
    for name in names {
        storage.remove(name).unwrap();
    }
    write_work(&session, "containers/00/4", b"kept", b"catalog");
    session.commit(Removal::Now).unwrap();

    let listed: Vec<String> = a
        .client()
        .list("backup/containers")
        .unwrap()
        .into_iter()
        .map(|listed| listed.name)
        .collect();
    assert_eq!(listed, vec!["backup/containers/00/4".to_string()]);
}

/// Changes `bytes` of the catalog at `offset` in a writing session and commits; returns the
/// commit.
fn commit_catalog_change(remote: &RemoteRepository, offset: u64, bytes: &[u8]) -> Commit {
    let session = writing(remote);
    let file = session.storage().open(CATALOG_FILE, false).unwrap();
    file.write_at(offset, bytes).unwrap();
    file.sync_data().unwrap();
    drop(file);
    session.commit(Removal::Now).unwrap().unwrap()
}

/// Bytes that do not compress, like a sealed catalog's.
fn noise(length: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    (0..length)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Goal: after a first snapshot, a commit publishes only what the command changed, a new
/// client rebuilds the exact catalog from the snapshot and its deltas, and a client whose
/// cache holds an older generation of the chain fetches only the deltas after it. Method:
/// a 256 KiB catalog, then two commits of 4 KiB changes (deltas, far smaller than the
/// snapshot); clients B (empty cache) and A (cached) compare bytes and count their GETs.
#[test]
fn deltas_carry_what_a_command_changed() {
    let (store, _cache, a) = initialised();
    let mut expected = noise(256 << 10, 1);
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"data", &expected);
    let first = session.commit(Removal::Now).unwrap().unwrap();
    assert!(first.snapshot);
    for (generation, offset) in [(2, 4096u64), (3, 100_000)] {
        let change = noise(4096, generation);
        expected[offset as usize..offset as usize + 4096].copy_from_slice(&change);
        let commit = commit_catalog_change(&a, offset, &change);
        assert_eq!(commit.generation, generation);
        assert!(!commit.snapshot, "generation {generation} is a delta");
        assert!(
            commit.catalog_bytes < 8192,
            "{} bytes",
            commit.catalog_bytes
        );
    }
    assert_eq!(generation_numbers(&a), vec![1, 2, 3]);

    let (_cache_b, b) = another_client(&store);
    let before = b.client().count().gets;
    let session = reading(&b);
    assert_eq!(read(&session.storage(), CATALOG_FILE), expected);
    assert_eq!(
        b.client().count().gets - before,
        3,
        "a snapshot and two deltas"
    );
    drop(session);

    // B changes the end of the catalog; A, cached at generation 3, fetches one delta.
    let (_cache_c, c) = another_client(&store);
    let change = noise(1000, 9);
    let end = expected.len();
    expected.extend_from_slice(&change);
    assert!(!commit_catalog_change(&c, end as u64, &change).snapshot);
    let before = a.client().count().gets;
    let session = reading(&a);
    assert_eq!(read(&session.storage(), CATALOG_FILE), expected);
    assert_eq!(a.client().count().gets - before, 1, "only the new delta");
}

/// Goal: once a chain's deltas would outweigh its snapshot, the commit publishes a snapshot
/// and removes every older generation, so that a new client never reads much more than the
/// catalog. Method: a 64 KiB catalog, commits each rewriting 16 KiB of it; the generations
/// listed after each commit, and the catalog a new client reads at the end.
#[test]
fn a_snapshot_replaces_a_heavy_chain() {
    let (store, _cache, a) = initialised();
    let mut expected = noise(64 << 10, 2);
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"data", &expected);
    session.commit(Removal::Now).unwrap().unwrap();
    let mut snapshots = 0;
    for generation in 2..=8u64 {
        let offset = (generation % 4) * (16 << 10);
        let change = noise(16 << 10, generation);
        expected[offset as usize..offset as usize + change.len()].copy_from_slice(&change);
        let commit = commit_catalog_change(&a, offset, &change);
        let listed = generation_numbers(&a);
        if commit.snapshot {
            snapshots += 1;
            assert_eq!(listed, vec![generation], "a snapshot supersedes its chain");
        }
        assert!(listed.len() <= 5, "the chain stays short: {listed:?}");
    }
    assert!(snapshots >= 1);
    let (_cache_b, b) = another_client(&store);
    let session = reading(&b);
    assert_eq!(read(&session.storage(), CATALOG_FILE), expected);
}

/// Goal: a catalog file made again as a whole (removed and created, or renamed over) is
/// published as a snapshot, never as a delta of writes that miss its old bytes. Method: a
/// delta-sized change made by removing the catalog and writing it again.
#[test]
fn a_catalog_made_again_is_a_snapshot() {
    let (store, _cache, a) = initialised();
    let catalog = noise(128 << 10, 3);
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"data", &catalog);
    session.commit(Removal::Now).unwrap().unwrap();
    let session = writing(&a);
    let storage = session.storage();
    storage.remove(CATALOG_FILE).unwrap();
    let file = storage.open(CATALOG_FILE, true).unwrap();
    file.write_at(0, b"short").unwrap();
    file.sync_data().unwrap();
    drop(file);
    assert!(session.commit(Removal::Now).unwrap().unwrap().snapshot);
    let (_cache_b, b) = another_client(&store);
    assert_eq!(read(&reading(&b).storage(), CATALOG_FILE), b"short");
}

/// Goal: a chain with a delta missing or damaged is refused with the object's name, never
/// read as a catalog. Method: a snapshot and two deltas; the middle delta deleted, then
/// replaced by the newest delta's bytes (a delta moved to another generation).
#[test]
fn a_broken_chain_is_refused() {
    let (store, _cache, a) = initialised();
    let session = writing(&a);
    write_work(&session, "containers/00/1", b"data", &noise(64 << 10, 4));
    session.commit(Removal::Now).unwrap().unwrap();
    commit_catalog_change(&a, 0, &noise(100, 5));
    commit_catalog_change(&a, 500, &noise(100, 6));
    let middle = catalog_object("backup", 2);
    let newest = a
        .client()
        .get(&catalog_object("backup", 3))
        .unwrap()
        .unwrap();
    a.client().delete(&middle).unwrap();
    let (_cache_b, b) = another_client(&store);
    let error = b
        .session("backup", LockKind::Shared, "test", WAIT)
        .err()
        .expect("the chain is refused")
        .to_string();
    assert!(error.contains(&middle), "{error}");
    a.client().put(&middle, newest).unwrap();
    let (_cache_c, c) = another_client(&store);
    let error = c
        .session("backup", LockKind::Shared, "test", WAIT)
        .err()
        .expect("the chain is refused")
        .to_string();
    assert!(
        error.contains(&middle) && error.contains("holds generation 3"),
        "{error}"
    );
}

/// Client `a` commits container 1, then removes it and commits with [`Removal::Later`].
fn leave_container_1_for_later(a: &RemoteRepository) -> Commit {
    let session = writing(a);
    write_work(&session, "containers/00/1", b"first", b"catalog one");
    session.commit(Removal::Now).unwrap();
    let session = writing(a);
    session.storage().remove("containers/00/1").unwrap();
    write_work(&session, "containers/00/2", b"second", b"catalog two");
    session.commit(Removal::Later).unwrap().unwrap()
}

/// The names of the lock objects, markers included, in order.
fn lock_names(client: &ObjectClient) -> Vec<String> {
    let listed = client.list(crate::lease::LOCKS).unwrap();
    listed.into_iter().map(|listed| listed.name).collect()
}

/// Goal: a commit with [`Removal::Later`] leaves what it made unreferenced to the next
/// changing command from its cache, which deletes it beside its work without showing it to
/// the store, and lets go of its lock by a marker that no later lock waits for. Method:
/// client A leaves container 1 for later; the object stays and A's lock has its marker; A's
/// next writer takes the lock at once, does not list the container, and after its commit the
/// container and the released lock are gone (the marker goes with the acquisition after).
#[test]
fn later_removals_go_with_the_next_changing_command() {
    let (_store, _cache, a) = initialised();
    assert_eq!(leave_container_1_for_later(&a).leftovers, 0);
    let client = a.client();
    assert!(
        client.size("backup/containers/00/1").unwrap().is_some(),
        "the removed container waits for the next changing command"
    );
    let locks_before = lock_names(client);
    assert_eq!(
        locks_before.len(),
        2,
        "the lock and its marker: {locks_before:?}"
    );
    let released_marker = format!("{}{}", locks_before[0], crate::lease::RELEASED_SUFFIX);
    assert_eq!(locks_before[1], released_marker);

    let started = std::time::Instant::now();
    let session = writing(&a);
    assert!(
        started.elapsed() < LEASE,
        "a released lock is not waited for"
    );
    let listed = session.storage().list("containers/00").unwrap();
    assert_eq!(listed, vec!["containers/00/2".to_string()]);
    write_work(&session, "containers/00/3", b"third", b"catalog three");
    session.commit(Removal::Now).unwrap();
    assert!(client.size("backup/containers/00/1").unwrap().is_none());
    // The released lock went with that acquisition; its marker goes with the next one.
    assert_eq!(lock_names(client), vec![released_marker.clone()]);
    drop(reading(&a));
    // The reader's lock and marker wait for the next acquisition; no lock is left unreleased.
    let after = lock_names(client);
    assert!(
        after
            .iter()
            .all(|name| name.ends_with(crate::lease::RELEASED_SUFFIX)
                || after.contains(&format!("{name}{}", crate::lease::RELEASED_SUFFIX))),
        "a lock without its marker: {after:?}"
    );
    assert!(!after.contains(&released_marker));
}

/// Goal: what a commit left for later is not deleted by its cache's next writer once another
/// client committed a generation after it (that client's store recovery owns such objects).
/// Method: A leaves container 1 for later; B commits; A's next writer still lists container
/// 1, and the object is there.
#[test]
fn later_removals_are_void_after_another_clients_commit() {
    let (store, _cache, a) = initialised();
    leave_container_1_for_later(&a);

    let (_cache_b, b) = another_client(&store);
    let session = writing(&b);
    write_work(&session, "containers/00/3", b"third", b"catalog three");
    session.commit(Removal::Now).unwrap();

    let session = writing(&a);
    let listed = session.storage().list("containers/00").unwrap();
    assert!(
        listed.contains(&"containers/00/1".to_string()),
        "{listed:?}"
    );
    drop(session);
    assert!(a.client().size("backup/containers/00/1").unwrap().is_some());
}
