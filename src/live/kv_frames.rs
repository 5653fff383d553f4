//! A bound on the ZMQ frames a KV-event publisher sends. The `zeromq` crate (0.7) has no
//! maximum message size: its decoder reserves a frame's claimed length before the body
//! arrives and hands the frame over only when whole, so a publisher could make ditto hold a
//! frame as large as it sends, and a 9-byte header claiming 2^50 bytes aborted the process
//! on the failed reservation. Each KV connection (live stream and replay) therefore goes
//! through a loopback relay that reads the ZMTP 3 framing from the publisher (the 64-byte
//! greeting, then per frame a flags byte and a 1- or 8-byte length) as the bytes pass, and
//! cuts the connection at the first frame claiming more than [`MAX_FRAME_BYTES`], saying why.
//! Bytes are forwarded as they come (64 KiB at a time), never held.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

/// The largest ZMQ frame taken from a publisher (128 MiB: a KV payload over 16 MiB is
/// refused after it arrives, by [`super::kv_wire`], with the pod's stream staying up).
pub const MAX_FRAME_BYTES: u64 = 128 << 20;
/// The ZMTP 3 greeting's length.
const GREETING_BYTES: u64 = 64;
/// How long the relay waits for the ZMQ socket to connect to it.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);

/// The ZMTP framing of the bytes from a publisher, read as they pass.
#[derive(Debug)]
pub struct FrameCheck {
    state: State,
    max: u64,
}

#[derive(Debug)]
enum State {
    /// Greeting bytes still to pass.
    Greeting(u64),
    /// A frame's flags byte is next.
    Flags,
    /// A frame's length: 8 bytes (`long`) or 1, `got` of them read into `len`.
    Length { long: bool, got: u8, len: u64 },
    /// Body bytes still to pass.
    Body(u64),
}

impl FrameCheck {
    /// Checks frames against `max` bytes.
    pub fn new(max: u64) -> Self {
        Self {
            state: State::Greeting(GREETING_BYTES),
            max,
        }
    }

    /// Reads the next bytes from the publisher; `Err(claimed)` at a frame whose length
    /// passes the maximum (as soon as its header is read, before any of its body).
    pub fn feed(&mut self, mut data: &[u8]) -> Result<(), u64> {
        while let Some((&first, rest)) = data.split_first() {
            match &mut self.state {
                State::Greeting(left) | State::Body(left) => {
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                    *left -= take as u64;
                    data = &data[take..];
                    if *left == 0 {
                        self.state = State::Flags;
                    }
                }
                State::Flags => {
                    self.state = State::Length {
                        long: first & 0x02 != 0,
                        got: 0,
                        len: 0,
                    };
                    data = rest;
                }
                State::Length { long, got, len } => {
                    *len = (*len << 8) | u64::from(first);
                    *got += 1;
                    data = rest;
                    if *got == if *long { 8 } else { 1 } {
                        let len = *len;
                        if len > self.max {
                            return Err(len);
                        }
                        self.state = if len == 0 {
                            State::Flags
                        } else {
                            State::Body(len)
                        };
                    }
                }
            }
        }
        Ok(())
    }
}

/// A relay in front of one publisher endpoint; dropping it ends the relay.
#[derive(Debug)]
pub struct Relay {
    /// Where the ZMQ socket connects instead (the endpoint itself when it is not `tcp://`).
    pub endpoint: String,
    tripped: Arc<Mutex<Option<String>>>,
    task: Option<JoinHandle<()>>,
}

impl Relay {
    /// Why the relay cut the connection (a frame over the maximum), if it did.
    pub fn tripped(&self) -> Option<String> {
        self.tripped
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Connects to `endpoint` (`tcp://host:port`) and opens a loopback relay to it; other
/// transports pass through unchecked. An error is the connection's to the publisher.
pub async fn relay(endpoint: &str) -> std::io::Result<Relay> {
    let tripped = Arc::new(Mutex::new(None));
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return Ok(Relay {
            endpoint: endpoint.to_owned(),
            tripped,
            task: None,
        });
    };
    let upstream = TcpStream::connect(address).await?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(pump(listener, upstream, Arc::clone(&tripped)));
    Ok(Relay {
        endpoint: format!("tcp://{local}"),
        tripped,
        task: Some(task),
    })
}

/// Forwards both ways until either side closes or a frame from the publisher is too large.
async fn pump(listener: TcpListener, upstream: TcpStream, tripped: Arc<Mutex<Option<String>>>) {
    let Ok(Ok((local, _))) = tokio::time::timeout(ACCEPT_WAIT, listener.accept()).await else {
        return;
    };
    drop(listener);
    let (mut from_pub, mut to_pub) = upstream.into_split();
    let (mut from_zmq, mut to_zmq) = local.into_split();
    let outbound = tokio::io::copy(&mut from_zmq, &mut to_pub);
    let inbound = async {
        let mut check = FrameCheck::new(MAX_FRAME_BYTES);
        let mut buf = vec![0u8; 64 << 10];
        loop {
            let read = from_pub.read(&mut buf).await?;
            if read == 0 {
                return Ok::<(), std::io::Error>(());
            }
            if let Err(claimed) = check.feed(&buf[..read]) {
                *tripped.lock().unwrap_or_else(PoisonError::into_inner) = Some(format!(
                    "a ZMQ frame of {claimed} bytes is over the limit of {MAX_FRAME_BYTES} bytes"
                ));
                return Ok(());
            }
            to_zmq.write_all(&buf[..read]).await?;
        }
    };
    tokio::select! {
        _ = outbound => {}
        _ = inbound => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn greeting() -> Vec<u8> {
        let mut bytes = vec![0xff];
        bytes.extend([0; 8]);
        bytes.push(0x7f);
        bytes.extend([3, 0]);
        bytes.resize(64, 0);
        bytes
    }

    #[test]
    fn frames_within_the_maximum_pass_in_any_split() {
        let mut wire = greeting();
        wire.extend([0x04, 5, b'R', b'E', b'A', b'D', b'Y']); // a short command
        wire.extend([0x01, 3, b'k', b'v', b'@']); // a short frame, more to come
        wire.extend([0x02, 0, 0, 0, 0, 0, 0, 1, 0]); // a long frame of 256 bytes
        wire.extend([7; 256]);
        wire.extend([0x00, 0]); // an empty frame
        for split in [1, 3, 7, 64, 65, wire.len()] {
            let mut check = FrameCheck::new(256);
            for chunk in wire.chunks(split) {
                assert_eq!(check.feed(chunk), Ok(()), "split {split}");
            }
            assert!(matches!(check.state, State::Flags), "split {split}");
        }
    }

    #[test]
    fn a_frame_claiming_more_is_refused_from_its_header() {
        let mut wire = greeting();
        wire.extend([0x02]);
        wire.extend((1u64 << 50).to_be_bytes());
        let mut check = FrameCheck::new(MAX_FRAME_BYTES);
        assert_eq!(check.feed(&wire), Err(1 << 50));
        let mut check = FrameCheck::new(100);
        let mut short = greeting();
        short.extend([0x00, 101]);
        assert_eq!(check.feed(&short), Err(101));
    }
}
