//! Reaching an export: connect (TCP with a timeout and no Nagle delay, or
//! a Unix socket), negotiate within the connect timeout, and start the
//! transmission phase. A writable member refuses a read-only export here,
//! so neither the first connection nor a reconnection can hand one out.

use super::conn::{Conn, Stream};
use super::handshake;
use super::proto::FLAG_READ_ONLY;
use super::uri::{Endpoint, NbdUri};
use super::NbdOptions;
use crate::member::file::with_path;
use std::io;
use std::net::{TcpStream, ToSocketAddrs};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// Connect, negotiate and start a connection to the export; a writable
/// member refuses a read-only export.
pub(super) fn establish(uri: &NbdUri, options: &NbdOptions) -> io::Result<Conn> {
    let label = Path::new(&uri.text);
    let context = |what: &str, e: io::Error| with_path(label, what, e);
    let mut stream =
        connect(&uri.endpoint, options.connect_timeout).map_err(|e| context("connect", e))?;
    stream
        .set_timeouts(Some(options.connect_timeout), Some(options.connect_timeout))
        .map_err(|e| context("connect", e))?;
    let export = handshake::negotiate(&mut stream, &uri.export).map_err(|e| {
        let e = match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no handshake within {} s (connect timeout)",
                    options.connect_timeout.as_secs_f64()
                ),
            ),
            _ => e,
        };
        context("NBD handshake", e)
    })?;
    let read_only_export = export.has(FLAG_READ_ONLY);
    let conn =
        Conn::start(stream, export, options.request_timeout).map_err(|e| context("start", e))?;
    if !options.read_only && read_only_export {
        return Err(with_path(
            label,
            "the server exports it read-only, and a member of a writable array must take writes (serve it writable, or mount -o ro)",
            io::Error::from_raw_os_error(libc::EROFS),
        ));
    }
    Ok(conn)
}

/// Connect to the server (TCP with the timeout and no Nagle delay).
fn connect(endpoint: &Endpoint, timeout: Duration) -> io::Result<Stream> {
    match endpoint {
        Endpoint::Unix(path) => Ok(Stream::Unix(UnixStream::connect(path)?)),
        Endpoint::Tcp { host, port } => {
            let mut last = None;
            for addr in (host.as_str(), *port).to_socket_addrs()? {
                match TcpStream::connect_timeout(&addr, timeout) {
                    Ok(s) => {
                        s.set_nodelay(true)?;
                        return Ok(Stream::Tcp(s));
                    }
                    Err(e) => last = Some(e),
                }
            }
            Err(last.unwrap_or_else(|| {
                io::Error::new(io::ErrorKind::NotFound, format!("{host}: no address"))
            }))
        }
    }
}
