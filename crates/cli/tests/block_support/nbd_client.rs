//! A minimal NBD client written from the protocol specification, independent of the server's
//! own codec: fixed newstyle handshake with `NBD_OPT_GO`, simple replies only, and pipelined
//! requests (send several, then receive replies in any order by cookie).

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const INIT_MAGIC: &[u8; 8] = b"NBDMAGIC";
const OPTION_MAGIC: u64 = 0x4948_4156_454f_5054; // "IHAVEOPT"
const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
const REQUEST_MAGIC: u32 = 0x2560_9513;
const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
const CLIENT_FIXED_NEWSTYLE: u32 = 1;
const CLIENT_NO_ZEROES: u32 = 2;
const OPTION_GO: u32 = 7;
const REPLY_ACK: u32 = 1;
const REPLY_INFO: u32 = 3;
const REPLY_ERROR_BIT: u32 = 1 << 31;
const INFO_EXPORT: u16 = 0;

/// Transmission flag: a flush on any connection covers writes completed on every connection.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;
pub const FLAG_SEND_FUA: u16 = 1 << 3;
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;

pub const COMMAND_READ: u16 = 0;
pub const COMMAND_WRITE: u16 = 1;
pub const COMMAND_DISCONNECT: u16 = 2;
pub const COMMAND_FLUSH: u16 = 3;
pub const COMMAND_WRITE_ZEROES: u16 = 6;
pub const COMMAND_FLAG_FUA: u16 = 1;

/// A reply's cookie, its error (0 = success) and, for reads, the data.
#[derive(Debug)]
pub struct Reply {
    pub cookie: u64,
    pub error: u32,
    pub data: Vec<u8>,
}

/// One connection in the transmission phase.
pub struct NbdClient {
    stream: UnixStream,
    pub size_bytes: u64,
    pub transmission_flags: u16,
    /// Bytes each outstanding read will return, by cookie.
    pending_reads: HashMap<u64, usize>,
}

impl NbdClient {
    /// Connects to `socket` and selects export `name`.
    pub fn connect(socket: &Path, name: &str) -> io::Result<NbdClient> {
        let mut stream = UnixStream::connect(socket)?;
        stream.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut greeting = [0u8; 18];
        stream.read_exact(&mut greeting)?;
        if &greeting[..8] != INIT_MAGIC || be64(&greeting[8..16]) != OPTION_MAGIC {
            return Err(io::Error::other("not a newstyle NBD server"));
        }
        stream.write_all(&(CLIENT_FIXED_NEWSTYLE | CLIENT_NO_ZEROES).to_be_bytes())?;

        let mut data = Vec::new();
        data.extend_from_slice(&(name.len() as u32).to_be_bytes());
        data.extend_from_slice(name.as_bytes());
        data.extend_from_slice(&0u16.to_be_bytes());
        let mut option = Vec::new();
        option.extend_from_slice(&OPTION_MAGIC.to_be_bytes());
        option.extend_from_slice(&OPTION_GO.to_be_bytes());
        option.extend_from_slice(&(data.len() as u32).to_be_bytes());
        option.extend_from_slice(&data);
        stream.write_all(&option)?;

        let mut export = None;
        loop {
            let mut header = [0u8; 20];
            stream.read_exact(&mut header)?;
            if be64(&header) != OPTION_REPLY_MAGIC {
                return Err(io::Error::other("bad option reply magic"));
            }
            let reply_type = be32(&header[12..]);
            let mut payload = vec![0u8; be32(&header[16..]) as usize];
            stream.read_exact(&mut payload)?;
            if reply_type & REPLY_ERROR_BIT != 0 {
                return Err(io::Error::other(format!(
                    "export {name:?} refused: reply {reply_type:#x} {}",
                    String::from_utf8_lossy(&payload)
                )));
            }
            if reply_type == REPLY_INFO && payload.len() >= 12 && be16(&payload) == INFO_EXPORT {
                export = Some((be64(&payload[2..]), be16(&payload[10..])));
            }
            if reply_type == REPLY_ACK {
                break;
            }
        }
        let (size_bytes, transmission_flags) =
            export.ok_or_else(|| io::Error::other("no NBD_INFO_EXPORT before the ACK"))?;
        Ok(NbdClient {
            stream,
            size_bytes,
            transmission_flags,
            pending_reads: HashMap::new(),
        })
    }

    /// Sends one request without waiting for its reply.
    pub fn send(
        &mut self,
        command: u16,
        flags: u16,
        cookie: u64,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> io::Result<()> {
        assert!(command != COMMAND_WRITE || payload.len() == length as usize);
        let mut request = Vec::with_capacity(28 + payload.len());
        request.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        request.extend_from_slice(&flags.to_be_bytes());
        request.extend_from_slice(&command.to_be_bytes());
        request.extend_from_slice(&cookie.to_be_bytes());
        request.extend_from_slice(&offset.to_be_bytes());
        request.extend_from_slice(&length.to_be_bytes());
        request.extend_from_slice(payload);
        if command == COMMAND_READ {
            self.pending_reads.insert(cookie, length as usize);
        }
        self.stream.write_all(&request)
    }

    /// Receives the next reply (of any outstanding request).
    pub fn receive(&mut self) -> io::Result<Reply> {
        let mut header = [0u8; 16];
        self.stream.read_exact(&mut header)?;
        if be32(&header) != SIMPLE_REPLY_MAGIC {
            return Err(io::Error::other("bad simple reply magic"));
        }
        let error = be32(&header[4..]);
        let cookie = be64(&header[8..]);
        let length = self.pending_reads.remove(&cookie).unwrap_or(0);
        let mut data = Vec::new();
        if error == 0 && length > 0 {
            data.resize(length, 0);
            self.stream.read_exact(&mut data)?;
        }
        Ok(Reply {
            cookie,
            error,
            data,
        })
    }

    /// Reads `length` bytes at `offset`, waiting for the reply.
    pub fn read(&mut self, offset: u64, length: u32) -> io::Result<Vec<u8>> {
        self.send(COMMAND_READ, 0, u64::MAX, offset, length, &[])?;
        let reply = self.receive()?;
        if reply.error != 0 {
            return Err(io::Error::other(format!(
                "read of {length} bytes at {offset} failed with NBD error {}",
                reply.error
            )));
        }
        Ok(reply.data)
    }

    /// Ends the session politely.
    pub fn disconnect(mut self) -> io::Result<()> {
        self.send(COMMAND_DISCONNECT, 0, 0, 0, 0, &[])
    }
}

fn be16(bytes: &[u8]) -> u16 {
    u16::from_be_bytes([bytes[0], bytes[1]])
}

fn be32(bytes: &[u8]) -> u32 {
    u32::from_be_bytes(bytes[..4].try_into().expect("4 bytes"))
}

fn be64(bytes: &[u8]) -> u64 {
    u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"))
}
