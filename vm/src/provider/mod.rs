//! The provider boundary, typed: the [`ProviderRequest`](crate::ProviderRequest) the
//! machine builds from the context (`request.rs`), the messages in it (`messages.rs`),
//! the [`Completion`](crate::Completion) or [`ProviderError`](crate::ProviderError) a
//! provider answers (`exchange.rs`), JSON output checks (`response.rs`), tool
//! descriptors and checks (`tools.rs`), what a run asks a person and the answers
//! (`human.rs`), the pure wire formats (`wire/`) and the scripted
//! provider (`scripted.rs`).
//!
//! Above `template/` (a request is built from the context's variables), below `run/`.

pub(crate) mod exchange;
pub mod human;
pub(crate) mod messages;
pub(crate) mod request;
pub(crate) mod response;
pub(crate) mod scripted;
pub mod tools;
pub mod wire;
