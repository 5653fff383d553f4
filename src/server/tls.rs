//! TLS for both listeners (rustls, ring provider): the server's certificate chain and key
//! from PEM files, and optionally a client CA for mutual TLS.
//!
//! One rustls configuration per listener (ALPN `h2` for gRPC, `http/1.1` for HTTP). The
//! handshakes run in their own tasks, off the accept loop, so a slow or silent client delays
//! nobody else; a connection whose handshake fails or takes longer than
//! [`HANDSHAKE_TIMEOUT`] is dropped and logged at debug. With a client CA, gRPC requires a
//! client certificate signed by it; HTTP verifies one when offered but does not require it,
//! so that the kubelet's HTTPS probes (which cannot present one) keep working (HTTP serves
//! only reads: `/metrics`, guarded by the token with `--auth-reads`, and the probes).

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{self, RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Longest a client may take to finish its TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes finished but not yet taken by the server, per listener.
const ACCEPTED_BACKLOG: usize = 64;

/// Where the server's TLS material lives (PEM files, typically a mounted Secret).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    /// The certificate chain, leaf first.
    pub cert: PathBuf,
    /// The private key (PKCS#8, PKCS#1 or SEC1).
    pub key: PathBuf,
    /// CA whose signed client certificates are required on gRPC (mutual TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why the TLS material could not be loaded; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file is missing, unreadable or holds nothing usable.
    #[error("{path}: {reason}")]
    File {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The key does not belong to the certificate (or rustls cannot tell).
    #[error("{key} and {cert}: certificate and key do not match: {reason}")]
    Mismatch {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// What rustls said.
        reason: String,
    },
    /// rustls refused a configuration that no file is to blame for.
    #[error("TLS configuration: {0}")]
    Config(String),
}

impl TlsError {
    /// The error of rustls refusing the certificate chain in `cert` with the key in `key`,
    /// naming the file to blame: an undecodable certificate names the certificate, keys
    /// that disagree name both, anything else is the key's (rustls parses it first).
    fn certified_key(err: &rustls::Error, cert: &Path, key: &Path) -> Self {
        match err {
            rustls::Error::InvalidCertificate(_) => TlsError::File {
                path: cert.to_owned(),
                reason: format!("not a usable certificate: {err}"),
            },
            rustls::Error::InconsistentKeys(_) => TlsError::Mismatch {
                cert: cert.to_owned(),
                key: key.to_owned(),
                reason: err.to_string(),
            },
            _ => TlsError::File {
                path: key.to_owned(),
                reason: format!("not a usable private key: {err}"),
            },
        }
    }
}

/// The rustls acceptors of both listeners.
#[derive(Clone)]
pub struct TlsAcceptors {
    /// For gRPC: ALPN h2, the client certificate required when a client CA is set.
    pub grpc: TlsAcceptor,
    /// For HTTP: ALPN http/1.1, a client certificate verified when offered.
    pub http: TlsAcceptor,
}

impl std::fmt::Debug for TlsAcceptors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TlsAcceptors")
    }
}

impl TlsAcceptors {
    /// Loads the files and builds both configurations.
    pub fn load(files: &TlsFiles) -> Result<Self, TlsError> {
        let certs = read_certs(&files.cert)?;
        let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|err| TlsError::File {
            path: files.key.clone(),
            reason: format!("no usable private key: {err}"),
        })?;
        let roots = match &files.client_ca {
            Some(path) => {
                let mut roots = RootCertStore::empty();
                for cert in read_certs(path)? {
                    roots.add(cert).map_err(|err| TlsError::File {
                        path: path.clone(),
                        reason: format!("not a usable CA certificate: {err}"),
                    })?;
                }
                Some(Arc::new(roots))
            }
            None => None,
        };
        let grpc = config(files, &certs, &key, roots.clone(), true, b"h2")?;
        let http = config(files, &certs, &key, roots, false, b"http/1.1")?;
        Ok(Self {
            grpc: TlsAcceptor::from(Arc::new(grpc)),
            http: TlsAcceptor::from(Arc::new(http)),
        })
    }
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let file_error = |reason: String| TlsError::File {
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| file_error(err.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| file_error(format!("file_error PEM: {err}")))?;
    if certs.is_empty() {
        return Err(file_error("no CERTIFICATE block".to_owned()));
    }
    Ok(certs)
}

fn config(
    files: &TlsFiles,
    certs: &[CertificateDer<'static>],
    key: &PrivateKeyDer<'static>,
    client_roots: Option<Arc<RootCertStore>>,
    require_client_cert: bool,
    alpn: &[u8],
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|err| TlsError::Config(err.to_string()))?;
    let builder = match client_roots {
        Some(roots) => {
            let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider);
            let verifier = if require_client_cert {
                verifier
            } else {
                verifier.allow_unauthenticated()
            };
            let verifier = verifier.build().map_err(|err| match &files.client_ca {
                Some(path) => TlsError::File {
                    path: path.clone(),
                    reason: format!("not a usable client CA: {err}"),
                },
                None => TlsError::Config(format!("client CA: {err}")),
            })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut config = builder
        .with_single_cert(certs.to_vec(), key.clone_key())
        .map_err(|err| TlsError::certified_key(&err, &files.cert, &files.key))?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// A client-side TLS connector (ALPN h2) trusting the CA certificates in `ca`, presenting
/// the certificate chain and key of `identity` when given (mutual TLS).
pub fn client_connector(
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<tokio_rustls::TlsConnector, TlsError> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots.add(cert).map_err(|err| TlsError::File {
            path: ca.to_owned(),
            reason: format!("not a usable CA certificate: {err}"),
        })?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|err| TlsError::Config(err.to_string()))?
    .with_root_certificates(roots);
    let mut config = match identity {
        Some((cert, key)) => {
            let chain = read_certs(cert)?;
            let key_der = PrivateKeyDer::from_pem_file(key).map_err(|err| TlsError::File {
                path: key.to_owned(),
                reason: format!("no usable private key: {err}"),
            })?;
            builder
                .with_client_auth_cert(chain, key_der)
                .map_err(|err| TlsError::certified_key(&err, cert, key))?
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// Accepts TCP connections on `listener` and completes their handshakes in their own tasks;
/// the finished TLS streams come out of the returned channel. Stops when the receiver is
/// dropped.
pub fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (sender, receiver) = mpsc::channel(ACCEPTED_BACKLOG);
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = sender.closed() => return,
            };
            let (tcp, peer) = match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(%err, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // TCP_NODELAY: without it small responses wait for delayed ACKs (~40 ms).
            let _ = tcp.set_nodelay(true);
            let acceptor = acceptor.clone();
            let sender = sender.clone();
            tokio::spawn(async move {
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                    Ok(Ok(stream)) => {
                        // The server stopped taking connections: dropping this one is right.
                        let _ = sender.send((stream, peer)).await;
                    }
                    Ok(Err(err)) => tracing::debug!(%peer, %err, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    receiver
}

/// The HTTP listener over TLS, for `axum::serve`.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: SocketAddr,
}

impl std::fmt::Debug for TlsListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsListener")
            .field("local", &self.local)
            .finish()
    }
}

impl TlsListener {
    /// TLS over `listener` with `acceptor`.
    pub fn new(listener: TcpListener, acceptor: TlsAcceptor) -> io::Result<Self> {
        let local = listener.local_addr()?;
        Ok(Self {
            accepted: accept(listener, acceptor),
            local,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accept task ends only once this receiver is gone, so this cannot happen
            // while the listener lives; wait forever rather than invent a connection.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local)
    }
}

/// The gRPC listener over TLS, for tonic's `serve_with_incoming_shutdown`.
pub fn grpc_incoming(
    listener: TcpListener,
    acceptor: TlsAcceptor,
) -> impl tokio_stream::Stream<Item = Result<GrpcTlsStream, io::Error>> {
    use tokio_stream::StreamExt;
    tokio_stream::wrappers::ReceiverStream::new(accept(listener, acceptor))
        .map(|(stream, _peer)| Ok(GrpcTlsStream(stream)))
}

/// One TLS connection of the gRPC listener, carrying its TCP peer addresses to tonic.
pub struct GrpcTlsStream(TlsStream<TcpStream>);

impl std::fmt::Debug for GrpcTlsStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GrpcTlsStream")
    }
}

impl Connected for GrpcTlsStream {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.0.get_ref().0.connect_info()
    }
}

impl AsyncRead for GrpcTlsStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for GrpcTlsStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}
