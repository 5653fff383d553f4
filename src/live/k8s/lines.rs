//! Bounded reading of the API server's answers: a watch stream split into JSON lines, none
//! longer than a cap, and a list page read whole up to a cap, both given up when no byte
//! arrives for an idle time or the answer outlives its deadline (a server that hangs
//! mid-line, or trickles bytes forever, cannot hold discovery blind or memory unbounded).

use std::time::Duration;

use http_body::Body;
use http_body_util::BodyExt;
use thiserror::Error;
use tokio::time::Instant;

/// Why reading an answer stopped.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ReadError {
    /// A watch line grew past the cap without a newline.
    #[error("a watch line passed {0} bytes without a newline")]
    LineTooLong(usize),
    /// A list page, or an object, grew past the cap.
    #[error("an answer (a list page or an object) passed {0} bytes")]
    BodyTooLarge(usize),
    /// No byte arrived for this long.
    #[error("no byte from the API server for {0:?}")]
    Idle(Duration),
    /// The answer was still going at its deadline.
    #[error("the API server's answer outlived its deadline (the watch timeout plus a margin)")]
    Deadline,
    /// The connection failed.
    #[error("reading the API server's answer: {0}")]
    Body(String),
}

/// How long to wait for the next frame: `idle`, or what is left before `deadline`.
async fn next_frame<B>(
    body: &mut B,
    idle: Duration,
    deadline: Instant,
) -> Result<Option<bytes::Bytes>, ReadError>
where
    B: Body<Data = bytes::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let now = Instant::now();
    if now >= deadline {
        return Err(ReadError::Deadline);
    }
    let wait = idle.min(deadline - now);
    loop {
        match tokio::time::timeout(wait, body.frame()).await {
            Err(_) if Instant::now() >= deadline => return Err(ReadError::Deadline),
            Err(_) => return Err(ReadError::Idle(idle)),
            Ok(None) => return Ok(None),
            Ok(Some(Err(err))) => return Err(ReadError::Body(err.to_string())),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
                // Trailers: not data; keep reading.
            }
        }
    }
}

/// A watch stream's lines, each at most `max` bytes.
pub struct Lines<B> {
    body: B,
    buf: Vec<u8>,
    /// Bytes at the front of `buf` already searched for a newline: a long line arriving in
    /// small frames is scanned once, not once per frame.
    scanned: usize,
    max: usize,
    idle: Duration,
    deadline: Instant,
    ended: bool,
}

impl<B> std::fmt::Debug for Lines<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lines")
            .field("buffered", &self.buf.len())
            .field("max", &self.max)
            .field("idle", &self.idle)
            .field("ended", &self.ended)
            .finish()
    }
}

impl<B> Lines<B>
where
    B: Body<Data = bytes::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    /// Reads `body` as lines of at most `max` bytes, giving up after `idle` without a byte or
    /// at `deadline`.
    pub fn new(body: B, max: usize, idle: Duration, deadline: Instant) -> Self {
        Self {
            body,
            buf: Vec::new(),
            scanned: 0,
            max,
            idle,
            deadline,
            ended: false,
        }
    }

    /// The next non-empty line (without its newline); `None` when the stream ended cleanly.
    /// Cancel-safe: bytes read stay buffered for the next call. On an error the buffer is
    /// freed.
    pub async fn next(&mut self) -> Result<Option<Vec<u8>>, ReadError> {
        loop {
            if let Some(found) = memchr::memchr(b'\n', &self.buf[self.scanned..]) {
                let at = self.scanned + found;
                self.scanned = 0;
                let mut line: Vec<u8> = self.buf.drain(..=at).collect();
                line.pop();
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            self.scanned = self.buf.len();
            if self.buf.len() > self.max {
                self.buf = Vec::new();
                self.scanned = 0;
                return Err(ReadError::LineTooLong(self.max));
            }
            if self.ended {
                self.scanned = 0;
                let rest = std::mem::take(&mut self.buf);
                if rest.iter().all(u8::is_ascii_whitespace) {
                    return Ok(None);
                }
                return Ok(Some(rest));
            }
            match next_frame(&mut self.body, self.idle, self.deadline).await {
                Ok(Some(data)) => self.buf.extend_from_slice(&data),
                Ok(None) => self.ended = true,
                Err(err) => {
                    self.buf = Vec::new();
                    self.scanned = 0;
                    return Err(err);
                }
            }
        }
    }
}

/// Reads a whole body of at most `max` bytes, giving up after `idle` without a byte or at
/// `deadline`.
pub async fn read_all<B>(
    mut body: B,
    max: usize,
    idle: Duration,
    deadline: Instant,
) -> Result<Vec<u8>, ReadError>
where
    B: Body<Data = bytes::Bytes> + Unpin,
    B::Error: std::fmt::Display,
{
    let mut out = Vec::new();
    while let Some(data) = next_frame(&mut body, idle, deadline).await? {
        if out.len() + data.len() > max {
            return Err(ReadError::BodyTooLarge(max));
        }
        out.extend_from_slice(&data);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    type Frames = futures::stream::Iter<
        std::vec::IntoIter<Result<http_body::Frame<bytes::Bytes>, std::io::Error>>,
    >;

    fn body(chunks: &[&'static [u8]]) -> http_body_util::StreamBody<Frames> {
        let chunks: Vec<Result<http_body::Frame<bytes::Bytes>, std::io::Error>> = chunks
            .iter()
            .map(|c| Ok(http_body::Frame::data(bytes::Bytes::from_static(c))))
            .collect();
        http_body_util::StreamBody::new(futures::stream::iter(chunks))
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(60)
    }

    #[tokio::test]
    async fn lines_split_across_frames_and_a_long_one_is_refused() {
        let mut lines = Lines::new(
            body(&[b"{\"a\"", b":1}\n\n{\"b\":2}\n{\"c", b"\":3}"]),
            64,
            Duration::from_secs(5),
            far(),
        );
        assert_eq!(lines.next().await, Ok(Some(b"{\"a\":1}".to_vec())));
        assert_eq!(lines.next().await, Ok(Some(b"{\"b\":2}".to_vec())));
        assert_eq!(lines.next().await, Ok(Some(b"{\"c\":3}".to_vec())));
        assert_eq!(lines.next().await, Ok(None));
        let long: &'static [u8] = &[b'x'; 100];
        let mut lines = Lines::new(body(&[b"ok\n", long]), 64, Duration::from_secs(5), far());
        assert_eq!(lines.next().await, Ok(Some(b"ok".to_vec())));
        assert_eq!(lines.next().await, Err(ReadError::LineTooLong(64)));
        assert_eq!(
            read_all(body(&[long, long]), 150, Duration::from_secs(5), far()).await,
            Err(ReadError::BodyTooLarge(150))
        );
    }

    #[tokio::test]
    async fn a_silent_stream_is_given_up_after_the_idle_time() {
        let silent = http_body_util::StreamBody::new(futures::stream::pending::<
            Result<http_body::Frame<bytes::Bytes>, std::io::Error>,
        >());
        let mut lines = Lines::new(silent, 64, Duration::from_millis(50), far());
        assert_eq!(
            lines.next().await,
            Err(ReadError::Idle(Duration::from_millis(50)))
        );
    }
}
