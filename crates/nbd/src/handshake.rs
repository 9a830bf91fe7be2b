//! The fixed newstyle handshake, server side: greeting, client flags, then option haggling
//! until the client enters transmission (`OPT_GO` or `OPT_EXPORT_NAME`), aborts, or breaks
//! the protocol.
//!
//! Oldstyle negotiation is never offered. A client that does not set `C_FIXED_NEWSTYLE` is
//! still answered in fixed newstyle, which is compatible with plain newstyle clients since
//! those only send `OPT_EXPORT_NAME`.
//!
//! TLS follows the server's [`TlsPolicy`](crate::TlsPolicy): without credentials
//! `OPT_STARTTLS` gets `NBD_REP_ERR_UNSUP`; with them it gets `NBD_REP_ACK`, the TLS handshake
//! runs, and option haggling starts over inside TLS with nothing negotiated before kept (as
//! the specification asks). When TLS is required, every other option before the upgrade gets
//! `NBD_REP_ERR_TLS_REQD` (`OPT_ABORT` excepted), and `OPT_EXPORT_NAME` ends the connection.
//!
//! Limits: at most [`HandshakeLimits::options_max`] options per connection; option data
//! longer than [`HandshakeLimits::option_bytes_max`] is discarded and answered with
//! `NBD_REP_ERR_TOO_BIG` if it is at most [`OPTION_DISCARD_BYTES_MAX`], and closes the
//! connection otherwise; the whole handshake, TLS included, must end within
//! [`ServerConfig::handshake_timeout`](crate::ServerConfig::handshake_timeout).

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::Instant;

use crate::codec::{
    self, ClientFlags, ExportRequest, InvalidOption, MetaContextRequest, OptionHeader,
    ProtocolViolation,
};
use crate::config::ServerConfig;
use crate::error::NbdError;
use crate::export::{Export, ExportCatalog};
use crate::protocol;
use crate::request::Limits;
use crate::tls::{Channel, TlsPolicy};
use crate::transport::Transport;

/// Option data longer than this closes the connection instead of being skipped.
pub const OPTION_DISCARD_BYTES_MAX: u32 = 16 << 20;

/// Metadata context id this server assigns to `base:allocation`.
pub const BASE_ALLOCATION_CONTEXT_ID: u32 = 1;

/// What the handshake settled for the transmission phase.
pub(crate) struct Session {
    pub export: Arc<dyn Export>,
    /// The canonical name of the export (the default export's real name if the client sent
    /// an empty name).
    pub export_name: String,
    pub limits: Limits,
    pub transmission_flags: u16,
}

pub(crate) enum Outcome {
    /// The client entered transmission with this session.
    Transmission(Session),
    /// The client ended the handshake (`OPT_ABORT` or closing the connection).
    Ended,
}

/// Negotiation state carried from option to option.
#[derive(Default)]
struct State {
    client_flags: ClientFlags,
    structured_replies: bool,
    /// Export name given in the last successful `OPT_SET_META_CONTEXT` that selected
    /// `base:allocation`; block status is allowed only if the client then enters
    /// transmission with the same name.
    base_allocation_for: Option<String>,
    /// The server has credentials and answers `OPT_STARTTLS`.
    tls_offered: bool,
    /// Nothing but `OPT_STARTTLS` and `OPT_ABORT` is served before TLS runs.
    tls_required: bool,
    /// TLS runs on the connection.
    tls_active: bool,
}

impl State {
    /// Forgets what was negotiated before TLS started, as the specification requires.
    fn start_over_inside_tls(&mut self) {
        self.structured_replies = false;
        self.base_allocation_for = None;
        self.tls_active = true;
    }
}

/// The connection's stream with the handshake's deadline applied to every read.
struct Deadlined<'a, T: Transport> {
    channel: &'a mut Channel<T>,
    deadline: Instant,
}

impl<T: Transport> Read for Deadlined<'_, T> {
    fn read(&mut self, buffer: &mut [u8]) -> io::Result<usize> {
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(handshake_too_long());
        }
        self.channel.set_read_timeout(Some(remaining))?;
        self.channel.set_read_deadline(Some(self.deadline));
        match self.channel.read(buffer) {
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => Err(handshake_too_long()),
            result => result,
        }
    }
}

impl<T: Transport> Write for Deadlined<'_, T> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.channel.write(data)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.channel.flush()
    }
}

fn handshake_too_long() -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        "the handshake took longer than the server allows",
    )
}

/// Runs the handshake on `channel`, switching it to TLS if the client upgrades. Returns
/// `Outcome::Ended` if the client closes the connection cleanly between options. Every read
/// must complete before `deadline`.
pub(crate) fn negotiate<T: Transport>(
    channel: &mut Channel<T>,
    catalog: &dyn ExportCatalog,
    config: &ServerConfig,
    deadline: Instant,
) -> Result<Outcome, NbdError> {
    let limits = &config.handshake;
    let stream = &mut Deadlined { channel, deadline };
    let greeting = codec::encode_greeting(protocol::FLAG_FIXED_NEWSTYLE | protocol::FLAG_NO_ZEROES);
    stream
        .write_all(&greeting)
        .and_then(|()| stream.flush())
        .map_err(|error| NbdError::io("sending the greeting", error))?;

    let mut flags = [0; 4];
    if !read_or_end(stream, &mut flags, "reading client flags")? {
        return Ok(Outcome::Ended);
    }
    let mut state = State {
        client_flags: ClientFlags::decode(u32::from_be_bytes(flags))?,
        tls_offered: config.tls.credentials().is_some(),
        tls_required: config.tls.is_required(),
        ..State::default()
    };

    let mut reply = Vec::with_capacity(256);
    for _ in 0..limits.options_max {
        let mut header = [0; protocol::OPTION_HEADER_BYTES];
        if !read_or_end(stream, &mut header, "reading an option header")? {
            return Ok(Outcome::Ended);
        }
        let header = OptionHeader::decode(&header)?;
        reply.clear();

        if header.length > limits.option_bytes_max {
            if header.length > OPTION_DISCARD_BYTES_MAX {
                return Err(ProtocolViolation::OptionTooLong {
                    option: header.option,
                    length: header.length,
                    limit: OPTION_DISCARD_BYTES_MAX,
                }
                .into());
            }
            discard(stream, u64::from(header.length))?;
            error_reply(
                &mut reply,
                header.option,
                protocol::REP_ERR_TOO_BIG,
                "option data too long",
            );
            send(stream, &reply)?;
            continue;
        }
        let mut data = vec![0; header.length as usize];
        stream
            .read_exact(&mut data)
            .map_err(|error| NbdError::io("reading option data", error))?;

        match handle_option(&mut state, catalog, header.option, &data, &mut reply)? {
            Step::Continue => send(stream, &reply)?,
            Step::Abort => {
                // The client may already have closed; a failed acknowledgement is harmless.
                let _ = send(stream, &reply);
                return Ok(Outcome::Ended);
            }
            Step::Enter(session) => {
                send(stream, &reply)?;
                return Ok(Outcome::Transmission(session));
            }
            Step::StartTls => {
                send(stream, &reply)?;
                let credentials = match &config.tls {
                    TlsPolicy::Offered(credentials) | TlsPolicy::Required(credentials) => {
                        credentials
                    }
                    TlsPolicy::Off => {
                        unreachable!("STARTTLS is acknowledged only with credentials")
                    }
                };
                stream.channel.start_tls(credentials, deadline)?;
                state.start_over_inside_tls();
            }
        }
    }
    Err(ProtocolViolation::TooManyOptions {
        limit: limits.options_max,
    }
    .into())
}

enum Step {
    Continue,
    Abort,
    Enter(Session),
    /// Acknowledged `OPT_STARTTLS`: the TLS handshake follows the reply.
    StartTls,
}

/// Handles one option and appends the replies to `reply`. Pure apart from the catalog calls,
/// so it can be tested without sockets.
fn handle_option(
    state: &mut State,
    catalog: &dyn ExportCatalog,
    option: u32,
    data: &[u8],
    reply: &mut Vec<u8>,
) -> Result<Step, NbdError> {
    if state.tls_required && !state.tls_active {
        match option {
            protocol::OPT_STARTTLS | protocol::OPT_ABORT => {}
            // This option cannot report errors: the session must end.
            protocol::OPT_EXPORT_NAME => return Err(ProtocolViolation::TlsRequired.into()),
            _ => {
                error_reply(
                    reply,
                    option,
                    protocol::REP_ERR_TLS_REQD,
                    "this server requires TLS: upgrade with STARTTLS first",
                );
                return Ok(Step::Continue);
            }
        }
    }
    match option {
        protocol::OPT_EXPORT_NAME => {
            let name = codec::decode_string(data).ok_or(ProtocolViolation::BadExportName)?;
            // This option cannot report errors: an unknown export must end the session.
            let (canonical_name, export) = resolve(catalog, &name)
                .ok_or_else(|| ProtocolViolation::UnknownExport { name: name.clone() })?;
            let session = open_session(state, &name, canonical_name, export);
            reply.extend_from_slice(&session.limits.size_bytes.to_be_bytes());
            reply.extend_from_slice(&session.transmission_flags.to_be_bytes());
            if !state.client_flags.no_zeroes {
                reply.extend_from_slice(&[0; protocol::EXPORT_NAME_PADDING_BYTES]);
            }
            Ok(Step::Enter(session))
        }
        protocol::OPT_ABORT => {
            codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
            Ok(Step::Abort)
        }
        protocol::OPT_LIST => {
            if !data.is_empty() {
                error_reply(
                    reply,
                    option,
                    protocol::REP_ERR_INVALID,
                    "list takes no data",
                );
                return Ok(Step::Continue);
            }
            for info in catalog.list() {
                let mut server = Vec::with_capacity(4 + info.name.len() + info.description.len());
                server.extend_from_slice(&(info.name.len() as u32).to_be_bytes());
                server.extend_from_slice(info.name.as_bytes());
                server.extend_from_slice(
                    codec::truncate_utf8(&info.description, protocol::STRING_BYTES_MAX).as_bytes(),
                );
                codec::put_option_reply(reply, option, protocol::REP_SERVER, &server);
            }
            codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
            Ok(Step::Continue)
        }
        protocol::OPT_STARTTLS => {
            let refusal = if !data.is_empty() {
                Some((protocol::REP_ERR_INVALID, "starttls takes no data"))
            } else if state.tls_active {
                Some((protocol::REP_ERR_INVALID, "TLS is already running"))
            } else if !state.tls_offered || !state.client_flags.fixed_newstyle {
                Some((protocol::REP_ERR_UNSUP, "this server does not offer TLS"))
            } else {
                None
            };
            match refusal {
                Some((reply_type, message)) => {
                    error_reply(reply, option, reply_type, message);
                    Ok(Step::Continue)
                }
                None => {
                    codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
                    Ok(Step::StartTls)
                }
            }
        }
        protocol::OPT_INFO | protocol::OPT_GO => {
            let request = match ExportRequest::decode(data) {
                Ok(request) => request,
                Err(InvalidOption { reason }) => {
                    error_reply(reply, option, protocol::REP_ERR_INVALID, reason);
                    return Ok(Step::Continue);
                }
            };
            let Some((canonical_name, export)) = resolve(catalog, &request.name) else {
                error_reply(reply, option, protocol::REP_ERR_UNKNOWN, "no such export");
                return Ok(Step::Continue);
            };
            let description = catalog
                .list()
                .into_iter()
                .find(|info| info.name == canonical_name)
                .map(|info| info.description)
                .unwrap_or_default();
            let session = open_session(state, &request.name, canonical_name, export);
            put_export_information(reply, option, &session, &request, &description);
            codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
            if option == protocol::OPT_GO {
                Ok(Step::Enter(session))
            } else {
                Ok(Step::Continue)
            }
        }
        protocol::OPT_STRUCTURED_REPLY => {
            if !data.is_empty() {
                error_reply(
                    reply,
                    option,
                    protocol::REP_ERR_INVALID,
                    "structured-reply takes no data",
                );
            } else {
                state.structured_replies = true;
                codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
            }
            Ok(Step::Continue)
        }
        protocol::OPT_LIST_META_CONTEXT | protocol::OPT_SET_META_CONTEXT => {
            let setting = option == protocol::OPT_SET_META_CONTEXT;
            if setting {
                // Setting replaces the previous selection even when it fails.
                state.base_allocation_for = None;
                if !state.structured_replies {
                    error_reply(
                        reply,
                        option,
                        protocol::REP_ERR_INVALID,
                        "negotiate structured replies first",
                    );
                    return Ok(Step::Continue);
                }
            }
            let request = match MetaContextRequest::decode(data) {
                Ok(request) => request,
                Err(InvalidOption { reason }) => {
                    error_reply(reply, option, protocol::REP_ERR_INVALID, reason);
                    return Ok(Step::Continue);
                }
            };
            if resolve(catalog, &request.export_name).is_none() {
                error_reply(reply, option, protocol::REP_ERR_UNKNOWN, "no such export");
                return Ok(Step::Continue);
            }
            let selected = if setting {
                request
                    .queries
                    .iter()
                    .any(|query| query == protocol::CONTEXT_BASE_ALLOCATION)
            } else {
                // Listing: no query lists everything; `base:` is the namespace wildcard.
                request.queries.is_empty()
                    || request
                        .queries
                        .iter()
                        .any(|query| query == "base:" || query == protocol::CONTEXT_BASE_ALLOCATION)
            };
            if selected {
                let id = if setting {
                    state.base_allocation_for = Some(request.export_name);
                    BASE_ALLOCATION_CONTEXT_ID
                } else {
                    // The specification reserves the id of listed contexts and asks for zero.
                    0
                };
                let mut context = id.to_be_bytes().to_vec();
                context.extend_from_slice(protocol::CONTEXT_BASE_ALLOCATION.as_bytes());
                codec::put_option_reply(reply, option, protocol::REP_META_CONTEXT, &context);
            }
            codec::put_option_reply(reply, option, protocol::REP_ACK, &[]);
            Ok(Step::Continue)
        }
        _ => {
            error_reply(reply, option, protocol::REP_ERR_UNSUP, "unknown option");
            Ok(Step::Continue)
        }
    }
}

/// Applies the default-export rule (see [`ExportCatalog::open`]) and returns the canonical
/// name with the export.
fn resolve(catalog: &dyn ExportCatalog, name: &str) -> Option<(String, Arc<dyn Export>)> {
    if let Some(export) = catalog.open(name) {
        return Some((name.to_owned(), export));
    }
    if !name.is_empty() {
        return None;
    }
    let exports = catalog.list();
    match exports.as_slice() {
        [only] => catalog
            .open(&only.name)
            .map(|export| (only.name.clone(), export)),
        _ => None,
    }
}

/// Reads the export's properties once and computes the transmission flags.
fn open_session(
    state: &State,
    requested_name: &str,
    canonical_name: String,
    export: Arc<dyn Export>,
) -> Session {
    let block_size = export.block_size();
    let read_only = export.read_only();
    let mut flags = protocol::FLAG_HAS_FLAGS
        | protocol::FLAG_SEND_FLUSH
        | protocol::FLAG_SEND_FUA
        | protocol::FLAG_SEND_CACHE;
    if read_only {
        flags |= protocol::FLAG_READ_ONLY;
    } else {
        flags |= protocol::FLAG_SEND_TRIM
            | protocol::FLAG_SEND_WRITE_ZEROES
            | protocol::FLAG_SEND_FAST_ZERO;
    }
    if export.flush_is_global() {
        flags |= protocol::FLAG_CAN_MULTI_CONN;
    }
    if state.structured_replies {
        // Reads always answer with a single data chunk, so "don't fragment" costs nothing.
        flags |= protocol::FLAG_SEND_DF;
    }
    let block_status =
        state.structured_replies && state.base_allocation_for.as_deref() == Some(requested_name);
    Session {
        limits: Limits {
            size_bytes: export.size(),
            minimum_block_bytes: block_size.minimum_bytes(),
            payload_bytes_max: block_size.maximum_bytes(),
            read_only,
            structured_replies: state.structured_replies,
            block_status,
        },
        export,
        export_name: canonical_name,
        transmission_flags: flags,
    }
}

fn put_export_information(
    reply: &mut Vec<u8>,
    option: u32,
    session: &Session,
    request: &ExportRequest,
    description: &str,
) {
    let info_export =
        codec::encode_info_export(session.limits.size_bytes, session.transmission_flags);
    codec::put_option_reply(reply, option, protocol::REP_INFO, &info_export);
    // Always sent: clients that did not ask still learn the constraints the server enforces.
    let block_size = session.export.block_size();
    let info_block_size = codec::encode_info_block_size(
        block_size.minimum_bytes(),
        block_size.preferred_bytes(),
        block_size.maximum_bytes(),
    );
    codec::put_option_reply(reply, option, protocol::REP_INFO, &info_block_size);
    if request.information_requests.contains(&protocol::INFO_NAME) {
        let name = codec::encode_info_text(protocol::INFO_NAME, &session.export_name);
        codec::put_option_reply(reply, option, protocol::REP_INFO, &name);
    }
    if request
        .information_requests
        .contains(&protocol::INFO_DESCRIPTION)
        && !description.is_empty()
    {
        let text = codec::truncate_utf8(description, protocol::STRING_BYTES_MAX);
        let description = codec::encode_info_text(protocol::INFO_DESCRIPTION, text);
        codec::put_option_reply(reply, option, protocol::REP_INFO, &description);
    }
}

fn error_reply(reply: &mut Vec<u8>, option: u32, reply_type: u32, message: &str) {
    assert!(reply_type & protocol::REP_FLAG_ERROR != 0);
    codec::put_option_reply(reply, option, reply_type, message.as_bytes());
}

fn send<S: Write>(stream: &mut S, bytes: &[u8]) -> Result<(), NbdError> {
    stream
        .write_all(bytes)
        .and_then(|()| stream.flush())
        .map_err(|error| NbdError::io("sending an option reply", error))
}

/// Fills `buffer`; returns false if the stream ended before its first byte.
fn read_or_end<S: Read>(
    stream: &mut S,
    buffer: &mut [u8],
    context: &str,
) -> Result<bool, NbdError> {
    let mut filled = 0;
    while filled < buffer.len() {
        match stream.read(&mut buffer[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            // A TLS client that closes without a close_notify between options.
            Err(error) if filled == 0 && error.kind() == io::ErrorKind::UnexpectedEof => {
                return Ok(false)
            }
            Ok(0) => {
                return Err(NbdError::io(
                    context,
                    io::Error::from(io::ErrorKind::UnexpectedEof),
                ))
            }
            Ok(count) => filled += count,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(NbdError::io(context, error)),
        }
    }
    Ok(true)
}

fn discard<S: Read>(stream: &mut S, bytes: u64) -> Result<(), NbdError> {
    let copied = io::copy(&mut stream.take(bytes), &mut io::sink())
        .map_err(|error| NbdError::io("skipping option data", error))?;
    if copied != bytes {
        return Err(NbdError::io(
            "skipping option data",
            io::Error::from(io::ErrorKind::UnexpectedEof),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::ExportMap;
    use crate::memory::MemoryExport;

    fn catalog() -> ExportMap {
        let mut map = ExportMap::new();
        map.insert("a", "first", Arc::new(MemoryExport::new(1 << 20)));
        map.insert("b", "", Arc::new(MemoryExport::new(2 << 20)));
        map
    }

    // Goal: the default-export rule picks the only export, and nothing when there are two.
    #[test]
    fn default_export_rule() {
        let two = catalog();
        assert!(resolve(&two, "").is_none());
        assert_eq!(resolve(&two, "b").map(|(name, _)| name), Some("b".into()));
        let one = ExportMap::single("only", Arc::new(MemoryExport::new(4096)));
        assert_eq!(resolve(&one, "").map(|(name, _)| name), Some("only".into()));
        assert!(resolve(&one, "other").is_none());
    }

    // Goal: set-meta-context before structured replies is refused and clears the selection.
    #[test]
    fn set_meta_context_requires_structured_replies() {
        let catalog = catalog();
        let mut state = State {
            base_allocation_for: Some("a".into()),
            ..State::default()
        };
        let data = MetaContextRequest {
            export_name: "a".into(),
            queries: vec!["base:allocation".into()],
        }
        .encode();
        let mut reply = Vec::new();
        let step = handle_option(
            &mut state,
            &catalog,
            protocol::OPT_SET_META_CONTEXT,
            &data,
            &mut reply,
        )
        .expect("handled");
        assert!(matches!(step, Step::Continue));
        assert_eq!(state.base_allocation_for, None);
        assert_eq!(reply[12..16], protocol::REP_ERR_INVALID.to_be_bytes());
    }

    // Goal: block status is only allowed when the context was set for the same export name.
    #[test]
    fn block_status_needs_matching_export_name() {
        let catalog = catalog();
        let mut state = State::default();
        let mut reply = Vec::new();
        handle_option(
            &mut state,
            &catalog,
            protocol::OPT_STRUCTURED_REPLY,
            &[],
            &mut reply,
        )
        .expect("handled");
        let data = MetaContextRequest {
            export_name: "a".into(),
            queries: vec!["base:allocation".into(), "x-other:thing".into()],
        }
        .encode();
        handle_option(
            &mut state,
            &catalog,
            protocol::OPT_SET_META_CONTEXT,
            &data,
            &mut reply,
        )
        .expect("handled");
        assert_eq!(state.base_allocation_for.as_deref(), Some("a"));
        let export = catalog.open("b").expect("exists");
        let session = open_session(&state, "b", "b".into(), export);
        assert!(!session.limits.block_status);
        let export = catalog.open("a").expect("exists");
        let session = open_session(&state, "a", "a".into(), export);
        assert!(session.limits.block_status);
        assert!(session.transmission_flags & protocol::FLAG_SEND_DF != 0);
    }

    /// Goal: with TLS required and not yet running, only STARTTLS and ABORT are served:
    /// other options get TLS_REQD, OPT_EXPORT_NAME ends the session; once TLS runs, a second
    /// STARTTLS is invalid and options are served. Method: drive `handle_option` directly.
    #[test]
    fn tls_required_before_other_options() {
        let catalog = catalog();
        let mut state = State {
            client_flags: ClientFlags {
                fixed_newstyle: true,
                no_zeroes: true,
            },
            tls_offered: true,
            tls_required: true,
            ..State::default()
        };
        let reply_type = |reply: &[u8]| u32::from_be_bytes(reply[12..16].try_into().unwrap());
        for option in [
            protocol::OPT_LIST,
            protocol::OPT_INFO,
            protocol::OPT_GO,
            protocol::OPT_STRUCTURED_REPLY,
            protocol::OPT_SET_META_CONTEXT,
            99,
        ] {
            let mut reply = Vec::new();
            let step = handle_option(&mut state, &catalog, option, &[], &mut reply).unwrap();
            assert!(matches!(step, Step::Continue));
            assert_eq!(
                reply_type(&reply),
                protocol::REP_ERR_TLS_REQD,
                "option {option}"
            );
        }
        let mut reply = Vec::new();
        let error = handle_option(
            &mut state,
            &catalog,
            protocol::OPT_EXPORT_NAME,
            b"a",
            &mut reply,
        );
        assert!(error.is_err(), "no export without TLS");
        let step = handle_option(
            &mut state,
            &catalog,
            protocol::OPT_STARTTLS,
            &[],
            &mut reply,
        )
        .unwrap();
        assert!(matches!(step, Step::StartTls));
        assert_eq!(reply_type(&reply), protocol::REP_ACK);
        state.structured_replies = true;
        state.start_over_inside_tls();
        assert!(
            !state.structured_replies,
            "nothing negotiated before TLS is kept"
        );
        let mut reply = Vec::new();
        handle_option(
            &mut state,
            &catalog,
            protocol::OPT_STARTTLS,
            &[],
            &mut reply,
        )
        .unwrap();
        assert_eq!(reply_type(&reply), protocol::REP_ERR_INVALID);
        let mut reply = Vec::new();
        handle_option(&mut state, &catalog, protocol::OPT_LIST, &[], &mut reply).unwrap();
        assert_eq!(reply_type(&reply), protocol::REP_SERVER);

        let mut plain = State::default();
        let mut reply = Vec::new();
        handle_option(
            &mut plain,
            &catalog,
            protocol::OPT_STARTTLS,
            &[],
            &mut reply,
        )
        .unwrap();
        assert_eq!(
            reply_type(&reply),
            protocol::REP_ERR_UNSUP,
            "no credentials"
        );
    }
}
