//! Compiling an agent with the agents it names linked in (`spec/agents.md` §2): the
//! compiler's pure linker fed by the runtime's reader of agent files. The CLI (`aplc
//! build`, `check`, `run`, …) and the directory loader of `aplc serve` both link here,
//! so every command finds and checks agents the same way.

use std::path::{Path, PathBuf};

use aplc_compiler::{Child, Linked, Options, Resolve};
use aplc_runtime::link::{AgentDirs, AgentFile};

/// Where to look for agents and which to link besides those the source names.
#[derive(Debug, Clone, Default)]
pub struct LinkOptions {
    /// Directories searched after the compiled file's own (`--agents DIR`).
    pub agent_dirs: Vec<PathBuf>,
    /// Names to link though no `call_agent` names them: a manifest's `{"agent": …}`.
    pub extra_names: Vec<String>,
}

struct Reader(AgentDirs);

impl Resolve for Reader {
    fn resolve(&mut self, name: &str) -> Result<Option<Child>, String> {
        Ok(self.0.read(name)?.map(|file| match file {
            AgentFile::Source { source, file_name } => Child::Source { source, file_name },
            AgentFile::Bundle { bundle, file_name } => Child::Bundle { bundle, file_name },
        }))
    }

    fn searched(&self, name: &str) -> String {
        self.0.searched(name)
    }
}

/// Compiles `source` (the file at `path`, shown as `file_name`) and links the agents it
/// names, found beside `path` and then in `link.agent_dirs`.
pub fn compile_and_link(
    source: &str,
    path: &Path,
    file_name: &str,
    options: &Options,
    link: &LinkOptions,
) -> Linked {
    let compilation = aplc_compiler::compile(source, file_name, options);
    let mut reader = Reader(AgentDirs::beside(path, &link.agent_dirs));
    aplc_compiler::link(
        compilation,
        file_name,
        &link.extra_names,
        options,
        &mut reader,
    )
}

/// Every report of `linked` as text: the root file's, then each agent's under its own
/// file name.
pub fn render_linked(linked: &Linked, file_name: &str, source: &str, color: bool) -> String {
    let mut out = aplc_compiler::render(&linked.diagnostics, file_name, source, color);
    for child in &linked.children {
        out.push_str(&aplc_compiler::render(
            &child.diagnostics,
            &child.file_name,
            &child.source,
            color,
        ));
    }
    out
}
