//! The language server alone, on stdio: what `aplc lsp` runs, without building the rest
//! of the `aplc` binary (runtime, HTTP, stores). `benches/lsp_latency.py` measures it
//! in a release build: `cargo build --release -p aplc-lsp --example stdio`.

fn main() -> std::process::ExitCode {
    match aplc_lsp::run_stdio(aplc_lsp::Config::default()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
