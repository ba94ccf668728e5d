//! Agents and helpers shared by the criterion benchmarks and `benches/README.md`.
//!
//! The benchmark agents live in `benches/agents/` (each with its `.mock.json`); the
//! 1,000-step agent is generated.

use std::path::PathBuf;

/// The workspace's `fixtures/` directory.
pub fn fixtures_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fixtures")
}

/// `benches/agents/`.
pub fn agents_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("agents")
}

/// Reads `benches/agents/<name>.apl` and its scripted responses.
pub fn agent(name: &str) -> (String, String) {
    let read = |ext: &str| {
        let path = agents_dir().join(format!("{name}.{ext}"));
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    (read("apl"), read("mock.json"))
}

/// The agent's `with_context` variables (`<name>.context.json`), if it has any.
pub fn agent_context(name: &str) -> serde_json::Map<String, serde_json::Value> {
    let path = agents_dir().join(format!("{name}.context.json"));
    match std::fs::read_to_string(&path) {
        Ok(text) => match serde_json::from_str(&text) {
            Ok(serde_json::Value::Object(map)) => map,
            _ => panic!("{}: expected a JSON object", path.display()),
        },
        Err(_) => serde_json::Map::new(),
    }
}

/// An agent of `n` steps, each with pre, two role sections and post, chained in order.
pub fn generated_agent(n: usize) -> String {
    let mut out = String::new();
    for i in 0..n {
        let next = if i + 1 < n {
            format!("s{}", i + 1)
        } else {
            "return".to_string()
        };
        out.push_str(&format!(
            "# pre: s{i}\n{{{{ set_context('k{i}', {i}) }}}}\n\n\
             # prompt: s{i}\n## system\nYou are step {i}.\n## user\nValue {{{{ k{i} }}}}, previous {{{{ prev_step }}}}.\n\n\
             # post: s{i}\n{{% if runs < 2 %}}{{{{ set_context('next_step', '{next}') }}}}{{% endif %}}\n\n"
        ));
    }
    out
}
