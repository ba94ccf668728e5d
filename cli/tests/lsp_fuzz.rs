//! Thousands of random edits (a fixed seed, so a failure replays) to the LSP fixtures,
//! with a request of some kind after every few: `aplc lsp` must answer each one and
//! never crash or hang, whatever half-typed text, stray delimiter or out-of-range
//! position it gets. At the end the whole text is sent again, and the diagnostics must
//! be those of a fresh open of the same text (the edits left no stale state).

mod lsp_client;

use std::path::Path;

use lsp_client::{Client, uri};
use serde_json::{Value, json};

/// Fragments that make APL and Jinja interesting: delimiters, headings, jumps,
/// multi-byte characters, line breaks.
const FRAGMENTS: &[&str] = &[
    "{{",
    "}}",
    "{%",
    "%}",
    "{#",
    "#}",
    "# prompt: ",
    "# pre: a",
    "# post: ",
    "## user",
    "## system\n",
    "\n",
    "\r\n",
    "😀",
    "é",
    "'",
    "\"",
    "|",
    "tojson",
    "set_context('next_step', '",
    "escalate')",
    "{{ runs }}",
    "{% if x %}",
    "{% endif %}",
    "```\n",
    "x",
    " ",
    "return",
];

const METHODS: &[&str] = &[
    "textDocument/hover",
    "textDocument/definition",
    "textDocument/references",
    "textDocument/completion",
    "textDocument/documentSymbol",
    "textDocument/foldingRange",
    "textDocument/semanticTokens/full",
    "textDocument/codeAction",
    "textDocument/prepareRename",
    "textDocument/rename",
];

/// xorshift64*: deterministic and dependency-free.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

#[test]
fn random_edits_never_crash_or_hang_the_server() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures");
    let fixtures = [
        "lsp/triage.apl",
        "lsp/unknown_step.apl",
        "lsp/nvim/jump.apl",
    ];
    let mut rng = Rng(0x5eed_a91c_2026_0029);
    let mut client = Client::start(&[]);
    let mut requests = 0;
    for (f, name) in fixtures.iter().enumerate() {
        let text = std::fs::read_to_string(dir.join(name)).expect("fixture");
        let doc = uri(&format!("fuzz{f}.apl"));
        client.open(&doc, &text);
        let mut version = 1;
        for _ in 0..1000 {
            version += 1;
            let lines = text.lines().count() as u64 + 3;
            let mut pos = || json!({"line": rng.below(lines), "character": rng.below(90)});
            let (start, end) = (pos(), pos());
            let (start, end) = if (start["line"].as_u64(), start["character"].as_u64())
                <= (end["line"].as_u64(), end["character"].as_u64())
            {
                (start, end)
            } else {
                (end, start)
            };
            let new_text = match rng.below(4) {
                0 => String::new(),
                _ => FRAGMENTS[rng.below(FRAGMENTS.len() as u64) as usize].to_string(),
            };
            client.notify(
                "textDocument/didChange",
                json!({"textDocument": {"uri": doc, "version": version},
                       "contentChanges": [{"range": {"start": start, "end": end}, "text": new_text}]}),
            );
            if rng.below(8) == 0 {
                let method = METHODS[rng.below(METHODS.len() as u64) as usize];
                let p = json!({"line": rng.below(lines), "character": rng.below(90)});
                let params = json!({
                    "textDocument": {"uri": doc}, "position": p,
                    "range": {"start": p, "end": p}, "context": {"includeDeclaration": true, "diagnostics": [], "triggerKind": 1},
                    "newName": "renamed",
                });
                let answer = client.request(method, params);
                assert!(
                    answer.get("result").is_some() || answer.get("error").is_some(),
                    "{answer}"
                );
                if let Some(error) = answer.get("error") {
                    // Only a refused rename is an expected error; anything else is a bug.
                    assert_eq!(error["code"], -32803, "{method}: {answer}");
                }
                requests += 1;
            }
        }
        // The whole text again: the same diagnostics as a fresh open.
        version += 1;
        client.notify(
            "textDocument/didChange",
            json!({"textDocument": {"uri": doc, "version": version}, "contentChanges": [{"text": text}]}),
        );
        let after = client.diagnostics(&doc, version);
        let fresh_doc = uri(&format!("fresh{f}.apl"));
        client.open(&fresh_doc, &text);
        let fresh: Vec<Value> = client.diagnostics(&fresh_doc, 1);
        assert_eq!(after, with_uri(fresh, &fresh_doc, &doc), "{name}");
    }
    assert!(requests > 100, "only {requests} requests");
    client.shutdown();
}

/// `diagnostics` with related locations in `from` moved to `to`.
fn with_uri(diagnostics: Vec<Value>, from: &str, to: &str) -> Vec<Value> {
    let text = serde_json::to_string(&diagnostics).expect("json");
    serde_json::from_str(&text.replace(from, to)).expect("json")
}
