//! The Garage cluster the object-storage tests run against is real: three connected nodes that
//! each hold a copy of every object, readable and writable with one node down, and a killed node
//! that rejoins and counts towards the quorum again.

mod support_garage;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support_garage::{GarageCluster, NODES};

/// Deterministic incompressible bytes (xorshift64), so Garage stores them as one data block.
fn pattern(bytes: usize, seed: u64) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// Prints how long a phase took (shown with --nocapture) and starts the next one.
fn phase_done(name: &str, started: &mut Instant) {
    eprintln!(
        "garage_cluster: {name}: {:.2} s",
        started.elapsed().as_secs_f64()
    );
    *started = Instant::now();
}

/// Sizes of the files below `directory`, recursively.
fn file_sizes(directory: &Path) -> Vec<u64> {
    let mut sizes = Vec::new();
    let Ok(entries) = std::fs::read_dir(directory) else {
        return sizes;
    };
    for entry in entries.flatten() {
        let metadata = entry.metadata().expect("metadata of a data file");
        if metadata.is_dir() {
            sizes.extend(file_sizes(&entry.path()));
        } else {
            sizes.push(metadata.len());
        }
    }
    sizes
}

fn number(value: &Value, field: &str) -> u64 {
    value[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} is not a number in {value}"))
}

/// Asserts the cluster is three connected nodes, one zone each, with every partition stored on
/// all three (replication factor 3), as the administration API's health, status and layout say.
fn assert_three_replicas(cluster: &GarageCluster) {
    let health = cluster.admin_json(1, "GetClusterHealth");
    assert_eq!(health["status"], "healthy", "{health}");
    assert_eq!(number(&health, "connectedNodes"), 3, "{health}");
    assert_eq!(number(&health, "storageNodes"), 3, "{health}");
    assert_eq!(number(&health, "storageNodesUp"), 3, "{health}");

    let status = cluster.admin_json(1, "GetClusterStatus");
    let nodes = status["nodes"].as_array().expect("nodes in the status");
    let mut zones: Vec<&str> = nodes
        .iter()
        .filter(|node| node["isUp"] == true)
        .map(|node| node["role"]["zone"].as_str().expect("a zone"))
        .collect();
    zones.sort_unstable();
    assert_eq!(zones, ["dc1", "dc2", "dc3"], "{status}");

    // With 3 nodes, a partition on every node means 3 copies of it: replication factor 3.
    let layout = cluster.admin_json(1, "GetClusterLayout");
    let partitions = number(&health, "partitions");
    let roles = layout["roles"].as_array().expect("roles in the layout");
    assert_eq!(roles.len(), 3, "{layout}");
    for role in roles {
        assert_eq!(number(role, "storedPartitions"), partitions, "{layout}");
    }
}

/// Asserts every node holds its own copy of an object's data: a data block at least as large as
/// the (incompressible) object in each node's data directory. The third copy may land a moment
/// after the PUT returns, which needs only two.
fn assert_block_on_every_node(cluster: &GarageCluster, object_bytes: usize) {
    let deadline = Instant::now() + Duration::from_secs(20);
    for node in NODES {
        let data = cluster.directory().join(format!("node{node}/data"));
        loop {
            let largest = file_sizes(&data).into_iter().max().unwrap_or(0);
            if largest >= object_bytes as u64 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {node} holds no copy of a {object_bytes}-byte object in {} (largest file {largest} bytes)",
                data.display()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Goal: the test cluster is a real replicated cluster: three nodes with replication factor 3,
/// byte-exact S3 round trips, reads and writes with one node killed (quorum 2 of 3), and a
/// restarted node that rejoins. Method: curl through different nodes' endpoints, kill node 2,
/// restart it, then kill node 1 so that only the rejoined node 2 and node 3 form the quorum.
#[test]
fn cluster_is_replicated_and_survives_one_node() {
    let mut started = Instant::now();
    let total = Instant::now();
    let cluster = GarageCluster::start();
    let bucket = cluster.bucket().to_string();
    phase_done("start", &mut started);

    assert_three_replicas(&cluster);
    phase_done("topology", &mut started);

    let first = pattern(300_000, 1);
    cluster
        .put_object(1, &bucket, "phase/first", &first)
        .unwrap();
    assert!(cluster.get_object(3, &bucket, "phase/first").unwrap() == first);
    assert_block_on_every_node(&cluster, first.len());
    phase_done("put, get, three copies", &mut started);

    cluster.kill_node(2);
    phase_done("kill node 2", &mut started);
    assert!(
        cluster.get_object(1, &bucket, "phase/first").unwrap() == first,
        "the object read with node 2 down differs"
    );
    let second = pattern(200_000, 2);
    cluster
        .put_object(1, &bucket, "phase/second", &second)
        .unwrap();
    assert!(cluster.get_object(3, &bucket, "phase/second").unwrap() == second);
    phase_done("get and put with node 2 down", &mut started);

    cluster.start_node(2);
    phase_done("start node 2", &mut started);
    let health = cluster.admin_json(2, "GetClusterHealth");
    assert_eq!(health["status"], "healthy", "{health}");

    // Only nodes 2 and 3 run now: every read and write needs the rejoined node 2.
    cluster.kill_node(1);
    assert!(
        cluster.get_object(2, &bucket, "phase/second").unwrap() == second,
        "the object written while node 2 was down differs when read through nodes 2 and 3"
    );
    let third = pattern(100_000, 3);
    cluster
        .put_object(2, &bucket, "phase/third", &third)
        .unwrap();
    assert!(cluster.get_object(3, &bucket, "phase/third").unwrap() == third);
    phase_done(
        "get and put through the rejoined node with node 1 down",
        &mut started,
    );
    eprintln!(
        "garage_cluster: total {:.2} s",
        total.elapsed().as_secs_f64()
    );
}

/// Goal: record that Garage ignores conditional writes, so onecopy's commit protocol must not
/// rely on `If-None-Match: *` there (it takes its lease path instead). Method: two create-only
/// PUTs of one key; both succeed and the second replaces the first. Should a Garage release
/// start answering 412, this test fails and the repository's capability probe must be revisited.
#[test]
fn garage_ignores_if_none_match_on_put() {
    let cluster = GarageCluster::start();
    let bucket = cluster.new_bucket("conditional");
    let create_only = ["If-None-Match: *"];

    let (status, body) = cluster.put_object_with(1, &bucket, "commit", b"first", &create_only);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let (status, body) = cluster.put_object_with(1, &bucket, "commit", b"second", &create_only);
    assert_eq!(
        status,
        200,
        "Garage now refuses a create-only PUT of an existing key: {}",
        String::from_utf8_lossy(&body)
    );
    assert_eq!(cluster.get_object(2, &bucket, "commit").unwrap(), b"second");
}
