//! One delivery attempt over the network: resolve and check the address, connect (with TLS for
//! `https`), post the message, read the status line.
//!
//! The client is small on purpose. It never follows a redirect (it reads only the status: a
//! 3xx is a failure like any other non-2xx), never reuses a connection (each attempt resolves
//! and checks its address afresh, see [`super::address`]), holds at most one message and a
//! few KiB of the answer, and is bounded in time as a whole ([`Connector::post`]'s `timeout`).
//! `https` receivers are verified against the Mozilla roots (`webpki-roots`) and any CA the
//! operator adds (`--webhook-ca-file`), by name or by IP address as the URL names them.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use url::{Host, Position, Url};

use super::address;

/// Most bytes read of an answer before its status line must have ended.
const MAX_STATUS_LINE: usize = 8 * 1024;

/// How deliveries connect: the address rule and the TLS settings, made once.
#[derive(Clone)]
pub struct Connector {
    allow_private: bool,
    tls: tokio_rustls::TlsConnector,
}

impl Connector {
    /// A connector trusting the Mozilla roots and the certificates of `ca_file` (PEM), if any.
    ///
    /// # Errors
    /// `ca_file` cannot be read, holds no certificate, or one that is not a CA.
    pub fn new(allow_private: bool, ca_file: Option<&Path>) -> Result<Connector, String> {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        if let Some(path) = ca_file {
            let shown = path.display();
            let mut added = 0;
            for cert in CertificateDer::pem_file_iter(path)
                .map_err(|e| format!("cannot read the CA file {shown}: {e}"))?
            {
                let cert = cert.map_err(|e| format!("the CA file {shown} is not PEM: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("the CA file {shown} holds a bad certificate: {e}"))?;
                added += 1;
            }
            if added == 0 {
                return Err(format!("the CA file {shown} holds no certificate"));
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| format!("TLS cannot be set up: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        Ok(Connector { allow_private, tls: tokio_rustls::TlsConnector::from(Arc::new(config)) })
    }

    /// Posts `body` to `url` with `headers` (name, value; values are the server's own, never a
    /// caller's text) and returns the receiver's status, or why there is none.
    pub async fn post(
        &self,
        url: &Url,
        headers: &[(&str, String)],
        body: &[u8],
        timeout: Duration,
    ) -> Result<u16, String> {
        match tokio::time::timeout(timeout, self.attempt(url, headers, body)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("no answer within {} s", timeout.as_secs())),
        }
    }

    async fn attempt(
        &self,
        url: &Url,
        headers: &[(&str, String)],
        body: &[u8],
    ) -> Result<u16, String> {
        // Resolved and checked now, for this connection: the address connected to is one
        // that passed the check.
        let addrs = address::resolve(url, self.allow_private).await.map_err(|e| e.to_string())?;
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
        let stream = stream.ok_or(refused)?;
        let _ = stream.set_nodelay(true);
        let request = request_head(url, headers, body.len());
        if url.scheme() != "https" {
            return exchange(stream, &request, body).await;
        }
        let name = match url.host() {
            Some(Host::Domain(d)) => ServerName::try_from(d.to_owned())
                .map_err(|e| format!("`{d}` is not a name TLS can verify: {e}"))?,
            Some(Host::Ipv4(ip)) => ServerName::IpAddress(std::net::IpAddr::V4(ip).into()),
            Some(Host::Ipv6(ip)) => ServerName::IpAddress(std::net::IpAddr::V6(ip).into()),
            None => return Err("the URL names no host".into()),
        };
        let tls = self
            .tls
            .connect(name, stream)
            .await
            .map_err(|e| format!("the TLS handshake failed: {e}"))?;
        exchange(tls, &request, body).await
    }
}

/// The request line and headers of a post of `len` bytes to `url`.
fn request_head(url: &Url, headers: &[(&str, String)], len: usize) -> String {
    let host = match url.port() {
        Some(port) => format!("{}:{port}", url.host_str().unwrap_or_default()),
        None => url.host_str().unwrap_or_default().to_owned(),
    };
    let target = &url[Position::BeforePath..Position::AfterQuery];
    let mut head = format!(
        "POST {target} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
         Content-Length: {len}\r\nConnection: close\r\n"
    );
    for (name, value) in headers {
        head.push_str(name);
        head.push_str(": ");
        head.push_str(value);
        head.push_str("\r\n");
    }
    head.push_str("\r\n");
    head
}

/// Sends the request on `stream` and reads the status of the answer.
async fn exchange(
    mut stream: impl AsyncRead + AsyncWrite + Unpin,
    head: &str,
    body: &[u8],
) -> Result<u16, String> {
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
