//! NBD member URIs, in libnbd's syntax: `nbd://HOST[:PORT]/EXPORT` (TCP,
//! port 10809 by default) and `nbd+unix:///EXPORT?socket=PATH` (a Unix
//! socket). The export name is the percent-decoded path after the first
//! `/` and may be empty. TLS (`nbds://`) is refused: raidfs does not speak
//! it. A member given as such a URI is never treated as a file path.

use std::fmt;
use std::path::{Path, PathBuf};

/// The default NBD port (IANA).
pub const DEFAULT_PORT: u16 = 10809;

/// Where an NBD server listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

/// A parsed member URI.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NbdUri {
    /// The URI as given: the member's name in messages and the array.
    pub text: String,
    pub endpoint: Endpoint,
    pub export: String,
}

impl fmt::Display for NbdUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// Whether a member argument is an NBD URI rather than a path (its
/// scheme is one of libnbd's; `nbds` and friends count, so that they are
/// refused with a reason rather than created as files).
pub fn is_uri(member: &Path) -> bool {
    let Some(text) = member.to_str() else {
        return false;
    };
    [
        "nbd://",
        "nbd+unix://",
        "nbds://",
        "nbds+unix://",
        "nbd+vsock://",
    ]
    .iter()
    .any(|scheme| text.starts_with(scheme))
}

impl NbdUri {
    pub fn parse(text: &str) -> Result<NbdUri, String> {
        let bad = |why: &str| format!("{text}: {why}");
        let (unix, rest) = if let Some(rest) = text.strip_prefix("nbd://") {
            (false, rest)
        } else if let Some(rest) = text.strip_prefix("nbd+unix://") {
            (true, rest)
        } else if text.starts_with("nbds") {
            return Err(bad(
                "NBD over TLS (nbds) is not supported; use nbd:// on a trusted network or a tunnel",
            ));
        } else {
            return Err(bad(
                "not an NBD URI (nbd://HOST[:PORT]/EXPORT or nbd+unix:///EXPORT?socket=PATH)",
            ));
        };
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        if rest.contains('#') || query.is_some_and(|q| q.contains('#')) {
            return Err(bad("a fragment (#) has no meaning here"));
        }
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at + 1..]),
            None => (rest, ""),
        };
        let export = decode(path).ok_or_else(|| bad("bad percent-encoding in the export name"))?;
        let mut socket = None;
        for pair in query
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|p| !p.is_empty())
        {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "socket" if unix => {
                    let value =
                        decode(value).ok_or_else(|| bad("bad percent-encoding in socket="))?;
                    socket = Some(PathBuf::from(value));
                }
                _ => return Err(bad(&format!("unsupported query parameter {key:?}"))),
            }
        }
        let endpoint = if unix {
            if !authority.is_empty() {
                return Err(bad(
                    "nbd+unix:// takes no host (nbd+unix:///EXPORT?socket=PATH)",
                ));
            }
            let socket = socket.ok_or_else(|| bad("nbd+unix:// needs ?socket=PATH"))?;
            if !socket.is_absolute() {
                return Err(bad(
                    "the socket path must be absolute (the daemon runs in /)",
                ));
            }
            Endpoint::Unix(socket)
        } else {
            let authority = match authority.rsplit_once('@') {
                Some(_) => return Err(bad("user names are not supported")),
                None => authority,
            };
            let (host, port) = split_host_port(authority).ok_or_else(|| bad("bad host or port"))?;
            if host.is_empty() {
                return Err(bad("no host (nbd://HOST[:PORT]/EXPORT)"));
            }
            Endpoint::Tcp { host, port }
        };
        Ok(NbdUri {
            text: text.to_string(),
            endpoint,
            export,
        })
    }
}

/// `host`, `host:port`, `[v6]` or `[v6]:port`.
fn split_host_port(authority: &str) -> Option<(String, u16)> {
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after {
            "" => DEFAULT_PORT,
            p => p.strip_prefix(':')?.parse().ok()?,
        };
        return Some((host.to_string(), port));
    }
    match authority.split_once(':') {
        Some((host, port)) => Some((host.to_string(), port.parse().ok()?)),
        None => Some((authority.to_string(), DEFAULT_PORT)),
    }
}

/// Percent-decoding; None for a malformed escape or a result that is not UTF-8.
fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_uris() {
        let u = NbdUri::parse("nbd://example.com/disk0").expect("parses");
        assert_eq!(
            u.endpoint,
            Endpoint::Tcp {
                host: "example.com".into(),
                port: DEFAULT_PORT
            }
        );
        assert_eq!(u.export, "disk0");
        let u = NbdUri::parse("nbd://127.0.0.1:10900").expect("parses");
        assert_eq!(
            u.endpoint,
            Endpoint::Tcp {
                host: "127.0.0.1".into(),
                port: 10900
            }
        );
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:7/a%20b").expect("parses");
        assert_eq!(
            u.endpoint,
            Endpoint::Tcp {
                host: "::1".into(),
                port: 7
            }
        );
        assert_eq!(u.export, "a b");
        assert_eq!(u.to_string(), "nbd://[::1]:7/a%20b");
    }

    #[test]
    fn unix_uris() {
        let u = NbdUri::parse("nbd+unix:///?socket=/run/nbd.sock").expect("parses");
        assert_eq!(u.endpoint, Endpoint::Unix("/run/nbd.sock".into()));
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd+unix:///x?socket=%2Ftmp%2Fs").expect("parses");
        assert_eq!(u.endpoint, Endpoint::Unix("/tmp/s".into()));
        assert_eq!(u.export, "x");
    }

    #[test]
    fn refusals_say_why() {
        for (uri, why) in [
            ("nbds://h/e", "TLS"),
            ("nbd+unix:///e", "socket=PATH"),
            ("nbd+unix:///e?socket=rel", "absolute"),
            ("nbd://h:notaport/e", "port"),
            ("nbd:///e", "no host"),
            ("nbd://h/e?tls=on", "unsupported"),
            ("nbd://u@h/e", "user"),
            ("nbd://h/%zz", "percent"),
        ] {
            let err = NbdUri::parse(uri).expect_err(uri);
            assert!(err.contains(why), "{uri}: {err}");
        }
    }

    #[test]
    fn uris_are_told_from_paths() {
        assert!(is_uri(Path::new("nbd://h/e")));
        assert!(is_uri(Path::new("nbd+unix:///e?socket=/s")));
        assert!(is_uri(Path::new("nbds://h/e")));
        assert!(!is_uri(Path::new("nbd/disk.img")));
        assert!(!is_uri(Path::new("/srv/nbd:a.img")));
    }
}
