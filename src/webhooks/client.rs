//! One delivery attempt over the network: resolve and check the address, connect, post the
//! message, read the status line.
//!
//! The client is small on purpose. It never follows a redirect (it reads only the status: a
//! 3xx is a failure like any other non-2xx), never reuses a connection (each attempt resolves
//! and checks its address afresh, see [`super::address`]), holds at most one message and a
//! few KiB of the answer, and is bounded in time as a whole ([`post`]'s `timeout`). Receivers
//! are plain `http`; `https` needs a TLS stack this build does not carry, so such an attempt
//! fails with a sentence saying so.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use url::{Position, Url};

use super::address;

/// Most bytes read of an answer before its status line must have ended.
const MAX_STATUS_LINE: usize = 8 * 1024;

/// Posts `body` to `url` with `headers` (name, value; values are the server's own, never a
/// caller's text) and returns the receiver's status, or why there is none.
pub async fn post(
    url: &Url,
    headers: &[(&str, String)],
    body: &[u8],
    allow_private: bool,
    timeout: Duration,
) -> Result<u16, String> {
    match tokio::time::timeout(timeout, attempt(url, headers, body, allow_private)).await {
        Ok(outcome) => outcome,
        Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
    }
}

async fn attempt(
    url: &Url,
    headers: &[(&str, String)],
    body: &[u8],
    allow_private: bool,
) -> Result<u16, String> {
    if url.scheme() != "http" {
        return Err("https receivers need TLS, which this build does not include".into());
    }
    // Resolved and checked now, for this connection: the address connected to is one that
    // passed the check.
    let addrs = address::resolve(url, allow_private).await.map_err(|e| e.to_string())?;
    let mut refused = String::new();
    let mut stream = None;
    for addr in addrs {
        match TcpStream::connect(addr).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => refused = format!("cannot connect to {addr}: {e}"),
        }
    }
    let mut stream = stream.ok_or(refused)?;
    let _ = stream.set_nodelay(true);
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    };
    let target = &url[Position::BeforePath..Position::AfterQuery];
    let mut head = format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    let io = |e: std::io::Error| format!("the connection failed: {e}");
    stream.write_all(head.as_bytes()).await.map_err(io)?;
    stream.write_all(body).await.map_err(io)?;
    stream.flush().await.map_err(io)?;
    let mut answer = Vec::with_capacity(256);
    let mut buf = [0u8; 1024];
    loop {
        if let Some(end) = answer.windows(2).position(|w| w == b"\r\n") {
            return status_of(&answer[..end]);
        }
        if answer.len() >= MAX_STATUS_LINE {
            return Err("the answer's status line is too long".into());
        }
        let n = stream.read(&mut buf).await.map_err(io)?;
        if n == 0 {
            return Err("the receiver closed the connection without an answer".into());
        }
        answer.extend_from_slice(&buf[..n]);
    }
}

/// The status of an HTTP/1.x status line.
fn status_of(line: &[u8]) -> Result<u16, String> {
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split(' ');
    let version = parts.next().unwrap_or_default();
    let status = parts.next().and_then(|s| s.parse::<u16>().ok());
    match status {
        Some(status) if version.starts_with("HTTP/1.") && (100..600).contains(&status) => {
            Ok(status)
        }
        _ => Err("the answer is not HTTP/1.x".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_http_status_line_gives_a_status() {
        assert_eq!(status_of(b"HTTP/1.1 204 No Content"), Ok(204));
        assert_eq!(status_of(b"HTTP/1.0 302 Found"), Ok(302));
        assert!(status_of(b"SSH-2.0-OpenSSH").is_err());
        assert!(status_of(b"HTTP/1.1 99999 Odd").is_err());
    }
}
