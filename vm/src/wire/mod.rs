//! Provider wire formats: pure `encode(request) -> body` and `decode(body) -> Completion`
//! functions, one module per API, unit-tested without I/O. The runtime's HTTP providers
//! add only transport, retries and auth.

pub mod anthropic;
