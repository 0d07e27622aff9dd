//! `-o metrics=ADDR`: a small HTTP/1.1 endpoint in the mount daemon that
//! answers `GET /metrics` with the array's metrics in the Prometheus text
//! format (see [`super::metrics`]), for a Prometheus server to scrape.
//!
//! One thread accepts and answers one request per connection (scrapes
//! are rare and each answer is small), closing the connection after it.
//! A client that sends nothing within [`REQUEST_TIMEOUT`] is dropped, so
//! a stalled one delays the next scrape by at most that. The listener is
//! bound by the caller, before the mount is made, so a bad address fails
//! the mount instead of leaving it up without its endpoint.

use super::metrics;
use super::report::{ArrayReport, Origin};
use super::server::MountContext;
use crate::array::Array;
use crate::fs::FileSystem;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// How long a connection may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often the accept loop looks at the stop flag.
const POLL_MS: i32 = 200;
/// Longest request head read.
const MAX_HEAD: usize = 8 << 10;

/// Parse the address of `-o metrics=ADDR`: an IP address and a port
/// (`127.0.0.1:9464`, `[::1]:9464`). Exactly what is given is bound; a
/// host name or a missing port is refused.
pub fn parse_address(text: &str) -> Result<SocketAddr, String> {
    text.parse::<SocketAddr>().map_err(|_| {
        format!(
            "metrics={text}: expected IP:PORT to serve metrics on, e.g. 127.0.0.1:9464 or [::1]:9464"
        )
    })
}

/// Bind the metrics listener (before the mount, so a failure stops it).
pub fn bind(address: SocketAddr) -> Result<TcpListener, String> {
    TcpListener::bind(address).map_err(|e| format!("metrics={address}: cannot listen there: {e}"))
}

/// A running metrics endpoint; stops when dropped.
pub struct MetricsServer {
    address: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Serve the metrics of `array` and `fs` on `listener`.
    pub fn start(
        listener: TcpListener,
        array: Arc<Array>,
        fs: Arc<FileSystem>,
        context: MountContext,
    ) -> io::Result<MetricsServer> {
        let address = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let for_thread = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("raidfs-metrics".into())
            .spawn(move || {
                let report = || {
                    let origin = Origin {
                        mount_point: &context.mount_point,
                        owner_uid: context.owner_uid,
                        read_only: context.read_only,
                        replacing: None,
                        fs: Some(&fs),
                    };
                    ArrayReport::collect(&array, &origin)
                };
                serve(&listener, &for_thread, report)
            })?;
        log::info!("metrics served at http://{address}/metrics");
        Ok(MetricsServer {
            address,
            stop,
            thread: Some(thread),
        })
    }

    pub fn address(&self) -> SocketAddr {
        self.address
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Whether `listener` has a connection within one poll interval.
fn readable(listener: &TcpListener) -> bool {
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: fd is a valid pollfd for the call's duration.
    let n = unsafe { libc::poll(&mut fd, 1, POLL_MS) };
    n > 0 && fd.revents != 0
}

fn serve(listener: &TcpListener, stop: &AtomicBool, report: impl Fn() -> ArrayReport) {
    while !stop.load(Ordering::Acquire) {
        if !readable(listener) {
            continue;
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e) => {
                log::warn!("metrics: accept failed: {e}");
                continue;
            }
        };
        if let Err(e) = answer(stream, &report) {
            log::debug!("metrics: connection ended: {e}");
        }
    }
}

/// The request head (up to the blank line), or what arrived of it.
fn read_head(stream: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        if head.len() > MAX_HEAD {
            break;
        }
        let n = stream.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    Ok(head)
}

/// What to send for a request line: status, content type, body.
pub(crate) fn respond(
    request_line: &str,
    report: impl FnOnce() -> ArrayReport,
) -> (&'static str, &'static str, String, bool) {
    let mut parts = request_line.split_whitespace();
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return (
            "400 Bad Request",
            "text/plain",
            "bad request\n".into(),
            true,
        );
    };
    if !version.starts_with("HTTP/1.") {
        return (
            "505 HTTP Version Not Supported",
            "text/plain",
            "HTTP/1.x only\n".into(),
            true,
        );
    }
    let head_only = method == "HEAD";
    if method != "GET" && !head_only {
        return (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".into(),
            head_only,
        );
    }
    let path = target.split('?').next().unwrap_or(target);
    match path {
        "/metrics" => (
            "200 OK",
            metrics::CONTENT_TYPE,
            metrics::render(&[report()]),
            head_only,
        ),
        "/" => (
            "200 OK",
            "text/plain",
            "raidfs metrics: GET /metrics\n".into(),
            head_only,
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "not found; metrics are at /metrics\n".into(),
            head_only,
        ),
    }
}

fn answer(mut stream: TcpStream, report: &impl Fn() -> ArrayReport) -> io::Result<()> {
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let head = read_head(&mut stream)?;
    let text = String::from_utf8_lossy(&head);
    let request_line = text.lines().next().unwrap_or("");
    let (status, content_type, body, head_only) = respond(request_line, report);
    let mut reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        reply.push_str("Allow: GET, HEAD\r\n");
    }
    reply.push_str("\r\n");
    stream.write_all(reply.as_bytes())?;
    if !head_only {
        stream.write_all(body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_and_head_of_metrics_are_served() {
        let never = || -> ArrayReport { unreachable!("no report for this request") };
        let status = |line: &str| respond(line, never).0;
        assert_eq!(status("POST /metrics HTTP/1.1"), "405 Method Not Allowed");
        assert_eq!(status("GET /other HTTP/1.1"), "404 Not Found");
        assert_eq!(
            status("GET /metrics HTTP/2.0"),
            "505 HTTP Version Not Supported"
        );
        assert_eq!(status("garbage"), "400 Bad Request");
        let (status, _, body, head_only) = respond("HEAD / HTTP/1.0", never);
        assert_eq!(status, "200 OK");
        assert!(head_only && body.contains("/metrics"));
    }

    #[test]
    fn addresses_are_ip_and_port() {
        assert_eq!(parse_address("127.0.0.1:9464").map(|a| a.port()), Ok(9464));
        assert!(parse_address("[::1]:9464").is_ok());
        for bad in ["localhost:9464", "127.0.0.1", "9464", "", "127.0.0.1:http"] {
            let err = parse_address(bad).expect_err(bad);
            assert!(err.contains("IP:PORT"), "{err}");
        }
    }
}
