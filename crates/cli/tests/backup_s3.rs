//! The backup store on a real three-node Garage cluster (replication factor 3): round trips by
//! a second client, a node killed during a backup, a client killed mid-upload, clients at work
//! at once, a wrong password, a tampered object, and Garage's lack of conditional writes.

#[path = "support_garage/mod.rs"]
mod support_garage;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support_garage::GarageCluster;

const PASSWORD: &str = "s3 test password";
/// A short lease, so that a killed client's lock lapses within the test.
const LEASE_SECONDS: &str = "3";

/// One client: its own cache directory, as on its own host.
struct Client {
    cache: tempfile::TempDir,
    url: String,
    environment: Vec<(String, String)>,
}

impl Client {
    fn new(cluster: &GarageCluster, url: &str) -> Client {
        Client {
            cache: tempfile::tempdir().unwrap(),
            url: url.to_string(),
            environment: cluster.env(),
        }
    }

    fn command(&self, arguments: &[&str]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_onecopy"));
        command
            .args(arguments)
            .env("ONECOPY_REPO", &self.url)
            .env("ONECOPY_CACHE_DIR", self.cache.path())
            .env("ONECOPY_PASSWORD", PASSWORD)
            .env("ONECOPY_S3_LEASE_SECONDS", LEASE_SECONDS)
            .env_remove("ONECOPY_PASSWORD_FILE")
            .envs(
                self.environment
                    .iter()
                    .map(|(k, v)| (k.as_str(), v.as_str())),
            );
        command
    }

    fn run(&self, arguments: &[&str]) -> Output {
        self.command(arguments).output().unwrap()
    }

    fn ok(&self, arguments: &[&str]) -> String {
        let output = self.run(arguments);
        assert!(
            output.status.success(),
            "onecopy {arguments:?} failed: {}\n{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8(output.stdout).unwrap()
    }

    fn spawn(&self, arguments: &[&str]) -> Child {
        self.command(arguments)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Deterministic bytes that do not compress or deduplicate (xorshift).
fn noise(seed: u64, length: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(length + 8);
    while out.len() < length {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(length);
    out
}

/// Version `version` of a tree: files shared by all versions, files of this version, and a
/// file that grows.
fn write_tree(directory: &Path, version: u64, megabytes: usize) {
    std::fs::create_dir_all(directory.join("shared")).unwrap();
    std::fs::create_dir_all(directory.join("own")).unwrap();
    for file in 0..4 {
        std::fs::write(
            directory.join("shared").join(format!("file-{file}")),
            noise(1000 + file, megabytes << 18),
        )
        .unwrap();
    }
    std::fs::write(
        directory.join("own").join(format!("version-{version}")),
        noise(version, megabytes << 19),
    )
    .unwrap();
    std::fs::write(
        directory.join("growing"),
        noise(7, (version as usize + 1) * 100_000),
    )
    .unwrap();
}

/// Restores `backup` into a new directory and compares it with `expected`, byte for byte.
fn assert_restores(client: &Client, backup: &str, expected: &Path) {
    let target = tempfile::tempdir().unwrap();
    let restored = target.path().join("restored");
    client.ok(&["backup", "restore", backup, restored.to_str().unwrap()]);
    let output = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(expected)
        .arg(&restored)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{backup} does not restore byte-exact: {}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// The repository's object names under `prefix`, through node 1.
fn objects(cluster: &GarageCluster, bucket: &str, prefix: &str) -> Vec<String> {
    let listing = cluster
        .get_object(1, bucket, &format!("?list-type=2&prefix={prefix}%2F"))
        .unwrap();
    let text = String::from_utf8_lossy(&listing);
    text.split("<Key>")
        .skip(1)
        .filter_map(|part| part.split("</Key>").next())
        .map(str::to_string)
        .collect()
}

fn containers(cluster: &GarageCluster, bucket: &str, prefix: &str) -> Vec<String> {
    objects(cluster, bucket, prefix)
        .into_iter()
        .filter(|name| name.contains("/backup/containers/"))
        .collect()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("{error}: {text}"))
}

/// Goal: backups made by one client restore byte-exact by a second client with an empty cache,
/// which sees every backup with its host, and the repository checks clean from there. Method:
/// three backups of a changing tree; a second client lists, restores the oldest, the middle
/// and the newest, and runs `check --read-data`.
#[test]
fn second_client_restores_every_backup() {
    let cluster = GarageCluster::start();
    let url = cluster.url(cluster.bucket(), "round-trip");
    let first = Client::new(&cluster, &url);
    first.ok(&["init"]);
    let copies = tempfile::tempdir().unwrap();
    for version in 1..=3u64 {
        let tree = copies.path().join(format!("v{version}"));
        write_tree(&tree, version, 2);
        let report = json(&first.ok(&[
            "backup",
            "create",
            "--json",
            "--host",
            "first-host",
            "data",
            tree.to_str().unwrap(),
        ]));
        assert_eq!(report["object_storage"]["generation"], version);
    }
    // Nothing readable in the bucket: no file name or content in the clear.
    for name in objects(&cluster, cluster.bucket(), "round-trip") {
        let data = cluster.get_object(1, cluster.bucket(), &name).unwrap();
        let text = String::from_utf8_lossy(&data);
        assert!(
            !text.contains("version-2") && !text.contains("growing"),
            "{name} is readable"
        );
    }

    let second = Client::new(&cluster, &url);
    let listed = json(&second.ok(&["backup", "list", "--json"]));
    let listed = listed.as_array().unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed.iter().all(|backup| backup["host"] == "first-host"));
    for version in [1, 2, 3] {
        let tree = copies.path().join(format!("v{version}"));
        assert_restores(&second, &format!("data@{version}"), &tree);
    }
    second.ok(&["check", "--read-data"]);
}

/// Goal: with one of the three nodes killed during a backup, the backup completes (a quorum of
/// two remains) or fails cleanly, nothing committed is lost, and restores are byte-exact.
/// Method: a first backup; a second one during which node 3 is killed; restart node 3; a
/// second client restores every committed backup and checks.
#[test]
fn node_killed_during_a_backup() {
    let cluster = GarageCluster::start();
    let url = cluster.url(cluster.bucket(), "node-killed");
    let client = Client::new(&cluster, &url);
    client.ok(&["init"]);
    let copies = tempfile::tempdir().unwrap();
    let v1 = copies.path().join("v1");
    write_tree(&v1, 1, 8);
    client.ok(&["backup", "create", "data", v1.to_str().unwrap()]);
    let v2 = copies.path().join("v2");
    write_tree(&v2, 2, 24);
    let backup = client.spawn(&["backup", "create", "data", v2.to_str().unwrap()]);
    std::thread::sleep(Duration::from_millis(300));
    cluster.kill_node(3);
    let output = backup.wait_with_output().unwrap();
    cluster.start_node(3);

    let reader = Client::new(&cluster, &url);
    let listed = json(&reader.ok(&["backup", "list", "--json"]));
    let versions: Vec<u64> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|backup| backup["version"].as_u64().unwrap())
        .collect();
    if output.status.success() {
        assert_eq!(versions, vec![1, 2]);
        assert_restores(&reader, "data@2", &v2);
    } else {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("onecopy: error:"),
            "an unclean failure: {stderr}"
        );
        assert_eq!(versions, vec![1]);
    }
    assert_restores(&reader, "data@1", &v1);
    reader.ok(&["check", "--read-data"]);
}

/// Goal: a client killed while it uploads commits nothing and damages nothing, and the
/// containers it uploaded are collected later. Method: kill a backup once its first
/// containers are in the bucket; a second client (after the killed client's lease lapses)
/// backs up, then compacts; the bucket then holds exactly the containers the catalog names,
/// which `check --read-data` confirms, and both committed backups restore.
#[test]
fn client_killed_mid_upload() {
    let cluster = GarageCluster::start();
    let url = cluster.url(cluster.bucket(), "killed");
    let first = Client::new(&cluster, &url);
    first.ok(&["init"]);
    let copies = tempfile::tempdir().unwrap();
    let v1 = copies.path().join("v1");
    write_tree(&v1, 1, 2);
    first.ok(&["backup", "create", "data", v1.to_str().unwrap()]);
    let committed = containers(&cluster, cluster.bucket(), "killed");

    let v2 = copies.path().join("v2");
    write_tree(&v2, 2, 40);
    let mut backup = first.spawn(&["backup", "create", "data", v2.to_str().unwrap()]);
    let started = Instant::now();
    loop {
        let now = containers(&cluster, cluster.bucket(), "killed");
        if now.len() > committed.len() {
            break;
        }
        assert!(
            backup.try_wait().unwrap().is_none(),
            "the backup ended before a container was uploaded"
        );
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no upload seen"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    backup.kill().unwrap();
    backup.wait().unwrap();
    let leftovers = containers(&cluster, cluster.bucket(), "killed");
    assert!(leftovers.len() > committed.len());

    let second = Client::new(&cluster, &url);
    let listed = json(&second.ok(&["backup", "list", "--json"]));
    assert_eq!(
        listed.as_array().unwrap().len(),
        1,
        "an uncommitted backup is listed"
    );
    let v3 = copies.path().join("v3");
    write_tree(&v3, 3, 2);
    second.ok(&["backup", "create", "data", v3.to_str().unwrap()]);
    // A backup leaves what it made unreferenced (here the killed client's containers, which
    // its recovery removed) to the next changing command; after one that frees space before
    // it returns, the bucket holds exactly the containers the catalog records.
    second.ok(&["backup", "compact"]);
    let after = containers(&cluster, cluster.bucket(), "killed");
    let stats = json(&second.ok(&["backup", "stats", "--json"]));
    let recorded = stats["containers_shared"].as_u64().unwrap()
        + stats["containers_archival"].as_u64().unwrap();
    assert_eq!(
        after.len() as u64,
        recorded,
        "leftovers stayed: {after:?}\n{stats}"
    );
    second.ok(&["check", "--read-data"]);
    assert_restores(&second, "data@1", &v1);
    assert_restores(&second, "data@2", &v3);
}

/// Goal: two clients backing up while a third expires take turns and all succeed, on Garage,
/// which has no conditional writes (the lease keeps writers apart), and every backup kept
/// restores. Method: start the three commands at once, each with its own cache; check the
/// reports, the list and the restores.
#[test]
fn two_clients_back_up_while_a_third_expires() {
    let cluster = GarageCluster::start();
    let url = cluster.url(cluster.bucket(), "concurrent");
    let setup = Client::new(&cluster, &url);
    setup.ok(&["init"]);
    let copies = tempfile::tempdir().unwrap();
    for version in 1..=2u64 {
        let tree = copies.path().join(format!("old-{version}"));
        write_tree(&tree, version, 1);
        setup.ok(&["backup", "create", "old", tree.to_str().unwrap()]);
    }
    let (a, b, c) = (
        Client::new(&cluster, &url),
        Client::new(&cluster, &url),
        Client::new(&cluster, &url),
    );
    let tree_a = copies.path().join("a");
    write_tree(&tree_a, 10, 4);
    let tree_b = copies.path().join("b");
    write_tree(&tree_b, 20, 4);
    let running = [
        a.spawn(&[
            "backup",
            "create",
            "--json",
            "--host",
            "host-a",
            "a",
            tree_a.to_str().unwrap(),
        ]),
        b.spawn(&[
            "backup",
            "create",
            "--json",
            "--host",
            "host-b",
            "b",
            tree_b.to_str().unwrap(),
        ]),
        c.spawn(&["backup", "expire", "old", "--keep-last", "1"]),
    ];
    let mut generations = Vec::new();
    for (index, child) in running.into_iter().enumerate() {
        let output = child.wait_with_output().unwrap();
        assert!(
            output.status.success(),
            "client {index} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        if index < 2 {
            let report = json(&String::from_utf8_lossy(&output.stdout));
            assert_eq!(report["object_storage"]["conditional_writes"], false);
            generations.push(report["object_storage"]["generation"].as_u64().unwrap());
        }
    }
    assert_ne!(
        generations[0], generations[1],
        "two commits of one generation"
    );

    let reader = Client::new(&cluster, &url);
    let listed = json(&reader.ok(&["backup", "list", "--json"]));
    let names: Vec<String> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|backup| {
            format!(
                "{}@{} {}",
                backup["series"].as_str().unwrap(),
                backup["version"],
                backup["host"].as_str().unwrap_or("")
            )
        })
        .collect();
    assert!(
        names.iter().any(|name| name.starts_with("a@1 host-a")),
        "{names:?}"
    );
    assert!(
        names.iter().any(|name| name.starts_with("b@1 host-b")),
        "{names:?}"
    );
    assert_eq!(
        names.iter().filter(|name| name.starts_with("old@")).count(),
        1,
        "{names:?}"
    );
    assert_restores(&reader, "a@1", &tree_a);
    assert_restores(&reader, "b@1", &tree_b);
    assert_restores(&reader, "old@2", &copies.path().join("old-2"));
    reader.ok(&["check", "--read-data"]);
}

/// Goal: a wrong password opens nothing, and a byte changed in any object of the bucket is an
/// authentication error naming the object, never wrong data. Method: a wrong password; then a
/// container object and the catalog object, each with one byte flipped in turn, read by a
/// fresh client.
#[test]
fn wrong_password_and_tampered_objects() {
    let cluster = GarageCluster::start();
    let bucket = cluster.bucket();
    let url = cluster.url(bucket, "tampered");
    let client = Client::new(&cluster, &url);
    client.ok(&["init"]);
    let copies = tempfile::tempdir().unwrap();
    let tree = copies.path().join("v1");
    write_tree(&tree, 1, 1);
    client.ok(&["backup", "create", "data", tree.to_str().unwrap()]);

    let wrong = client
        .command(&["backup", "list"])
        .env("ONECOPY_PASSWORD", "not the password")
        .output()
        .unwrap();
    assert!(!wrong.status.success());
    assert!(
        String::from_utf8_lossy(&wrong.stderr).contains("wrong password"),
        "{}",
        String::from_utf8_lossy(&wrong.stderr)
    );

    let container = containers(&cluster, bucket, "tampered")[0].clone();
    let catalog = objects(&cluster, bucket, "tampered")
        .into_iter()
        .find(|name| name.contains("/backup/catalog/"))
        .unwrap();
    // A container's middle is chunk data a restore reads; a catalog object is one zstd frame
    // with a checksum around the sealed catalog, read whole at every session.
    for object in [container, catalog] {
        let original = cluster.get_object(1, bucket, &object).unwrap();
        let mut changed = original.clone();
        let middle = changed.len() / 2;
        changed[middle] ^= 0x20;
        cluster.put_object(1, bucket, &object, &changed).unwrap();

        // The client that wrote it checks what the bucket holds, not its own copies.
        let check = client.run(&["check", "--read-data"]);
        let report = String::from_utf8_lossy(&check.stdout);
        assert!(
            !check.status.success(),
            "check missed the changed {object}: {report}"
        );

        let fresh = Client::new(&cluster, &url);
        let target = copies.path().join("restore-target");
        let _ = std::fs::remove_dir_all(&target);
        let restore = fresh.run(&["backup", "restore", "data@1", target.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&restore.stderr);
        assert!(
            !restore.status.success(),
            "restored over a changed {object}"
        );
        let short = object.rsplit("/backup/").next().unwrap();
        let what = short.split('/').next().unwrap();
        assert!(
            (stderr.contains("authentication") || stderr.contains("corrupt"))
                && stderr.contains(what),
            "the error does not name {object}: {stderr}"
        );
        cluster.put_object(1, bucket, &object, &original).unwrap();
    }
    assert_restores(&Client::new(&cluster, &url), "data@1", &tree);
}

/// Goal: a repository URL without credentials is refused with a message that says what to
/// set, a missing repository names `onecopy init`, `init` without a password makes nothing,
/// and other faces refuse s3 URLs. Method: run those commands.
#[test]
fn missing_credentials_and_other_faces_are_refused() {
    let cluster = GarageCluster::start();
    let url = cluster.url(cluster.bucket(), "refused");
    let client = Client::new(&cluster, &url);
    let output = client
        .command(&["init"])
        .env_remove("AWS_ACCESS_KEY_ID")
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("AWS_ACCESS_KEY_ID"));
    let output = client.run(&["backup", "list"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("onecopy init"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // The first key is made by `init`, which needs a password then.
    let output = client
        .command(&["init"])
        .env_remove("ONECOPY_PASSWORD")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("password"),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let output = client.run(&["volume", "list"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("hold backups only"));
}
