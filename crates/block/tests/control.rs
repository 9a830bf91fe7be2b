//! The control socket of a running block device, through its public client.

use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use onecopy_block::control::{control_socket_path, request, ControlRequest, ControlServer};
use onecopy_block::{Engine, HintSettings, RuntimeOptions};
use onecopy_core::storage::{LocalStorage, Storage};

/// Goal: a client reads the server's live state through the control socket: volume records,
/// a volume's statistics with the counters of writes made through the server's engine, the
/// status, and a check report; errors come back as messages; the socket is 0600, replaces a
/// stale one, and disappears when the server stops. Method: an engine in a temporary
/// directory written through its API, requests through `control::request`.
#[test]
fn control_socket_answers_with_live_state() {
    let directory = tempfile::tempdir().unwrap();
    let face = directory.path().join("block");
    let storage: Arc<dyn Storage> = Arc::new(LocalStorage::create(&face).unwrap());
    let engine = Engine::open(storage, None, RuntimeOptions::default()).unwrap();
    let volume = engine
        .create_volume("disk", 16 << 20, 4096, HintSettings::default())
        .unwrap()
        .id;
    engine.write(volume, 0, &vec![7u8; 1 << 20], false).unwrap();
    engine
        .write(volume, 1 << 20, &vec![7u8; 1 << 20], false)
        .unwrap();

    assert_eq!(
        request(&face, &ControlRequest::Volumes).unwrap(),
        None,
        "no server yet"
    );
    drop(UnixListener::bind(control_socket_path(&face)).unwrap());
    assert!(
        std::fs::symlink_metadata(control_socket_path(&face))
            .unwrap()
            .file_type()
            .is_socket(),
        "a stale socket is left"
    );
    assert_eq!(
        request(&face, &ControlRequest::Volumes).unwrap(),
        None,
        "stale socket"
    );

    let server = ControlServer::start(&face, Arc::clone(&engine), "pid 1: test".into()).unwrap();
    let mode = std::fs::metadata(server.path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);

    let volumes = request(&face, &ControlRequest::Volumes)
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(volumes[0]["name"], "disk");
    let stats = request(
        &face,
        &ControlRequest::VolumeStats {
            name: "disk".into(),
        },
    )
    .unwrap()
    .unwrap()
    .unwrap();
    assert_eq!(stats["mapped_bytes"], 2 << 20);
    assert_eq!(stats["engine"]["requests"]["writes"], 2);
    assert!(
        stats["engine"]["requests"]["blocks_deduplicated"]
            .as_u64()
            .unwrap()
            > 0
    );
    let status = request(&face, &ControlRequest::Status)
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(status["holder"], "pid 1: test");
    assert_eq!(status["pid"], std::process::id());
    let check = request(&face, &ControlRequest::Check { read_data: true })
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(check["checked"]["pages"].as_u64() > Some(0), "{check}");
    assert_eq!(
        check["findings"].as_array().map(Vec::len),
        Some(0),
        "{check}"
    );
    let missing = request(
        &face,
        &ControlRequest::VolumeStats {
            name: "other".into(),
        },
    )
    .unwrap()
    .unwrap()
    .unwrap_err();
    assert!(missing.contains("volume other"), "{missing}");

    drop(server);
    assert!(!control_socket_path(&face).exists(), "socket removed");
    assert_eq!(request(&face, &ControlRequest::Status).unwrap(), None);
    engine.shutdown().unwrap();
}

/// Goal: an answer that is not a control response (another program on the socket) is a typed
/// error naming the socket, not a made-up I/O error. Method: a listener that answers
/// "hello" to any request.
#[test]
fn foreign_answer_is_a_typed_error() {
    use std::io::{BufRead, BufReader, Write};

    let directory = tempfile::tempdir().unwrap();
    let path = control_socket_path(directory.path());
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        (&stream).write_all(b"hello\n").unwrap();
    });
    let error = request(directory.path(), &ControlRequest::Status).unwrap_err();
    server.join().unwrap();
    assert!(
        matches!(error, onecopy_block::BlockError::ControlAnswer { .. }),
        "{error:?}"
    );
    let message = error.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("not a control response"), "{message}");
}
