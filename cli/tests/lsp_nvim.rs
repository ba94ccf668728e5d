//! A real client nobody here wrote: Neovim's built-in LSP client (Debian's `neovim`,
//! 0.7 or later, run headless) on `aplc lsp`. fixtures/lsp/nvim/init.lua opens a
//! fixture, waits for its diagnostics, asks for a hover and a definition, applies a fix
//! and waits for the diagnostics to clear, then writes what it saw; this test checks it.
//! Without `nvim` on the PATH the test fails saying so (CI installs it).

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

#[test]
fn neovim_gets_diagnostics_hover_and_definition() {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/lsp/nvim");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("lsp_nvim");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let file = dir.join("jump.apl");
    std::fs::copy(fixtures.join("jump.apl"), &file).expect("copy the fixture");
    let out = dir.join("out.json");
    let child = Command::new("nvim")
        .args(["--headless", "-n", "-i", "NONE", "--noplugin", "-u"])
        .arg(fixtures.join("init.lua"))
        .arg(&file)
        .current_dir(&dir)
        .env("APLC_NVIM_OUT", &out)
        .env("APLC_BIN", env!("CARGO_BIN_EXE_aplc"))
        .env("XDG_STATE_HOME", &dir)
        .env("XDG_DATA_HOME", &dir)
        .env("XDG_CONFIG_HOME", &dir)
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => panic!("cannot run `nvim` ({e}): install Debian's `neovim` (CI does)"),
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for nvim") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("nvim did not finish within 180 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "nvim exited with {status}");
    let text = std::fs::read_to_string(&out).expect("nvim wrote its results");
    let results: Value = serde_json::from_str(&text).expect("JSON results");
    assert_eq!(results["error"], Value::Null, "{results}");
    assert_eq!(
        results["diagnostics"],
        json!([{"lnum": 10, "col": 12, "message": "Unknown step: fni", "code": "APL0014", "severity": 1}]),
        "{results}"
    );
    let hover = results["hover"].as_str().expect("a hover text");
    assert!(hover.contains("`runs`") && hover.contains("int"), "{hover}");
    let target = &results["definition"];
    let range = if target.is_array() {
        &target[0]["range"]
    } else {
        &target["range"]
    };
    assert_eq!(
        range,
        &json!({"start": {"line": 6, "character": 10}, "end": {"line": 6, "character": 13}}),
        "{results}"
    );
    assert_eq!(results["cleared"], true, "{results}");
}
