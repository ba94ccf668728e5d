//! Finding agents on disk for the linker (`spec/agents.md` §2.2): the one place the CLI
//! (`aplc build`, `check`, `run`, …) and `aplc serve` turn an agent name into a file.
//! The runtime never compiles source: it reads the file, and the compiler's linker
//! (`aplc_compiler::link`, driven by `aplc_server::compile_and_link`) does the rest.
//!
//! A name `n` is `n.apl` or `n.aplb` in the first directory that has either: the parent's
//! own directory, then each `--agents DIR` in the order given. Where a directory holds
//! both, the `.apl` wins: the source is the truth, and a bundle beside it is most likely
//! an older build of it.

use std::path::{Path, PathBuf};

use aplc_vm::bundle::{self, Bundle};

use crate::files::{MAX_INPUT_LEN, into_text, read_at_most};

/// An agent's file, read.
#[derive(Debug, Clone)]
pub enum AgentFile {
    /// `name.apl`: its text and the file name messages show.
    Source {
        /// The text.
        source: String,
        /// The path as found.
        file_name: String,
    },
    /// `name.aplb`, decoded (and so validated).
    Bundle {
        /// The bundle.
        bundle: Bundle,
        /// The path as found.
        file_name: String,
    },
}

/// Finds agents by name in the `.apl` and `.aplb` files of a list of directories.
#[derive(Debug, Clone)]
pub struct AgentDirs {
    dirs: Vec<PathBuf>,
}

impl AgentDirs {
    /// Looks in `dirs`, in order.
    pub fn new(dirs: Vec<PathBuf>) -> AgentDirs {
        AgentDirs { dirs }
    }

    /// Looks beside `parent` (the file being compiled), then in `agent_dirs`.
    pub fn beside(parent: &Path, agent_dirs: &[PathBuf]) -> AgentDirs {
        let own = match parent.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let mut dirs = vec![own];
        dirs.extend(agent_dirs.iter().cloned());
        AgentDirs { dirs }
    }

    /// The first existing `name.apl` or `name.aplb`, the source first in each directory.
    fn find(&self, name: &str) -> Option<PathBuf> {
        self.dirs.iter().find_map(|dir| {
            ["apl", "aplb"]
                .into_iter()
                .map(|ext| dir.join(format!("{name}.{ext}")))
                .find(|path| path.is_file())
        })
    }

    /// Reads the agent called `name` (a valid agent name, so a plain file stem):
    /// `Ok(None)` when no directory has it, `Err` when its file cannot be read, is too
    /// large, is not UTF-8, or is not a valid bundle.
    pub fn read(&self, name: &str) -> Result<Option<AgentFile>, String> {
        let Some(path) = self.find(name) else {
            return Ok(None);
        };
        let file_name = path.display().to_string();
        let bytes = read_at_most(&path, MAX_INPUT_LEN, "files").map_err(|e| e.to_string())?;
        if path.extension().is_some_and(|ext| ext == "aplb") {
            let bundle = bundle::decode(&bytes).map_err(|e| format!("{file_name}: {e}"))?;
            return Ok(Some(AgentFile::Bundle { bundle, file_name }));
        }
        let source = into_text(&path, bytes).map_err(|e| e.to_string())?;
        Ok(Some(AgentFile::Source { source, file_name }))
    }

    /// Where [`AgentDirs::read`] looks for `name`, for the note of a missing agent.
    pub fn searched(&self, name: &str) -> String {
        let dirs = self
            .dirs
            .iter()
            .map(|d| format!("`{}`", d.display()))
            .collect::<Vec<_>>()
            .join(", ");
        format!("looked for `{name}.apl` and `{name}.aplb` in {dirs}")
    }
}

/// The `{"agent": name}` entries of a tool manifest's JSON array, in order: the agents
/// a manifest makes tools of, which the linker links too. Anything else in the text
/// (other entries, other keys, no array at all) is left to the manifest's own parser.
pub fn manifest_agent_names(manifest: &str) -> Vec<String> {
    let Ok(serde_json::Value::Array(entries)) = serde_json::from_str(manifest) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| entry.get("agent")?.as_str().map(str::to_string))
        .collect()
}
