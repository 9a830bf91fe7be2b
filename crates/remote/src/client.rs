//! [`ObjectClient`]: the synchronous face of the S3 client, with request counters.
//!
//! The engine is synchronous (threads, not tasks), so the client owns a small tokio runtime
//! and blocks on each request. Requests are retried by object_store with exponential backoff
//! on server errors, throttling and timeouts, within [`RETRY_TIMEOUT`].

use std::fs::File;
use std::io::Read;
use std::ops::Range;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::{StreamExt, TryStreamExt};
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    RetryConfig, WriteMultipart,
};
use serde::Serialize;

use crate::error::{RemoteError, Result};
use crate::url::ObjectUrl;

/// Objects larger than this are uploaded in parts of this size (multipart upload), so that a
/// failed part is sent again alone and parts go out in parallel.
pub const PART_BYTES: usize = 16 << 20;
/// Parts of one upload in flight at once.
const PARTS_IN_FLIGHT: usize = 4;
/// How long a request is retried before its error is returned.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(120);
/// A single request that takes longer than this is cancelled and retried.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// An object listed under a prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listed {
    /// Repository-relative name.
    pub name: String,
    pub size: u64,
    /// When the server last wrote it, by the server's clock.
    pub modified: SystemTime,
}

/// Requests sent and bytes moved, for `--json` summaries and the benchmarks' requests per GB.
#[derive(Debug, Default)]
pub struct RequestCounters {
    pub puts: AtomicU64,
    pub parts: AtomicU64,
    pub gets: AtomicU64,
    pub heads: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub bytes_sent: AtomicU64,
    pub bytes_received: AtomicU64,
}

/// A snapshot of [`RequestCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct RequestCount {
    pub puts: u64,
    pub parts: u64,
    pub gets: u64,
    pub heads: u64,
    pub lists: u64,
    pub deletes: u64,
    pub bytes_sent: u64,
    pub bytes_received: u64,
}

impl RequestCount {
    /// Every request (a multipart upload counts its parts and its two control requests).
    pub fn requests(&self) -> u64 {
        self.puts + self.parts + self.gets + self.heads + self.lists + self.deletes
    }
}

/// What a create-only PUT found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Created {
    /// The object did not exist and now holds the data.
    Written,
    /// An object of that name existed; nothing was written.
    Exists,
}

/// A synchronous S3 client rooted at a repository URL.
pub struct ObjectClient {
    runtime: tokio::runtime::Runtime,
    store: Arc<dyn ObjectStore>,
    url: ObjectUrl,
    counters: RequestCounters,
    /// Whether the server honours `If-None-Match: *` ([`ObjectClient::probe_conditional`]);
    /// without it a create-only PUT is a plain PUT and the lease alone keeps writers apart.
    conditional: AtomicBool,
}

impl std::fmt::Debug for ObjectClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectClient")
            .field("url", &self.url.to_string())
            .finish()
    }
}

/// The environment variables of the credentials, as every S3 tool reads them.
pub const ACCESS_KEY_VARIABLE: &str = "AWS_ACCESS_KEY_ID";
pub const SECRET_KEY_VARIABLE: &str = "AWS_SECRET_ACCESS_KEY";
pub const REGION_VARIABLE: &str = "AWS_DEFAULT_REGION";

impl ObjectClient {
    /// A client for `url` with credentials from `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`
    /// and `AWS_DEFAULT_REGION` (or `AWS_REGION`; `us-east-1` when neither is set).
    pub fn connect(url: &ObjectUrl) -> Result<ObjectClient> {
        let variable = |name: &str| std::env::var(name).ok().filter(|value| !value.is_empty());
        let missing = |name: &str| {
            RemoteError::Url {
            url: url.to_string(),
            detail: format!("{name} is not set: give the object store's credentials in {ACCESS_KEY_VARIABLE} and {SECRET_KEY_VARIABLE}"),
        }
        };
        let access = variable(ACCESS_KEY_VARIABLE).ok_or_else(|| missing(ACCESS_KEY_VARIABLE))?;
        let secret = variable(SECRET_KEY_VARIABLE).ok_or_else(|| missing(SECRET_KEY_VARIABLE))?;
        let region = variable(REGION_VARIABLE)
            .or_else(|| variable("AWS_REGION"))
            .unwrap_or_else(|| "us-east-1".to_string());
        // rustls needs a process-wide provider; ring is the one the rest of onecopy uses. A
        // second install (another client in the same process) is refused and harmless.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let store = AmazonS3Builder::new()
            .with_endpoint(&url.endpoint)
            .with_bucket_name(&url.bucket)
            .with_access_key_id(access)
            .with_secret_access_key(secret)
            .with_region(region)
            .with_virtual_hosted_style_request(false)
            .with_retry(RetryConfig {
                backoff: BackoffConfig {
                    init_backoff: Duration::from_millis(100),
                    max_backoff: Duration::from_secs(10),
                    base: 2.0,
                },
                max_retries: 10,
                retry_timeout: RETRY_TIMEOUT,
            })
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(url.endpoint.starts_with("http://"))
                    .with_timeout(REQUEST_TIMEOUT)
                    .with_connect_timeout(Duration::from_secs(10)),
            )
            .build()
            .map_err(|source| RemoteError::Request {
                action: "connecting to",
                object: "the bucket".into(),
                url: url.to_string(),
                source: Box::new(source),
            })?;
        ObjectClient::over(Arc::new(store), url)
    }

    /// A client of `store` as if it were at `url`: [`ObjectClient::connect`]'s S3 store, or
    /// object_store's in-memory one in tests (which honours create-only PUTs, as S3 does).
    pub fn over(store: Arc<dyn ObjectStore>, url: &ObjectUrl) -> Result<ObjectClient> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("onecopy-s3")
            .enable_all()
            .build()
            .map_err(|error| onecopy_core::Error::io("starting the S3 client's runtime", error))?;
        Ok(ObjectClient {
            runtime,
            store,
            url: url.clone(),
            counters: RequestCounters::default(),
            conditional: AtomicBool::new(true),
        })
    }

    /// The repository's URL.
    pub fn url(&self) -> &ObjectUrl {
        &self.url
    }

    /// Requests sent so far.
    pub fn count(&self) -> RequestCount {
        let c = &self.counters;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        RequestCount {
            puts: load(&c.puts),
            parts: load(&c.parts),
            gets: load(&c.gets),
            heads: load(&c.heads),
            lists: load(&c.lists),
            deletes: load(&c.deletes),
            bytes_sent: load(&c.bytes_sent),
            bytes_received: load(&c.bytes_received),
        }
    }

    /// Whether create-only PUTs are enforced by the server.
    pub fn conditional(&self) -> bool {
        self.conditional.load(Ordering::Relaxed)
    }

    /// Treats the server as one without conditional writes (a test of that path, or a
    /// server known to ignore `If-None-Match`).
    pub fn disable_conditional(&self) {
        self.conditional.store(false, Ordering::Relaxed);
    }

    fn path(&self, name: &str) -> ObjectPath {
        ObjectPath::from(self.url.key(name))
    }

    fn failed(&self, action: &'static str, name: &str, source: object_store::Error) -> RemoteError {
        if matches!(source, object_store::Error::NotFound { .. }) {
            return RemoteError::Missing {
                what: format!("object {name}"),
                url: self.url.to_string(),
            };
        }
        RemoteError::Request {
            action,
            object: name.to_string(),
            url: self.url.to_string(),
            source: Box::new(source),
        }
    }

    /// Writes `data` as object `name`, replacing any object of that name.
    pub fn put(&self, name: &str, data: Vec<u8>) -> Result<()> {
        let length = data.len() as u64;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        self.runtime
            .block_on(self.store.put(&self.path(name), PutPayload::from(data)))
            .map_err(|source| self.failed("writing", name, source))?;
        self.counters
            .bytes_sent
            .fetch_add(length, Ordering::Relaxed);
        Ok(())
    }

    /// Writes `data` as object `name` only when no object of that name exists
    /// (`If-None-Match: *`). On a server without conditional writes this is a plain PUT that
    /// reports [`Created::Written`].
    pub fn put_new(&self, name: &str, data: Vec<u8>) -> Result<Created> {
        if !self.conditional() {
            self.put(name, data)?;
            return Ok(Created::Written);
        }
        let length = data.len() as u64;
        self.counters.puts.fetch_add(1, Ordering::Relaxed);
        let options = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self.runtime.block_on(self.store.put_opts(
            &self.path(name),
            PutPayload::from(data),
            options,
        )) {
            Ok(_) => {
                self.counters
                    .bytes_sent
                    .fetch_add(length, Ordering::Relaxed);
                Ok(Created::Written)
            }
            Err(object_store::Error::AlreadyExists { .. }) => Ok(Created::Exists),
            Err(source) => Err(self.failed("creating", name, source)),
        }
    }

    /// Learns whether the server refuses a create-only PUT of an existing object. Writes and
    /// removes one probe object.
    pub fn probe_conditional(&self, probe_name: &str) -> Result<bool> {
        self.conditional.store(true, Ordering::Relaxed);
        self.put(probe_name, b"probe".to_vec())?;
        let honoured = self.put_new(probe_name, b"probe again".to_vec())? == Created::Exists;
        self.delete(probe_name)?;
        self.conditional.store(honoured, Ordering::Relaxed);
        Ok(honoured)
    }

    /// Uploads the local file `path` as object `name`: one PUT up to [`PART_BYTES`], a
    /// multipart upload above.
    pub fn upload(&self, name: &str, path: &Path) -> Result<u64> {
        let io = |error| onecopy_core::Error::io(format!("reading {}", path.display()), error);
        let mut file = File::open(path).map_err(io)?;
        let length = file.metadata().map_err(io)?.len();
        if length <= PART_BYTES as u64 {
            let mut data = Vec::with_capacity(length as usize);
            file.read_to_end(&mut data).map_err(io)?;
            self.put(name, data)?;
            return Ok(length);
        }
        let object = self.path(name);
        let store = Arc::clone(&self.store);
        let counters = &self.counters;
        let result: std::result::Result<(), UploadError> = self.runtime.block_on(async {
            counters.puts.fetch_add(1, Ordering::Relaxed);
            let upload = store
                .put_multipart(&object)
                .await
                .map_err(UploadError::Store)?;
            let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
            let mut buffer = vec![0u8; PART_BYTES];
            loop {
                let read = file.read(&mut buffer).map_err(UploadError::Io)?;
                if read == 0 {
                    break;
                }
                if let Err(error) = writer.wait_for_capacity(PARTS_IN_FLIGHT).await {
                    let _ = writer.abort().await;
                    return Err(UploadError::Store(error));
                }
                writer.write(&buffer[..read]);
                counters
                    .bytes_sent
                    .fetch_add(read as u64, Ordering::Relaxed);
            }
            counters
                .parts
                .fetch_add(length.div_ceil(PART_BYTES as u64), Ordering::Relaxed);
            writer.finish().await.map_err(UploadError::Store)?;
            counters.puts.fetch_add(1, Ordering::Relaxed);
            Ok(())
        });
        match result {
            Ok(()) => Ok(length),
            Err(UploadError::Io(error)) => Err(io(error).into()),
            Err(UploadError::Store(source)) => Err(self.failed("uploading", name, source)),
        }
    }

    /// The whole content of object `name`; `None` when it does not exist.
    pub fn get(&self, name: &str) -> Result<Option<Vec<u8>>> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let path = self.path(name);
        let result = self.runtime.block_on(async {
            let got = self.store.get(&path).await?;
            got.bytes().await
        });
        match result {
            Ok(bytes) => {
                self.counters
                    .bytes_received
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok(Some(bytes.to_vec()))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.failed("reading", name, source)),
        }
    }

    /// Bytes `range` of object `name`.
    pub fn get_range(&self, name: &str, range: Range<u64>) -> Result<Vec<u8>> {
        self.counters.gets.fetch_add(1, Ordering::Relaxed);
        let bytes = self
            .runtime
            .block_on(self.store.get_range(&self.path(name), range))
            .map_err(|source| self.failed("reading", name, source))?;
        self.counters
            .bytes_received
            .fetch_add(bytes.len() as u64, Ordering::Relaxed);
        Ok(bytes.to_vec())
    }

    /// The size of object `name`; `None` when it does not exist.
    pub fn size(&self, name: &str) -> Result<Option<u64>> {
        self.counters.heads.fetch_add(1, Ordering::Relaxed);
        match self.runtime.block_on(self.store.head(&self.path(name))) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(source) => Err(self.failed("looking up", name, source)),
        }
    }

    /// Every object whose name starts with `directory/` (all levels below it), sorted.
    pub fn list(&self, directory: &str) -> Result<Vec<Listed>> {
        let prefix = self.path(directory);
        let listed: Vec<object_store::ObjectMeta> = self
            .runtime
            .block_on(self.store.list(Some(&prefix)).try_collect())
            .map_err(|source| self.failed("listing", directory, source))?;
        // A listing comes back in pages of up to 1000 keys, each a request.
        self.counters
            .lists
            .fetch_add(1 + listed.len() as u64 / 1000, Ordering::Relaxed);
        let mut names: Vec<Listed> = listed
            .into_iter()
            .filter_map(|meta| {
                let name = self.url.name_of(meta.location.as_ref())?.to_string();
                Some(Listed {
                    name,
                    size: meta.size,
                    modified: meta.last_modified.into(),
                })
            })
            .collect();
        names.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(names)
    }

    /// Removes the objects `names`, up to a thousand per request (S3's DeleteObjects); a
    /// missing object is not an error. One result per name, in order.
    pub fn delete_all(&self, names: &[String]) -> Vec<Result<()>> {
        if names.is_empty() {
            return Vec::new();
        }
        self.counters
            .deletes
            .fetch_add(names.len().div_ceil(1000) as u64, Ordering::Relaxed);
        let paths: Vec<object_store::Result<ObjectPath>> =
            names.iter().map(|name| Ok(self.path(name))).collect();
        let results: Vec<object_store::Result<ObjectPath>> = self.runtime.block_on(
            self.store
                .delete_stream(futures::stream::iter(paths).boxed())
                .collect(),
        );
        let mut results = results.into_iter();
        names
            .iter()
            .map(|name| match results.next() {
                Some(Ok(_)) | Some(Err(object_store::Error::NotFound { .. })) => Ok(()),
                Some(Err(source)) => Err(self.failed("removing", name, source)),
                // A failed bulk request ends the stream early: the rest were not removed.
                None => Err(RemoteError::Request {
                    action: "removing",
                    object: name.clone(),
                    url: self.url.to_string(),
                    source: Box::new(object_store::Error::Generic {
                        store: "S3",
                        source: "the bulk deletion stopped before this object".into(),
                    }),
                }),
            })
            .collect()
    }

    /// Removes object `name`; a missing object is not an error.
    pub fn delete(&self, name: &str) -> Result<()> {
        self.counters.deletes.fetch_add(1, Ordering::Relaxed);
        match self.runtime.block_on(self.store.delete(&self.path(name))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(source) => Err(self.failed("removing", name, source)),
        }
    }
}

enum UploadError {
    Io(std::io::Error),
    Store(object_store::Error),
}
