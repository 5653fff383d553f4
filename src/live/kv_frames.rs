//! A bound on the ZMQ frames a KV-event publisher sends. The `zeromq` crate (0.7) has no
//! maximum message size: its decoder reserves a frame's claimed length before the body
//! arrives and hands the frame over only when whole, so a publisher could make ditto hold a
//! frame as large as it sends, and a 9-byte header claiming 2^50 bytes aborted the process
//! on the failed reservation. Each KV connection (live stream and replay) therefore goes
//! through a loopback relay that reads the ZMTP 3 framing from the publisher (the 64-byte
//! greeting, then per frame a flags byte and a 1- or 8-byte length) as the bytes pass.
//! A message frame claiming more than [`MAX_FRAME_BYTES`] (the largest KV payload decoded,
//! [`MAX_BATCH_BYTES`]) is passed on empty, its body dropped as it arrives and the reason
//! kept for the receiver ([`Relay::take_cut`]): the message still arrives, is refused as a
//! batch naming the limit, and the stream stays up. A command frame over the maximum cuts
//! the connection ([`Relay::tripped`]). Bytes are forwarded as they come (64 KiB at a time),
//! never held: a 128 MiB frame took ditto's peak memory past 256 MB when the cut was there.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use super::kv_wire::MAX_BATCH_BYTES;

/// The largest ZMQ frame passed on from a publisher: the largest batch payload decoded
/// (16 MiB). A larger message frame arrives empty (see the module doc).
pub const MAX_FRAME_BYTES: u64 = MAX_BATCH_BYTES as u64;
/// The ZMTP 3 greeting's length.
const GREETING_BYTES: u64 = 64;
/// How long the relay waits for the ZMQ socket to connect to it.
const ACCEPT_WAIT: Duration = Duration::from_secs(5);
/// A ZMTP frame's flags: more frames follow, an 8-byte length, a command.
const FLAG_LONG: u8 = 0x02;
const FLAG_COMMAND: u8 = 0x04;

/// The ZMTP framing of the bytes from a publisher, read (and rewritten) as they pass.
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
    /// A frame's length: 8 bytes (`long`) or 1, `got` of them read into `len`; held until
    /// whole (its header is passed on, or rewritten, then).
    Length { flags: u8, got: u8, len: u64 },
    /// Body bytes still to pass.
    Body(u64),
    /// Body bytes of a frame over the maximum still to drop.
    Discard(u64),
}

/// What the bytes fed held beyond frames within the maximum.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Fed {
    /// Message frames over the maximum, by claimed length: passed on empty.
    pub emptied: Vec<u64>,
}

impl FrameCheck {
    /// Checks frames against `max` bytes.
    pub fn new(max: u64) -> Self {
        Self {
            state: State::Greeting(GREETING_BYTES),
            max,
        }
    }

    /// Reads the next bytes from the publisher, appending what is to be passed on to `out`:
    /// everything, except that a message frame over the maximum becomes an empty frame (its
    /// body dropped). `Err(claimed)` at a command frame over the maximum (from its header).
    pub fn feed(&mut self, mut data: &[u8], out: &mut Vec<u8>) -> Result<Fed, u64> {
        let mut fed = Fed::default();
        while let Some((&first, rest)) = data.split_first() {
            match &mut self.state {
                State::Greeting(left) | State::Body(left) | State::Discard(left) => {
                    let take = usize::try_from(*left).unwrap_or(usize::MAX).min(data.len());
                    *left -= take as u64;
                    let done = *left == 0;
                    if !matches!(self.state, State::Discard(_)) {
                        out.extend_from_slice(&data[..take]);
                    }
                    data = &data[take..];
                    if done {
                        self.state = State::Flags;
                    }
                }
                State::Flags => {
                    self.state = State::Length {
                        flags: first,
                        got: 0,
                        len: 0,
                    };
                    data = rest;
                }
                State::Length { flags, got, len } => {
                    *len = (*len << 8) | u64::from(first);
                    *got += 1;
                    data = rest;
                    let long = *flags & FLAG_LONG != 0;
                    if *got == if long { 8 } else { 1 } {
                        let (flags, len) = (*flags, *len);
                        if len > self.max {
                            if flags & FLAG_COMMAND != 0 {
                                return Err(len);
                            }
                            out.extend_from_slice(&[flags & !FLAG_LONG, 0]);
                            fed.emptied.push(len);
                            self.state = State::Discard(len);
                            continue;
                        }
                        out.push(flags);
                        if long {
                            out.extend_from_slice(&len.to_be_bytes());
                        } else {
                            out.push(len as u8);
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
        Ok(fed)
    }
}

/// What the relay saw that the ZMQ socket cannot tell: shared with its task.
#[derive(Debug, Default)]
struct Notes {
    /// Why the relay cut the connection (a command frame over the maximum).
    tripped: Option<String>,
    /// Why the last message frame passed on empty was emptied, until taken.
    cut: Option<String>,
}

/// A relay in front of one publisher endpoint; dropping it ends the relay.
#[derive(Debug)]
pub struct Relay {
    /// Where the ZMQ socket connects instead (the endpoint itself when it is not `tcp://`).
    pub endpoint: String,
    notes: Arc<Mutex<Notes>>,
    task: Option<JoinHandle<()>>,
}

impl Relay {
    fn notes(&self) -> std::sync::MutexGuard<'_, Notes> {
        self.notes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the relay cut the connection (a command frame over the maximum), if it did.
    pub fn tripped(&self) -> Option<String> {
        self.notes().tripped.clone()
    }

    /// Why the last message frame passed on empty was emptied (a frame over the maximum),
    /// once: the receiver takes it for the message that arrived with an empty payload.
    pub fn take_cut(&self) -> Option<String> {
        self.notes().cut.take()
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

/// Why a message frame of `claimed` bytes arrived empty (the wording of the decoder's own
/// refusal of a payload over [`MAX_BATCH_BYTES`], so a stale reason reads the same).
pub fn cut_reason(claimed: u64) -> String {
    format!("batch of {claimed} bytes, over the limit of {MAX_BATCH_BYTES} (dropped as it arrived)")
}

/// Connects to `endpoint` (`tcp://host:port`) and opens a loopback relay to it; other
/// transports pass through unchecked. An error is the connection's to the publisher.
pub async fn relay(endpoint: &str) -> std::io::Result<Relay> {
    let notes = Arc::new(Mutex::new(Notes::default()));
    let Some(address) = endpoint.strip_prefix("tcp://") else {
        return Ok(Relay {
            endpoint: endpoint.to_owned(),
            notes,
            task: None,
        });
    };
    let upstream = TcpStream::connect(address).await?;
    let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(pump(listener, upstream, Arc::clone(&notes)));
    Ok(Relay {
        endpoint: format!("tcp://{local}"),
        notes,
        task: Some(task),
    })
}

/// Forwards both ways until either side closes or a command frame from the publisher is too
/// large; message frames too large pass on empty.
async fn pump(listener: TcpListener, upstream: TcpStream, notes: Arc<Mutex<Notes>>) {
    let Ok(Ok((local, _))) = tokio::time::timeout(ACCEPT_WAIT, listener.accept()).await else {
        return;
    };
    drop(listener);
    let (mut from_pub, mut to_pub) = upstream.into_split();
    let (mut from_zmq, mut to_zmq) = local.into_split();
    let outbound = tokio::io::copy(&mut from_zmq, &mut to_pub);
    let note = |update: &dyn Fn(&mut Notes)| {
        update(&mut notes.lock().unwrap_or_else(PoisonError::into_inner));
    };
    let inbound = async {
        let mut check = FrameCheck::new(MAX_FRAME_BYTES);
        let mut buf = vec![0u8; 64 << 10];
        let mut out = Vec::with_capacity(buf.len() + 16);
        loop {
            let read = from_pub.read(&mut buf).await?;
            if read == 0 {
                return Ok::<(), std::io::Error>(());
            }
            out.clear();
            match check.feed(&buf[..read], &mut out) {
                Ok(fed) => {
                    if let Some(&claimed) = fed.emptied.last() {
                        note(&|notes| notes.cut = Some(cut_reason(claimed)));
                    }
                }
                Err(claimed) => {
                    note(&|notes| {
                        notes.tripped = Some(format!(
                            "a ZMQ command frame of {claimed} bytes is over the limit of \
                             {MAX_FRAME_BYTES} bytes"
                        ));
                    });
                    return Ok(());
                }
            }
            to_zmq.write_all(&out).await?;
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

    /// Feeds `wire` in chunks of `split` bytes: what is passed on, and the frames emptied.
    fn pass(check: &mut FrameCheck, wire: &[u8], split: usize) -> Result<(Vec<u8>, Vec<u64>), u64> {
        let (mut out, mut emptied) = (Vec::new(), Vec::new());
        for chunk in wire.chunks(split) {
            emptied.extend(check.feed(chunk, &mut out)?.emptied);
        }
        Ok((out, emptied))
    }

    #[test]
    fn frames_within_the_maximum_pass_unchanged_in_any_split() {
        let mut wire = greeting();
        wire.extend([0x04, 5, b'R', b'E', b'A', b'D', b'Y']); // a short command
        wire.extend([0x01, 3, b'k', b'v', b'@']); // a short frame, more to come
        wire.extend([0x02, 0, 0, 0, 0, 0, 0, 1, 0]); // a long frame of 256 bytes
        wire.extend([7; 256]);
        wire.extend([0x00, 0]); // an empty frame
        for split in [1, 3, 7, 64, 65, wire.len()] {
            let mut check = FrameCheck::new(256);
            assert_eq!(
                pass(&mut check, &wire, split),
                Ok((wire.clone(), vec![])),
                "split {split}"
            );
            assert!(matches!(check.state, State::Flags), "split {split}");
        }
    }

    #[test]
    fn a_message_frame_over_the_maximum_passes_on_empty_and_the_next_whole() {
        let mut wire = greeting();
        wire.extend([0x01, 3, b'k', b'v', b'@']); // topic, more to come
        wire.extend([0x03, 0, 0, 0, 0, 0, 0, 1, 1]); // a long frame of 257 bytes, more
        wire.extend([9; 257]);
        wire.extend([0x00, 2, 1, 2]); // the last frame
        let mut expected = greeting();
        expected.extend([0x01, 3, b'k', b'v', b'@']);
        expected.extend([0x01, 0]); // emptied, still with more to come
        expected.extend([0x00, 2, 1, 2]);
        for split in [1, 5, 64, 70, wire.len()] {
            let mut check = FrameCheck::new(256);
            assert_eq!(
                pass(&mut check, &wire, split),
                Ok((expected.clone(), vec![257])),
                "split {split}"
            );
        }
    }

    #[test]
    fn a_command_frame_claiming_more_is_refused_from_its_header() {
        let mut wire = greeting();
        wire.extend([0x06]);
        wire.extend((1u64 << 50).to_be_bytes());
        let mut check = FrameCheck::new(MAX_FRAME_BYTES);
        assert_eq!(check.feed(&wire, &mut Vec::new()), Err(1 << 50));
        let mut check = FrameCheck::new(100);
        let mut short = greeting();
        short.extend([0x04, 101]);
        assert_eq!(check.feed(&short, &mut Vec::new()), Err(101));
        // A message frame claiming 2^50 bytes is dropped as it comes, never reserved.
        let mut check = FrameCheck::new(MAX_FRAME_BYTES);
        let mut huge = greeting();
        huge.extend([0x02]);
        huge.extend((1u64 << 50).to_be_bytes());
        huge.extend([0; 4096]);
        let mut out = Vec::new();
        assert_eq!(
            check.feed(&huge, &mut out).map(|fed| fed.emptied),
            Ok(vec![1 << 50])
        );
        assert_eq!(out.len(), 64 + 2);
    }
}
