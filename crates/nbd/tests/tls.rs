//! TLS through `NBD_OPT_STARTTLS` with real clients: qemu-img, qemu-io and nbdinfo connect
//! with certificates made by the test (openssl); plain clients are refused when TLS is
//! required, and client certificates are checked when asked.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;

use common::*;
use onecopy_nbd::protocol as p;
use onecopy_nbd::{
    Export, ExportMap, ListenAddress, MemoryExport, Server, ServerConfig, TlsCredentials, TlsPolicy,
};

const EXPORT_BYTES: u64 = 16 << 20;

struct TlsServer {
    /// Kept for its lifetime: dropping it stops the server.
    _server: Server,
    export: Arc<MemoryExport>,
    certificates: Certificates,
    port: u16,
    directory: tempfile::TempDir,
}

/// A server on a loopback port with one memory export `disk` whose first MiB holds a pattern.
fn start(policy: impl Fn(TlsCredentials) -> TlsPolicy, verify_clients: bool) -> TlsServer {
    let directory = tempfile::tempdir().unwrap();
    let certificates = make_certificates(directory.path());
    let credentials = TlsCredentials::from_directory(&certificates.server, verify_clients)
        .expect("the test's credentials load");
    let export = Arc::new(MemoryExport::new(EXPORT_BYTES));
    export.write(0, &pattern(1 << 20, 7), false).unwrap();
    let catalog = ExportMap::single("disk", Arc::clone(&export) as Arc<dyn Export>);
    let config = ServerConfig {
        tls: policy(credentials),
        ..quiet_config()
    };
    let address = ListenAddress::tcp("127.0.0.1:0").unwrap();
    let server = Server::start(&address, Arc::new(catalog), config).unwrap();
    let ListenAddress::Tcp(bound) = server.address() else {
        unreachable!("a TCP address")
    };
    let port = bound.port();
    TlsServer {
        _server: server,
        export,
        certificates,
        port,
        directory,
    }
}

impl TlsServer {
    fn tls_uri(&self, credentials: &Path) -> String {
        format!(
            "nbds://127.0.0.1:{}/disk?tls-certificates={}",
            self.port,
            credentials.display()
        )
    }

    fn plain_uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/disk", self.port)
    }

    /// qemu's options for a TLS connection with the credentials in `credentials`.
    fn qemu_arguments(&self, credentials: &Path) -> [String; 3] {
        [
            "--object".into(),
            format!(
                "tls-creds-x509,id=tls0,dir={},endpoint=client",
                credentials.display()
            ),
            format!(
                "driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0",
                self.port
            ),
        ]
    }
}

fn fails(program: &str, arguments: &[&str]) -> String {
    require_tool(program);
    let output = Command::new(program).args(arguments).output().unwrap();
    assert!(
        !output.status.success(),
        "{program} {arguments:?} succeeded but must fail"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Goal: with TLS required, qemu-img, qemu-io and nbdinfo connect through STARTTLS and read
/// and write the export, while plain clients are refused: nbdinfo without TLS fails, a raw
/// client gets NBD_REP_ERR_TLS_REQD for its options and is disconnected when it asks for an
/// export with OPT_EXPORT_NAME. Method: certificates from openssl, a loopback server.
#[test]
fn required_tls_serves_tls_clients_and_refuses_plain_ones() {
    let server = start(TlsPolicy::Required, false);
    let client = server.certificates.client.clone();

    let info = run("nbdinfo", &["--json", &server.tls_uri(&client)]);
    let info = String::from_utf8_lossy(&info.stdout);
    assert!(info.contains(&EXPORT_BYTES.to_string()), "{info}");

    let [object, creds, image] = server.qemu_arguments(&client);
    let copy = server.directory.path().join("copy.raw");
    run(
        "qemu-img",
        &[
            "convert",
            &object,
            &creds,
            "--image-opts",
            &image,
            "-O",
            "raw",
            copy.to_str().unwrap(),
        ],
    );
    let copied = std::fs::read(&copy).unwrap();
    assert_eq!(copied.len() as u64, EXPORT_BYTES);
    assert!(
        copied[..1 << 20] == pattern(1 << 20, 7)[..],
        "data read over TLS"
    );
    assert!(copied[1 << 20..].iter().all(|&byte| byte == 0));

    run(
        "qemu-io",
        &[
            &object,
            &creds,
            "--image-opts",
            &image,
            "-c",
            "write -P 0x5a 2M 3M",
            "-c",
            "read -P 0x5a 2M 3M",
        ],
    );
    let mut written = vec![0; 3 << 20];
    server.export.read(2 << 20, &mut written).unwrap();
    assert!(
        written.iter().all(|&byte| byte == 0x5a),
        "data written over TLS"
    );

    let refused = fails("nbdinfo", &[&server.plain_uri()]);
    assert!(!refused.is_empty());

    let mut stream = TcpStream::connect(("127.0.0.1", server.port)).unwrap();
    let greeting = read_n(&mut stream, 18);
    assert_eq!(be64(&greeting), p::INIT_MAGIC);
    std::io::Write::write_all(&mut stream, &p::FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).unwrap();
    for (option, data) in [
        (p::OPT_LIST, Vec::new()),
        (p::OPT_GO, go_data("disk", &[])),
        (p::OPT_INFO, go_data("disk", &[])),
        (p::OPT_STRUCTURED_REPLY, Vec::new()),
    ] {
        send_tcp_option(&mut stream, option, &data);
        let (replied_option, reply, _) = read_tcp_option_reply(&mut stream);
        assert_eq!(replied_option, option);
        assert_eq!(reply, p::REP_ERR_TLS_REQD, "option {option} before TLS");
    }
    send_tcp_option(&mut stream, p::OPT_EXPORT_NAME, b"disk");
    let mut rest = Vec::new();
    let _ = stream.read_to_end(&mut rest);
    assert!(rest.is_empty(), "no export without TLS");
}

/// Goal: when the server verifies clients, a client with a certificate from the authority
/// gets in and one without a certificate is refused. Method: qemu-img with the client
/// credentials, nbdinfo with the authority only.
#[test]
fn client_certificates_are_verified_when_asked() {
    let server = start(TlsPolicy::Required, true);
    let [object, creds, image] = server.qemu_arguments(&server.certificates.client);
    let info = run(
        "qemu-img",
        &["info", &object, &creds, "--image-opts", &image],
    );
    assert!(String::from_utf8_lossy(&info.stdout).contains("16 MiB"));
    fails(
        "nbdinfo",
        &[&server.tls_uri(&server.certificates.anonymous_client)],
    );
}

/// Goal: with TLS offered, plain clients and TLS clients are both served. Method: nbdinfo
/// with and without TLS against one server.
#[test]
fn offered_tls_serves_plain_and_tls_clients() {
    let server = start(TlsPolicy::Offered, false);
    run("nbdinfo", &[&server.plain_uri()]);
    run(
        "nbdinfo",
        &[&server.tls_uri(&server.certificates.anonymous_client)],
    );
}

/// Goal: credentials that cannot be used are refused when they are loaded, naming the file.
/// Method: an empty directory, then a key that does not match the certificate.
#[test]
fn unusable_credentials_name_the_file() {
    let directory = tempfile::tempdir().unwrap();
    let error = TlsCredentials::from_directory(directory.path(), false).unwrap_err();
    assert!(error.to_string().contains("server-cert.pem"), "{error}");
    let certificates = make_certificates(directory.path());
    std::fs::copy(
        certificates.client.join("client-key.pem"),
        certificates.server.join("server-key.pem"),
    )
    .unwrap();
    let error = TlsCredentials::from_directory(&certificates.server, false).unwrap_err();
    assert!(error.to_string().contains("server-key.pem"), "{error}");
}

fn read_n(stream: &mut TcpStream, count: usize) -> Vec<u8> {
    let mut bytes = vec![0; count];
    stream.read_exact(&mut bytes).unwrap();
    bytes
}

fn send_tcp_option(stream: &mut TcpStream, option: u32, data: &[u8]) {
    let mut bytes = p::OPTION_MAGIC.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    std::io::Write::write_all(stream, &bytes).unwrap();
}

fn read_tcp_option_reply(stream: &mut TcpStream) -> (u32, u32, Vec<u8>) {
    let header = read_n(stream, 20);
    assert_eq!(be64(&header), p::OPTION_REPLY_MAGIC);
    let length = be32(&header[16..]) as usize;
    (
        be32(&header[8..]),
        be32(&header[12..]),
        read_n(stream, length),
    )
}
