//! The NBD protocol (fixed newstyle handshake, transmission phase) and a server that serves any
//! [`BlockDevice`]-like export. (in progress)
