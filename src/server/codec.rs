//! The protobuf codec of `ditto.v1.Twin`: prost's, except that bytes which do not decode as
//! the expected message are the client's fault, INVALID_ARGUMENT (tonic's prost codec says
//! INTERNAL, which blames the server and invites retries). Also: a message over the size
//! limit is RESOURCE_EXHAUSTED (as in gRPC's other servers), not tonic's OUT_OF_RANGE.

use std::marker::PhantomData;

use tonic::Status;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic_prost::{ProstDecoder, ProstEncoder};

/// Prost's encoder and a decoder whose errors are INVALID_ARGUMENT. The generated Twin server
/// and client use it (`build.rs` sets it as the codec path).
#[derive(Debug, Clone)]
pub struct TwinCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for TwinCodec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> Codec for TwinCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = InvalidArgumentDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::default()
    }

    fn decoder(&mut self) -> Self::Decoder {
        InvalidArgumentDecoder(ProstDecoder::default())
    }
}

/// Prost's decoder with decode errors reported as INVALID_ARGUMENT.
#[derive(Debug, Clone)]
pub struct InvalidArgumentDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for InvalidArgumentDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|status| {
            Status::invalid_argument(format!(
                "the message is not a valid {}: {}",
                std::any::type_name::<U>()
                    .rsplit("::")
                    .next()
                    .unwrap_or("message"),
                crate::server::error::shorten(status.message())
            ))
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}

/// Rewrites tonic's OUT_OF_RANGE for a request message over the size limit (a trailers-only
/// response, before any handler output) into RESOURCE_EXHAUSTED, the code gRPC's other
/// implementations use for it.
pub fn message_too_large_is_resource_exhausted<B>(response: &mut http::Response<B>) {
    let headers = response.headers_mut();
    let out_of_range = headers
        .get("grpc-status")
        .is_some_and(|code| code.as_bytes() == b"11");
    let too_large = headers.get("grpc-message").is_some_and(|message| {
        let message = message.as_bytes();
        TOO_LARGE.iter().any(|needle| {
            message
                .windows(needle.len())
                .any(|window| window == *needle)
        })
    });
    if out_of_range && too_large {
        headers.insert(
            "grpc-status",
            http::HeaderValue::from_static(RESOURCE_EXHAUSTED),
        );
    }
}

/// What tonic's size-limit message says, percent-encoded or not.
const TOO_LARGE: [&[u8]; 2] = [
    b"message%20length%20too%20large",
    b"message length too large",
];
/// The numeric code of RESOURCE_EXHAUSTED.
const RESOURCE_EXHAUSTED: &str = "8";
