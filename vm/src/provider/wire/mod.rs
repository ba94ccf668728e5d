//! Provider wire formats: pure translations between the typed boundary
//! ([`ProviderRequest`](crate::ProviderRequest), [`Completion`](crate::Completion),
//! [`ProviderError`](crate::ProviderError)) and a provider API's bytes.
//!
//! Each format is one module with the same contract, and no I/O at all:
//!
//! * `encode_request(&ProviderRequest) -> Result<Vec<u8>, ProviderError>`: the request
//!   body. It reads the request's typed fields only, never a context variable. A request
//!   the format cannot express fails with kind `invalid_request`.
//! * `decode_response(&[u8]) -> Result<Completion, ProviderError>`: a success body. A body
//!   that is not a valid response fails with kind `invalid_response`; the completion keeps
//!   the JSON it was read from in [`Completion::raw`](crate::Completion::raw).
//!
//! Streaming (`spec/providers.md`, "Streaming") has the same shape: each format's
//! `encode_streaming_request` asks for a stream, and its [`StreamAssembler`] turns the
//! body's bytes, fed as they arrive, into text deltas and, at the end, the same
//! [`Completion`](crate::Completion) `decode_response` gives for the equivalent whole body.
//! [`sse`] is the Server-Sent Events decoder under both.
//!
//! HTTP providers (in `aplc-runtime`) add only transport, retries and auth around these.
//! Status codes and error bodies are the transport's business, not the wire format's.

pub mod anthropic;
pub mod openai;
pub mod sse;

use crate::provider::exchange::{Completion, ProviderError};

/// Assembles a streamed response: bytes in, text deltas and a completion out.
///
/// Memory grows with the bytes fed (the assembled text and tool arguments) and no
/// further: a single line or event past the SSE decoder's limit is an error. The caller
/// bounds the total (the runtime stops at its body cap).
pub trait StreamAssembler {
    /// Reads the next bytes of the body, appending the text deltas they complete to
    /// `deltas` (never an empty one). An error is final: the stream carried an error
    /// event or something that is not the API's stream.
    fn feed(&mut self, chunk: &[u8], deltas: &mut Vec<String>) -> Result<(), ProviderError>;

    /// True once the stream's terminator arrived: nothing after it matters.
    fn done(&self) -> bool;

    /// The body ended: the completion, or kind `invalid_response` for a stream that
    /// stopped before its terminator or assembles into no valid response.
    fn finish(self) -> Result<Completion, ProviderError>
    where
        Self: Sized;
}
