//! A small blocking client of the Twin service, for `ditto predict`: domain question in,
//! domain answer out, so the command line never sees protobuf or tokio.

use std::time::Duration;

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
    /// The server answered with an error.
    #[error("{code}: {message}")]
    Status {
        /// The gRPC code's name.
        code: String,
        /// The server's message.
        message: String,
    },
}

fn endpoint_uri(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
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
) -> Result<RoutingAnswer, ClientError> {
    let endpoint = Endpoint::from_shared(endpoint_uri(addr))
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
        let channel = endpoint
            .connect()
            .await
            .map_err(|err| ClientError::Connect {
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
