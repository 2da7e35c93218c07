//! Mutual TLS on the cluster link (`--cluster-tls-dir`, docs/spec/cluster.md, "Security of
//! the cluster link"): every connection is TLS (rustls) in both directions, and a node talks
//! only to peers whose certificate the cluster's CA signed. The secret's handshake
//! (`channel.rs`) still runs inside it, so a peer needs both.
//!
//! Owns: [`LinkTls`] (the dir's files, read once at start), [`LinkStream`] (a connection,
//! plain or TLS, and its move from one thread's runtime to another's).
//!
//! # The dir
//!
//! - `ca.crt`: the cluster's CA (PEM; several certificates are all trusted).
//! - `node.crt`: this node's certificate, then any intermediates (PEM), signed by the CA. A
//!   node is called at its raft address, so the certificate names that host: an IP address
//!   SAN for `127.0.0.2:9101`, a DNS SAN for `db2.example:9101`.
//! - `node.key`: its private key (PEM: PKCS#8, PKCS#1 or SEC1).

use std::io;
use std::net::IpAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::{TlsAcceptor, TlsConnector};

/// The link's TLS: this node's certificate for both ends of a connection, the CA for both
/// checks.
pub struct LinkTls {
    connector: TlsConnector,
    acceptor: TlsAcceptor,
}

impl std::fmt::Debug for LinkTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkTls")
    }
}

fn invalid(path: &Path, what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{}: {what}", path.display()))
}

impl LinkTls {
    /// Reads `ca.crt`, `node.crt` and `node.key` from `dir` (see the module docs).
    ///
    /// # Errors
    /// A file is missing or unreadable, holds no certificate or key, or rustls refuses them
    /// (a key that does not match the certificate).
    pub fn from_dir(dir: &Path) -> io::Result<LinkTls> {
        let certs = |name: &str| -> io::Result<Vec<CertificateDer<'static>>> {
            let path = dir.join(name);
            let certs = CertificateDer::pem_file_iter(&path)
                .map_err(|e| invalid(&path, e))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| invalid(&path, e))?;
            if certs.is_empty() {
                return Err(invalid(&path, "no certificate in it"));
            }
            Ok(certs)
        };
        let mut roots = rustls::RootCertStore::empty();
        for ca in certs("ca.crt")? {
            roots.add(ca).map_err(|e| invalid(&dir.join("ca.crt"), e))?;
        }
        let roots = Arc::new(roots);
        let chain = certs("node.crt")?;
        let key_path = dir.join("node.key");
        let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|e| invalid(&key_path, e))?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            roots.clone(),
            provider.clone(),
        )
        .build()
        .map_err(|e| invalid(&dir.join("ca.crt"), e))?;
        let server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(chain.clone(), key.clone_key())
            .map_err(|e| invalid(&key_path, e))?;
        let client = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(io::Error::other)?
            .with_root_certificates(roots)
            .with_client_auth_cert(chain, key)
            .map_err(|e| invalid(&key_path, e))?;
        Ok(LinkTls {
            connector: TlsConnector::from(Arc::new(client)),
            acceptor: TlsAcceptor::from(Arc::new(server)),
        })
    }

    /// The client's side over `stream`, to the peer called at `addr` (`HOST:PORT`): its
    /// certificate must name that host and chain to the CA.
    pub(crate) async fn connect(&self, addr: &str, stream: TcpStream) -> io::Result<LinkStream> {
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_owned())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        };
        let tls = self.connector.connect(name, Socket::Registered(stream)).await?;
        Ok(LinkStream::Client(Box::new(tls)))
    }

    /// The server's side over `stream`: the peer's certificate must chain to the CA.
    pub(crate) async fn accept(&self, stream: TcpStream) -> io::Result<LinkStream> {
        let tls = self.acceptor.accept(Socket::Registered(stream)).await?;
        Ok(LinkStream::Server(Box::new(tls)))
    }
}

/// One connection of the link: plain TCP, or TLS from either side.
pub enum LinkStream {
    /// Without `--cluster-tls-dir`.
    Plain(Socket),
    /// A connection this node opened.
    Client(Box<tokio_rustls::client::TlsStream<Socket>>),
    /// A connection a peer opened.
    Server(Box<tokio_rustls::server::TlsStream<Socket>>),
}

impl LinkStream {
    /// A plain connection over `stream`.
    pub(crate) fn plain(stream: TcpStream) -> Self {
        LinkStream::Plain(Socket::Registered(stream))
    }

    fn socket(&mut self) -> &mut Socket {
        match self {
            LinkStream::Plain(s) => s,
            LinkStream::Client(s) => s.get_mut().0,
            LinkStream::Server(s) => s.get_mut().0,
        }
    }

    /// Takes the connection off the runtime of the thread it is used on, to be
    /// [`attach`](LinkStream::attach)ed on another thread's. TLS keeps its session state:
    /// only the socket moves.
    ///
    /// # Errors
    /// The socket's deregistration failed; the stream is unusable then.
    pub(crate) fn detach(&mut self) -> io::Result<()> {
        self.socket().detach()
    }

    /// Registers a [`detach`](LinkStream::detach)ed connection with the runtime of the
    /// calling thread, where it is used from then on.
    ///
    /// # Errors
    /// No runtime runs on this thread, or the registration failed.
    pub(crate) fn attach(&mut self) -> io::Result<()> {
        self.socket().attach()
    }
}

/// A link connection's socket: registered with the runtime of the thread that uses it, or on
/// its way to another (a forwarding connection the link thread accepted and hands to the
/// thread that runs forwarded requests: readiness then wakes the thread that does the work,
/// not the link's thread and then that one).
pub enum Socket {
    /// In use on this thread's runtime.
    Registered(TcpStream),
    /// Between runtimes: every read and write fails until it is attached.
    Detached(std::net::TcpStream),
    /// A detach or attach failed half way.
    Lost,
}

impl Socket {
    fn detach(&mut self) -> io::Result<()> {
        match std::mem::replace(self, Socket::Lost) {
            Socket::Registered(s) => *self = Socket::Detached(s.into_std()?),
            other => *self = other,
        }
        Ok(())
    }

    fn attach(&mut self) -> io::Result<()> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(io::Error::other("no runtime on this thread to attach a connection to"));
        }
        match std::mem::replace(self, Socket::Lost) {
            Socket::Detached(s) => *self = Socket::Registered(TcpStream::from_std(s)?),
            other => *self = other,
        }
        Ok(())
    }

    fn registered(&mut self) -> io::Result<Pin<&mut TcpStream>> {
        match self {
            Socket::Registered(s) => Ok(Pin::new(s)),
            _ => Err(io::Error::new(io::ErrorKind::NotConnected, "a connection between threads")),
        }
    }
}

impl AsyncRead for Socket {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => s.poll_read(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }
}

impl AsyncWrite for Socket {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().registered() {
            Ok(s) => s.poll_write(cx, buf),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => s.poll_flush(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut().registered() {
            Ok(s) => s.poll_shutdown(cx),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut().registered() {
            Ok(s) => s.poll_write_vectored(cx, bufs),
            Err(e) => Poll::Ready(Err(e)),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Socket::Registered(s) => s.is_write_vectored(),
            _ => false,
        }
    }
}

impl AsyncRead for LinkStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            LinkStream::Client(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
            LinkStream::Server(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for LinkStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            LinkStream::Client(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            LinkStream::Server(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_flush(cx),
            LinkStream::Client(s) => Pin::new(s.as_mut()).poll_flush(cx),
            LinkStream::Server(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            LinkStream::Client(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            LinkStream::Server(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            LinkStream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            LinkStream::Client(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
            LinkStream::Server(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            LinkStream::Plain(s) => s.is_write_vectored(),
            LinkStream::Client(s) => s.is_write_vectored(),
            LinkStream::Server(s) => s.is_write_vectored(),
        }
    }
}
