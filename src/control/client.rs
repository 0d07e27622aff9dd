//! The client side of a control socket: connect, send a request line, read
//! the response line.

use super::protocol::{Request, Response};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("cannot reach the daemon at {path}: {source}")]
    Connect { path: PathBuf, source: io::Error },
    #[error("talking to the daemon: {0}")]
    Io(#[from] io::Error),
    #[error("the daemon closed the connection (it may have exited)")]
    Closed,
    #[error("unreadable answer from the daemon: {0}")]
    Protocol(String),
}

pub struct ControlClient {
    writer: UnixStream,
    reader: BufReader<UnixStream>,
}

impl ControlClient {
    pub fn connect(socket: &Path) -> Result<ControlClient, ControlError> {
        let stream = UnixStream::connect(socket).map_err(|source| ControlError::Connect {
            path: socket.to_path_buf(),
            source,
        })?;
        let writer = stream.try_clone()?;
        Ok(ControlClient {
            writer,
            reader: BufReader::new(stream),
        })
    }

    /// Send `request` and wait for its response.
    pub fn request(&mut self, request: &Request) -> Result<Response, ControlError> {
        let mut line =
            serde_json::to_vec(request).map_err(|e| ControlError::Protocol(e.to_string()))?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        let mut answer = String::new();
        if self.reader.read_line(&mut answer)? == 0 {
            return Err(ControlError::Closed);
        }
        serde_json::from_str(&answer).map_err(|e| ControlError::Protocol(e.to_string()))
    }
}
