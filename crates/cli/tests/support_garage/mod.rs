//! A real Garage cluster for the object-storage tests: three `garage server` processes on
//! loopback with replication factor 3, started by `scripts/garage-cluster.sh` (the script the
//! benchmarks use too) in a temporary directory of the test's own.
//!
//! Every test gets its own cluster on its own ports, so tests run in parallel. The cluster stops
//! when the `GarageCluster` drops, and a watchdog stops it when the test process dies without
//! dropping it. A missing `garage` or `curl` fails the test with a hint to run scripts/setup.sh:
//! these tests never skip.
//!
//! Terms: node N is 1, 2 or 3; node N's S3 endpoint is `http://127.0.0.1:PORT`; every bucket
//! is readable, writable and owned by the one access key of `env()`.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

/// The cluster's nodes, numbered as the script numbers them.
pub const NODES: [usize; 3] = [1, 2, 3];

/// The region Garage signs requests with (`s3_region` of the script's configurations).
pub const REGION: &str = "garage";

/// `scripts/garage-cluster.sh` of this checkout.
pub fn cluster_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/garage-cluster.sh")
}

/// The `garage` binary, where scripts/setup.sh puts it; fails the test when it is missing.
pub fn garage_binary() -> PathBuf {
    let on_path = Command::new("sh")
        .args(["-c", "command -v garage"])
        .output()
        .ok()
        .filter(|output| output.status.success())
        .map(|output| PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()));
    let in_cargo_home = std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".cargo/bin/garage"))
        .filter(|path| path.is_file());
    on_path.or(in_cargo_home).unwrap_or_else(|| {
        panic!(
            "garage is not installed (neither on PATH nor in ~/.cargo/bin): run scripts/setup.sh"
        )
    })
}

fn require_curl() {
    let found = Command::new("sh")
        .args(["-c", "command -v curl"])
        .output()
        .map(|output| output.status.success())
        .unwrap_or(false);
    assert!(found, "curl is not installed: run scripts/setup.sh");
}

fn describe(what: &str, output: &Output) -> String {
    format!(
        "{what}: {}\nstdout: {}\nstderr: {}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// A running three-node cluster in a temporary directory.
pub struct GarageCluster {
    /// Holds the cluster directory; dropped (removed) after the cluster stops.
    temporary: tempfile::TempDir,
    directory: PathBuf,
    /// The variables of DIR/env, by name.
    variables: BTreeMap<String, String>,
}

impl GarageCluster {
    /// Starts a cluster with the bucket `onecopy` and waits until it is healthy; panics with
    /// the script's output (which ends with the node logs' tails) when it cannot.
    pub fn start() -> GarageCluster {
        garage_binary();
        require_curl();
        let temporary = tempfile::Builder::new()
            .prefix("onecopy-garage-")
            .tempdir()
            .expect("temporary directory for a Garage cluster");
        let directory = temporary.path().join("cluster");
        let owner = std::process::id().to_string();
        let output = Command::new(cluster_script())
            .arg("start")
            .arg(&directory)
            .args(["--owner-pid", &owner])
            .output()
            .expect("running scripts/garage-cluster.sh");
        assert!(
            output.status.success(),
            "{}",
            describe("scripts/garage-cluster.sh start", &output)
        );
        let environment = std::fs::read_to_string(directory.join("env"))
            .unwrap_or_else(|error| panic!("reading {}/env: {error}", directory.display()));
        let variables = parse_environment(&environment);
        GarageCluster {
            temporary,
            directory,
            variables,
        }
    }

    /// The cluster directory (node configurations, data, logs, `env`).
    pub fn directory(&self) -> &Path {
        &self.directory
    }

    fn variable(&self, name: &str) -> &str {
        self.variables
            .get(name)
            .unwrap_or_else(|| panic!("{}/env has no {name}", self.directory.display()))
    }

    /// Node 1's S3 endpoint, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> &str {
        self.variable("GARAGE_S3_ENDPOINT")
    }

    /// Node `node`'s S3 endpoint.
    pub fn node_endpoint(&self, node: usize) -> String {
        assert!(NODES.contains(&node), "node {node} is not one of {NODES:?}");
        let endpoints: Vec<&str> = self.variable("GARAGE_S3_ENDPOINTS").split(' ').collect();
        assert_eq!(endpoints.len(), NODES.len());
        endpoints[node - 1].to_string()
    }

    /// The bucket made with the cluster.
    pub fn bucket(&self) -> &str {
        self.variable("GARAGE_BUCKET")
    }

    /// Makes bucket `name` (3 to 63 lowercase letters, digits, dots and dashes) for the same key
    /// and returns its name.
    pub fn new_bucket(&self, name: &str) -> String {
        let output = self.script(&["bucket", name]);
        assert!(
            output.status.success(),
            "{}",
            describe(&format!("scripts/garage-cluster.sh bucket {name}"), &output)
        );
        name.to_string()
    }

    /// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_DEFAULT_REGION` for a client.
    pub fn env(&self) -> Vec<(String, String)> {
        [
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_DEFAULT_REGION",
        ]
        .iter()
        .map(|name| (name.to_string(), self.variable(name).to_string()))
        .collect()
    }

    pub fn access_key_id(&self) -> &str {
        self.variable("AWS_ACCESS_KEY_ID")
    }

    pub fn secret_access_key(&self) -> &str {
        self.variable("AWS_SECRET_ACCESS_KEY")
    }

    /// A repository URL on node 1: `s3:http://127.0.0.1:PORT/BUCKET/PREFIX`.
    pub fn url(&self, bucket: &str, prefix: &str) -> String {
        format!("s3:{}/{bucket}/{prefix}", self.endpoint())
    }

    /// Node `node`'s configuration file.
    pub fn node_config(&self, node: usize) -> PathBuf {
        assert!(NODES.contains(&node), "node {node} is not one of {NODES:?}");
        self.directory.join(format!("node{node}.toml"))
    }

    /// Kills node `node` with SIGKILL and returns once the process is gone. The other nodes
    /// notice only when they next write to its connection, so the first request that involves
    /// the dead node may stall for about 8 s before it succeeds with the other two.
    pub fn kill_node(&self, node: usize) {
        let output = self.script(&["kill-node", &node.to_string()]);
        assert!(
            output.status.success(),
            "{}",
            describe(
                &format!("scripts/garage-cluster.sh kill-node {node}"),
                &output
            )
        );
    }

    /// Restarts node `node` with its configuration and data; returns once every running node
    /// sees every other one and all partitions have a quorum.
    pub fn start_node(&self, node: usize) {
        let output = self.script(&["start-node", &node.to_string()]);
        assert!(
            output.status.success(),
            "{}",
            describe(
                &format!("scripts/garage-cluster.sh start-node {node}"),
                &output
            )
        );
    }

    /// Runs `garage -c nodeN.toml ARGUMENTS` (the administration commands) and returns its
    /// output, successful or not.
    pub fn garage(&self, node: usize, arguments: &[&str]) -> Output {
        Command::new(garage_binary())
            .arg("-c")
            .arg(self.node_config(node))
            .args(arguments)
            .output()
            .expect("running garage")
    }

    /// The JSON answer of the administration call `endpoint` (such as `GetClusterHealth`) as
    /// node `node` sees the cluster.
    pub fn admin_json(&self, node: usize, endpoint: &str) -> Value {
        let output = self.garage(node, &["json-api", endpoint, "null"]);
        assert!(
            output.status.success(),
            "{}",
            describe(
                &format!("garage json-api {endpoint} on node {node}"),
                &output
            )
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|error| {
            panic!(
                "garage json-api {endpoint}: {error}: {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// PUT `bytes` as `bucket/key` through node `node`'s S3 endpoint, with `headers` added
    /// (such as `If-None-Match: *`); returns the HTTP status and the response body.
    pub fn put_object_with(
        &self,
        node: usize,
        bucket: &str,
        key: &str,
        bytes: &[u8],
        headers: &[&str],
    ) -> (u16, Vec<u8>) {
        let url = format!("{}/{bucket}/{key}", self.node_endpoint(node));
        let mut arguments = vec![
            "-X",
            "PUT",
            "-H",
            "Content-Type: application/octet-stream",
            "--data-binary",
            "@-",
        ];
        for header in headers {
            arguments.extend(["-H", header]);
        }
        self.curl(&url, &arguments, bytes)
    }

    /// PUT `bytes` as `bucket/key` through node `node`; `Err` holds the status and body.
    pub fn put_object(
        &self,
        node: usize,
        bucket: &str,
        key: &str,
        bytes: &[u8],
    ) -> Result<(), String> {
        match self.put_object_with(node, bucket, key, bytes, &[]) {
            (200, _) => Ok(()),
            (status, body) => Err(format!(
                "PUT {bucket}/{key} through node {node}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            )),
        }
    }

    /// GET `bucket/key` through node `node`; `Err` holds the status and body.
    pub fn get_object(&self, node: usize, bucket: &str, key: &str) -> Result<Vec<u8>, String> {
        let url = format!("{}/{bucket}/{key}", self.node_endpoint(node));
        match self.curl(&url, &[], &[]) {
            (200, body) => Ok(body),
            (status, body) => Err(format!(
                "GET {bucket}/{key} through node {node}: HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            )),
        }
    }

    /// One signed S3 request with curl; returns the HTTP status and the body. Payloads go
    /// unsigned (`UNSIGNED-PAYLOAD`), which S3 allows and which spares hashing them here.
    fn curl(&self, url: &str, arguments: &[&str], stdin: &[u8]) -> (u16, Vec<u8>) {
        let user = format!("{}:{}", self.access_key_id(), self.secret_access_key());
        let mut child = Command::new("curl")
            .args(["-sS", "--max-time", "60"])
            .args([
                "--aws-sigv4",
                &format!("aws:amz:{REGION}:s3"),
                "--user",
                &user,
            ])
            .args(["-H", "x-amz-content-sha256: UNSIGNED-PAYLOAD"])
            .args(arguments)
            // The status goes after the body, on a line of its own.
            .args(["-w", "\n%{http_code}", url])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("running curl");
        let mut input = child.stdin.take().expect("curl's stdin");
        input.write_all(stdin).expect("writing to curl");
        drop(input);
        let output = child.wait_with_output().expect("waiting for curl");
        assert!(
            output.status.success(),
            "{}",
            describe(&format!("curl {url}"), &output)
        );
        let mut body = output.stdout;
        let newline = body
            .iter()
            .rposition(|&byte| byte == b'\n')
            .expect("curl prints the status after a newline");
        let status: u16 = String::from_utf8_lossy(&body[newline + 1..])
            .parse()
            .expect("curl's status code");
        body.truncate(newline);
        (status, body)
    }

    fn script(&self, arguments: &[&str]) -> Output {
        let (command, rest) = arguments.split_first().expect("a script command");
        Command::new(cluster_script())
            .arg(command)
            .arg(&self.directory)
            .args(rest)
            .output()
            .expect("running scripts/garage-cluster.sh")
    }
}

impl Drop for GarageCluster {
    fn drop(&mut self) {
        // Never panic here: a test that already failed must report its own failure.
        match Command::new(cluster_script())
            .arg("stop")
            .arg(&self.directory)
            .output()
        {
            Ok(output) if output.status.success() => {}
            Ok(output) => eprintln!("{}", describe("scripts/garage-cluster.sh stop", &output)),
            Err(error) => eprintln!("running scripts/garage-cluster.sh stop: {error}"),
        }
    }
}

/// The `NAME='VALUE'` lines the script writes to DIR/env.
fn parse_environment(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| {
            let value = value.trim_matches('\'');
            (name.to_string(), value.to_string())
        })
        .collect()
}
