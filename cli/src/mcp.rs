//! `aplc mcp`: the agents of a directory as the tools of an MCP server, from the command
//! line (spec/mcp.md §3), over `aplc-server`'s [`serve_mcp`].

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use aplc_runtime::store::StoreUrl;
use aplc_server::{LogFormat, McpConfig, ServeError, serve_mcp};
use clap::Args;

use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct McpArgs {
    /// The directory of agents: every `.apl` (compiled at load) and `.aplb` in it, each
    /// a tool named by its file name without the extension, reloaded when a file changes.
    #[arg(long, value_name = "DIR")]
    agents: PathBuf,
    /// Route models to providers with this JSON file (spec/providers.md); without it,
    /// the OpenAI API with $OPENAI_API_KEY.
    #[arg(long, value_name = "PROVIDERS.json")]
    providers: Option<PathBuf>,
    /// The tools the agents may call (spec/tools.md).
    #[arg(long, value_name = "TOOLS.json")]
    tools: Option<PathBuf>,
    /// Make each call a durable run in this store: `sqlite:PATH` or
    /// `postgres://USER@HOST/DB` (`aplc runs` lists them).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Serve streamable HTTP at `/mcp` on this address instead of stdio (port 0: any
    /// free port, printed at start); needs a bearer token.
    #[arg(long, value_name = "ADDR")]
    listen: Option<SocketAddr>,
    /// Bearer tokens for `--listen`, one per line (blank lines and `#` comments
    /// ignored). Adds to $APLC_SERVE_TOKENS (comma-separated).
    #[arg(long, value_name = "FILE")]
    tokens: Option<PathBuf>,
    /// The largest HTTP request body accepted, in bytes (larger: 413).
    #[arg(long, value_name = "BYTES", default_value_t = aplc_server::DEFAULT_MAX_BODY_BYTES)]
    max_body_bytes: usize,
}

pub(crate) fn mcp(args: McpArgs) -> Result<ExitCode, Failure> {
    // The log goes to stderr: over stdio, stdout carries the protocol.
    aplc_server::init_logging(LogFormat::Text);
    let mut config = McpConfig::new(args.agents);
    config.providers = args.providers;
    config.tools = args.tools;
    config.store = args
        .store
        .as_deref()
        .map(StoreUrl::parse)
        .transpose()
        .map_err(|e| Failure::usage(e.to_string()))?;
    config.listen = args.listen;
    config.tokens = crate::serve::tokens(args.tokens.as_deref())?;
    config.max_body_bytes = args.max_body_bytes;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| Failure::run(format!("cannot start the async runtime: {e}")))?;
    let served = runtime.block_on(serve_mcp(config, |address| {
        // Over HTTP, one line on stdout for scripts and tests: the address bound. Over
        // stdio, stdout is the protocol's: nothing else goes there.
        if let Some(address) = address {
            println!("listening on http://{address}/mcp");
        }
    }));
    runtime.shutdown_timeout(crate::serve::SHUTDOWN_GRACE);
    match served {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(ServeError::Config(message)) => Err(Failure::usage(message)),
        Err(e) => Err(Failure::run(e.to_string())),
    }
}
