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
//! HTTP providers (in `aplc-runtime`) add only transport, retries and auth around these.
//! Status codes and error bodies are the transport's business, not the wire format's.

pub mod anthropic;
pub mod openai;
