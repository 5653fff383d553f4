//! A small blocking client of the Twin service, for `ditto predict`: domain question in,
//! domain answer out, so the command line never sees protobuf or tokio. Optionally over TLS
//! (rustls through tonic's custom-connector hook) and with a bearer token.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::rustls::pki_types::ServerName;

use thiserror::Error;
use tonic::transport::Endpoint;

use super::auth::BearerToken;
use super::convert::question::{routing_answer_from_proto, routing_to_proto};
use super::proto::twin_client::TwinClient;
use crate::twin::question::{RoutingAnswer, RoutingQuestion};

/// Why a client call failed.
#[derive(Debug, Error)]
pub enum ClientError {
    /// The address is not a valid endpoint.
    #[error("bad address {addr:?}: {reason}")]
    BadAddress {
        /// The address.
        addr: String,
        /// What is wrong.
        reason: String,
    },
    /// The runtime could not be built.
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// The server could not be reached.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// The address.
        addr: String,
        /// The transport's error.
        reason: String,
    },
    /// The TLS files could not be loaded.
    #[error("TLS: {0}")]
    Tls(#[from] super::tls::TlsError),
    /// The server answered with an error.
    #[error("{code}: {message}")]
    Status {
        /// The gRPC code's name.
        code: String,
        /// The server's message.
        message: String,
    },
}

fn endpoint_uri(addr: &str, tls: bool) -> String {
    let bare = addr
        .strip_prefix("http://")
        .or_else(|| addr.strip_prefix("https://"));
    match bare {
        // TLS is this client's connector's job: tonic's own (not built) would refuse https.
        Some(rest) if tls => format!("http://{rest}"),
        Some(_) => addr.to_owned(),
        None => format!("http://{addr}"),
    }
}

/// TLS settings of the client: the CA to trust, and a certificate and key to present to a
/// server requiring mutual TLS.
#[derive(Clone, Debug, Default)]
pub struct ClientTls {
    /// PEM CA certificates the server's certificate must chain to.
    pub ca: PathBuf,
    /// PEM certificate chain and private key of this client, for mutual TLS.
    pub identity: Option<(PathBuf, PathBuf)>,
}

/// Connects TCP, then TLS to the URI's host (its DNS name or IP must be in the server's
/// certificate).
#[derive(Clone)]
struct TlsConnect(TlsConnector);

impl tower_service::Service<http::Uri> for TlsConnect {
    type Response = TokioIo<tokio_rustls::client::TlsStream<TcpStream>>;
    type Error = std::io::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let connector = self.0.clone();
        Box::pin(async move {
            let invalid =
                |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, what.to_owned());
            let host = uri
                .host()
                .ok_or_else(|| invalid("the address has no host"))?;
            let host = host
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = ServerName::try_from(host.clone())
                .map_err(|_| invalid("the host is not a DNS name or IP address"))?;
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = connector.connect(name, tcp).await?;
            Ok(TokioIo::new(tls))
        })
    }
}

/// Asks the server at `addr` (`host:port` or a URI) one routing question on snapshot
/// `generation` (0: latest), waiting at most `timeout` (sent as grpc-timeout too), with the
/// bearer `token` if given (a server requiring it on reads refuses the call without).
pub fn predict_routing(
    addr: &str,
    question: &RoutingQuestion,
    generation: u64,
    timeout: Duration,
    token: Option<&BearerToken>,
    tls: Option<&ClientTls>,
) -> Result<RoutingAnswer, ClientError> {
    let connector = tls
        .map(|tls| {
            let identity = tls
                .identity
                .as_ref()
                .map(|(cert, key)| (cert.as_path(), key.as_path()));
            super::tls::client_connector(&tls.ca, identity).map(TlsConnect)
        })
        .transpose()?;
    let endpoint = Endpoint::from_shared(endpoint_uri(addr, connector.is_some()))
        .map_err(|err| ClientError::BadAddress {
            addr: addr.to_owned(),
            reason: err.to_string(),
        })?
        .connect_timeout(timeout)
        .timeout(timeout);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    runtime.block_on(async {
        let connected = match connector {
            Some(connector) => endpoint.connect_with_connector(connector).await,
            None => endpoint.connect().await,
        };
        let channel = connected.map_err(|err| ClientError::Connect {
            addr: addr.to_owned(),
            reason: format!("{err} ({:?})", std::error::Error::source(&err)),
        })?;
        let mut client = TwinClient::new(channel);
        let mut request =
            tonic::Request::new(routing_to_proto(question, generation, "ditto-predict"));
        request.set_timeout(timeout);
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", token.client_metadata());
        }
        let response =
            client
                .predict_routing(request)
                .await
                .map_err(|status| ClientError::Status {
                    code: format!("{:?}", status.code()),
                    message: status.message().to_owned(),
                })?;
        Ok(routing_answer_from_proto(response.get_ref()))
    })
}
