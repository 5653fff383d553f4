//! One pod's `/metrics` over HTTP/1.1: a kept-alive hyper connection per pod (reopened after
//! any failure), a whole-scrape timeout and a body size limit. Knows nothing of the page's
//! content (see `text`).

use std::time::Duration;

use http_body_util::{BodyExt, Empty, Limited};
use hyper::Uri;
use hyper::body::Bytes;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::header::HeaderValue;
use hyper_util::rt::TokioIo;
use thiserror::Error;
use tokio::net::TcpStream;

/// Largest `/metrics` body read (a vLLM page is tens of kB).
pub const MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Why a scrape failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum ScrapeError {
    /// No answer within the timeout.
    #[error("GET /metrics timed out after {0} ms")]
    Timeout(u128),
    /// The connection could not be opened or broke.
    #[error("GET /metrics: {0}")]
    Connection(String),
    /// The pod answered with an error status.
    #[error("GET /metrics answered HTTP {0}")]
    Status(u16),
    /// The body is too large, truncated or not UTF-8.
    #[error("GET /metrics body: {0}")]
    Body(String),
}

/// A scraper for one pod (one scrape in flight: `scrape` takes `&mut self`).
#[derive(Debug)]
pub struct Scraper {
    address: String,
    /// The request's target and `Host` header, parsed once (a scrape clones them: a
    /// reference count, not a parse and a copy each time); why not, if they do not parse.
    target: Result<(Uri, HeaderValue), String>,
    timeout: Duration,
    connection: Option<SendRequest<Empty<Bytes>>>,
}

impl Scraper {
    /// A scraper of `http://{address}{path}`.
    pub fn new(address: String, path: String, timeout: Duration) -> Self {
        let target = path
            .parse::<Uri>()
            .map_err(|err| format!("path {path:?}: {err}"))
            .and_then(|uri| {
                let host = HeaderValue::from_str(&address)
                    .map_err(|err| format!("address {address:?}: {err}"))?;
                Ok((uri, host))
            });
        Self {
            address,
            target,
            timeout,
            connection: None,
        }
    }

    /// Fetches the page's body (its text: [`page_text`]); on any failure the connection is
    /// dropped and reopened next time.
    pub async fn scrape(&mut self) -> Result<Bytes, ScrapeError> {
        let result = match tokio::time::timeout(self.timeout, self.fetch()).await {
            Ok(result) => result,
            Err(_) => Err(ScrapeError::Timeout(self.timeout.as_millis())),
        };
        if result.is_err() {
            self.connection = None;
        }
        result
    }

    async fn connect(&self) -> Result<SendRequest<Empty<Bytes>>, ScrapeError> {
        let stream = TcpStream::connect(&self.address)
            .await
            .map_err(|err| ScrapeError::Connection(err.to_string()))?;
        let _ = stream.set_nodelay(true);
        let (sender, connection) = http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|err| ScrapeError::Connection(err.to_string()))?;
        // The connection task ends when the sender is dropped or the peer closes.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        Ok(sender)
    }

    async fn fetch(&mut self) -> Result<Bytes, ScrapeError> {
        if self.connection.as_ref().is_some_and(SendRequest::is_closed) {
            self.connection = None;
        }
        let sender = match &mut self.connection {
            Some(sender) => sender,
            None => self.connection.insert(self.connect().await?),
        };
        sender
            .ready()
            .await
            .map_err(|err| ScrapeError::Connection(err.to_string()))?;
        let (uri, host) = self
            .target
            .as_ref()
            .map_err(|err| ScrapeError::Connection(err.clone()))?;
        let request = hyper::Request::get(uri.clone())
            .header(hyper::header::HOST, host.clone())
            // The text format vLLM serves (a static value: no copy).
            .header(
                hyper::header::ACCEPT,
                HeaderValue::from_static("text/plain;version=0.0.4"),
            )
            .body(Empty::<Bytes>::new())
            .map_err(|err| ScrapeError::Connection(err.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|err| ScrapeError::Connection(err.to_string()))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_BODY_BYTES)
            .collect()
            .await
            .map_err(|err| ScrapeError::Body(err.to_string()))?
            .to_bytes();
        if !status.is_success() {
            return Err(ScrapeError::Status(status.as_u16()));
        }
        Ok(body)
    }
}

/// The text of a fetched body (read in place: a page is tens of kB, scraped 20 times a
/// second per pod, and is not copied into a `String`). Checked with `simdutf8`'s vectorised
/// validator (std's check was 6 % of a scrape); a bad page is checked again by std for the
/// error's position.
pub fn page_text(body: &Bytes) -> Result<&str, ScrapeError> {
    simdutf8::basic::from_utf8(body)
        .or_else(|_| std::str::from_utf8(body).map_err(|err| ScrapeError::Body(err.to_string())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_read_in_place_and_bad_utf8_is_refused_with_its_position() {
        let page = Bytes::from_static("vllm:num_requests_waiting 3 # é\n".as_bytes());
        assert_eq!(page_text(&page).unwrap().as_ptr(), page.as_ptr());
        for bytes in [&b"ok 1\n\xff\xfe"[..], &b"ok 1\n\xe2\x82"[..]] {
            match page_text(&Bytes::copy_from_slice(bytes)) {
                Err(ScrapeError::Body(message)) => {
                    assert!(
                        message.contains("utf-8") && message.contains("index 5"),
                        "{message}"
                    )
                }
                other => panic!("expected a body error, got {other:?}"),
            }
        }
    }
}
