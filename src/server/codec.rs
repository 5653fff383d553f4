//! The protobuf codec of `ditto.v1.Twin`: prost's, except that bytes which do not decode as
//! the expected message are the client's fault, INVALID_ARGUMENT (tonic's prost codec says
//! INTERNAL, which blames the server and invites retries).

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
