//! The runtime's one HTTP client: the HTTP providers and HTTP tools are built on
//! [`HttpClient`], so they share one constructor and one set of rules.
//!
//! * **Redirects**: only a same-origin `307` or `308` is followed (at most
//!   [`MAX_REDIRECTS`]); both keep the method and body. Any other redirect (to another
//!   origin, where it would carry the request and its headers; or a `301`/`302`/`303`,
//!   which would turn the POST into a GET) is handed back to the caller, which reports it
//!   as an error.
//! * **Body cap**: [`read_body`] stops reading at [`MAX_BODY_BYTES`], while streaming.
//! * **Proxies**: `HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY` and `NO_PROXY` (either case)
//!   are honoured, except that loopback hosts (`localhost`, `127.0.0.0/8`, `::1`) are
//!   never proxied, as in Go's `net/http`: a local model server or tool gets the request
//!   (and the key) directly, not a proxy.
//! * **Error texts**: [`error_text`] keeps the whole cause chain ("could not connect:
//!   … Connection refused"), never the URL.
//!
//! Not in here: what is sent and how responses are read (`openai.rs`, `manifest.rs`).

use std::fmt;

use reqwest::{Proxy, Url};

/// The largest response body read, from a provider or an HTTP tool; a bigger one is an
/// error, not an allocation.
pub const MAX_BODY_BYTES: usize = 32 << 20;
/// How many same-origin `307`/`308` redirects one request may follow.
pub const MAX_REDIRECTS: usize = 5;
/// Hosts never sent through a proxy, in `NO_PROXY` syntax.
const LOOPBACK: &str = "localhost,127.0.0.0/8,::1";

/// A configured reqwest client on rustls (`ring`). Cloning is cheap and shares the
/// connection pool.
#[derive(Clone)]
pub struct HttpClient {
    client: reqwest::Client,
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

/// Why the HTTP client could not be built. A proxy variable is named, never its value
/// (which may hold a password).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HttpClientError {
    /// A proxy variable is not a URL.
    #[error("`{variable}` is not a valid proxy URL ({reason})")]
    ProxyUrl {
        /// The variable (`HTTPS_PROXY`).
        variable: &'static str,
        /// What the URL parser said.
        reason: String,
    },
    /// A proxy variable is a URL that cannot be used as a proxy.
    #[error("`{variable}` is not usable: {reason}")]
    Proxy {
        /// The variable.
        variable: &'static str,
        /// Why, with its causes.
        reason: String,
    },
    /// The TLS or client set-up failed.
    #[error("could not build the HTTP client: {0}")]
    Build(String),
}

/// Why an HTTP provider's configuration was refused (`OpenAiProvider::new`,
/// `AnthropicProvider::new`). No message repeats a key, a header value, or a URL's
/// credentials, query or fragment.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The base URL does not parse, is not http(s), or has a query or fragment.
    #[error("invalid base URL `{url}`: {reason}")]
    BaseUrl {
        /// The URL as it may be shown.
        url: String,
        /// What is wrong.
        reason: String,
    },
    /// The base URL has a user name or password.
    #[error(
        "invalid base URL: credentials in the URL are not supported; use an API key or a \
         header"
    )]
    Credentials,
    /// A zero request timeout.
    #[error("the request timeout must be greater than zero")]
    ZeroTimeout,
    /// A configured header's name is not valid HTTP.
    #[error("`{0}` is not a valid HTTP header name")]
    HeaderName(String),
    /// A configured header is one the provider sets itself.
    #[error("header `{0}` is set by the provider and cannot be configured")]
    ManagedHeader(String),
    /// An API key and the header that carries it are both configured.
    #[error("both an API key and an `{0}` header are configured: use one of them")]
    KeyAndHeader(&'static str),
    /// A configured header's value is not valid HTTP (named by the header).
    #[error("the value of header `{0}` is not a valid HTTP header value")]
    HeaderValue(String),
    /// The API key is blank.
    #[error("the API key is empty")]
    EmptyKey,
    /// The API key cannot be sent in a header.
    #[error(
        "the API key is not a valid HTTP header value (it holds a line break or another \
         control character)"
    )]
    KeyValue,
    /// The Anthropic API version cannot be sent in a header.
    #[error("the API version is not a valid HTTP header value")]
    ApiVersion,
    /// The provider's own HTTP client could not be built.
    #[error(transparent)]
    Client(#[from] HttpClientError),
}

impl HttpClient {
    /// A client whose proxies come from the process environment.
    pub fn new() -> Result<HttpClient, HttpClientError> {
        HttpClient::with_env(&|name| std::env::var(name).ok())
    }

    /// A client whose proxies come from `env` (a lookup of environment variables).
    pub fn with_env(env: &dyn Fn(&str) -> Option<String>) -> Result<HttpClient, HttpClientError> {
        let client = builder(env)?
            .build()
            .map_err(|e| HttpClientError::Build(causes(&e)))?;
        Ok(HttpClient { client })
    }

    /// The reqwest client of one MCP server's streamable-HTTP session: the same rules
    /// (proxies from the process environment), but no idle connection kept for reuse, as
    /// rmcp's own default client: reusing one whose last response (an event stream) was
    /// not read to its end stalls on TCP's delayed acknowledgements.
    #[cfg(feature = "mcp")]
    pub(crate) fn for_mcp() -> Result<reqwest::Client, HttpClientError> {
        builder(&|name| std::env::var(name).ok())?
            .pool_max_idle_per_host(0)
            .build()
            .map_err(|e| HttpClientError::Build(causes(&e)))
    }

    /// The reqwest client.
    pub(crate) fn inner(&self) -> &reqwest::Client {
        &self.client
    }
}

/// A client builder with every rule of this module, proxies from `env`.
fn builder(
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<reqwest::ClientBuilder, HttpClientError> {
    ensure_crypto_provider();
    // `no_proxy` first: it drops reqwest's own reading of the environment, so only the
    // proxies below (which never cover loopback) are used.
    let mut builder = reqwest::Client::builder()
        .user_agent(concat!("aplc/", env!("CARGO_PKG_VERSION")))
        .redirect(redirect_policy())
        .no_proxy();
    for proxy in proxies(env)? {
        builder = builder.proxy(proxy);
    }
    Ok(builder)
}

/// Follows a same-origin `307`/`308` only; stops (returning the 3xx response) otherwise.
fn redirect_policy() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let keeps_method = matches!(attempt.status().as_u16(), 307 | 308);
        let same_origin = attempt
            .previous()
            .first()
            .is_some_and(|first| first.origin() == attempt.url().origin());
        if attempt.previous().len() > MAX_REDIRECTS {
            attempt.error(format!("more than {MAX_REDIRECTS} redirects"))
        } else if keeps_method && same_origin {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// The proxies the environment asks for, each bypassing loopback and `NO_PROXY` hosts.
/// A scheme's own variable wins over `ALL_PROXY`; the upper-case name over the lower-case
/// one, except that `HTTP_PROXY` is ignored in a CGI program (`REQUEST_METHOD` set),
/// where a client can set it through a `Proxy:` header ("httpoxy").
fn proxies(env: &dyn Fn(&str) -> Option<String>) -> Result<Vec<Proxy>, HttpClientError> {
    let first = |names: &[&'static str]| {
        names.iter().find_map(|name| {
            env(name)
                .filter(|v| !v.trim().is_empty())
                .map(|v| (*name, v.trim().to_owned()))
        })
    };
    let mut bypass = LOOPBACK.to_owned();
    if let Some((_, list)) = first(&["NO_PROXY", "no_proxy"]) {
        bypass.push(',');
        bypass.push_str(&list);
    }
    let http_names: &[&str] = if env("REQUEST_METHOD").is_some() {
        &["http_proxy"]
    } else {
        &["HTTP_PROXY", "http_proxy"]
    };
    let mut proxies = Vec::new();
    let kinds: [(&[&'static str], MakeProxy); 3] = [
        (http_names, Proxy::http),
        (&["HTTPS_PROXY", "https_proxy"], Proxy::https),
        (&["ALL_PROXY", "all_proxy"], Proxy::all),
    ];
    for (names, make) in kinds {
        let Some((name, value)) = first(names) else {
            continue;
        };
        // The value may hold a password: errors name the variable only.
        let with_scheme = if value.contains("://") {
            value
        } else {
            format!("http://{value}")
        };
        let url = Url::parse(&with_scheme).map_err(|e| HttpClientError::ProxyUrl {
            variable: name,
            reason: e.to_string(),
        })?;
        let proxy = make(url).map_err(|e| HttpClientError::Proxy {
            variable: name,
            reason: causes(&e),
        })?;
        proxies.push(proxy.no_proxy(reqwest::NoProxy::from_string(&bypass)));
    }
    Ok(proxies)
}

/// `Proxy::http`, `Proxy::https` or `Proxy::all`.
type MakeProxy = fn(Url) -> reqwest::Result<Proxy>;

/// Makes `ring` the process's rustls crypto provider unless one is installed already.
///
/// reqwest is built with `rustls-no-provider`: it takes the process default provider and
/// verifies certificates with the platform verifier (the operating system's roots).
/// Installing is idempotent; if an embedder installed another provider first, that one
/// is used.
fn ensure_crypto_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another thread installing one is fine: there is one now.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// Why a body could not be read.
pub(crate) enum BodyError {
    /// It passed [`MAX_BODY_BYTES`].
    TooLarge,
    /// The transfer failed.
    Failed(reqwest::Error),
}

impl BodyError {
    /// The message for a body that could not be read.
    pub(crate) fn text(&self) -> String {
        match self {
            BodyError::TooLarge => format!(
                "the response body is larger than {} MiB",
                MAX_BODY_BYTES >> 20
            ),
            BodyError::Failed(e) => error_text(e),
        }
    }
}

/// Reads the body, chunk by chunk, failing as soon as it passes [`MAX_BODY_BYTES`]: an
/// endless body costs at most the cap.
pub(crate) async fn read_body(response: &mut reqwest::Response) -> Result<Vec<u8>, BodyError> {
    if response
        .content_length()
        .is_some_and(|n| n > MAX_BODY_BYTES as u64)
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Failed)? {
        if body.len() + chunk.len() > MAX_BODY_BYTES {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error as a message: what failed, then every cause down to the innermost
/// (`could not connect: client error (Connect): tcp connect error: Connection refused (os
/// error 111)`). reqwest's own text names the URL, so it is left out.
pub fn error_text(error: &reqwest::Error) -> String {
    let what = if error.is_connect() {
        "could not connect"
    } else if error.is_timeout() {
        "the request timed out"
    } else if error.is_body() || error.is_decode() {
        "the response could not be read"
    } else if error.is_redirect() {
        "the redirect could not be followed"
    } else {
        "the request failed"
    };
    match causes(error) {
        causes if causes.is_empty() => what.to_owned(),
        causes => format!("{what}: {causes}"),
    }
}

/// The messages of `error`'s sources (not its own), joined with `: `; a message already
/// contained in the one before it is skipped.
fn causes(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut cause = error.source();
    while let Some(current) = cause {
        let text = current.to_string();
        if !text.is_empty() && !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        cause = current.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env_of(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |name| {
            pairs
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn proxies_come_from_the_environment() {
        assert!(proxies(&env_of(&[])).unwrap().is_empty());
        assert!(proxies(&env_of(&[("HTTP_PROXY", " ")])).unwrap().is_empty());
        let found = proxies(&env_of(&[
            ("HTTP_PROXY", "127.0.0.1:3128"),
            ("https_proxy", "http://u:p@127.0.0.1:3129"),
            ("ALL_PROXY", "socks5://127.0.0.1:1080"),
        ]));
        assert_eq!(found.map(|p| p.len()).ok(), Some(3));
        // httpoxy: in a CGI program only the lower-case name counts.
        let cgi = proxies(&env_of(&[
            ("REQUEST_METHOD", "GET"),
            ("HTTP_PROXY", "127.0.0.1:3128"),
        ]));
        assert_eq!(cgi.map(|p| p.len()).ok(), Some(0));
        let e = proxies(&env_of(&[("HTTP_PROXY", "http://u:secret@[::1")]))
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with("`HTTP_PROXY` is not a valid proxy URL"),
            "{e}"
        );
        assert!(!e.contains("secret"), "{e}");
    }
}
