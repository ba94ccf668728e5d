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
        /// The bundle (boxed: it is much larger than a source's two strings).
        bundle: Box<Bundle>,
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
            return Ok(Some(AgentFile::Bundle {
                bundle: Box::new(bundle),
                file_name,
            }));
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

/// The agents a tool manifest makes tools of: the `"agent"` string of each entry, in
/// order, the entries being the values of the manifest's object (`{"translate":
/// {"agent": "translator"}}`, spec/tools.md) or the items of an array. Anything else
/// (other entries, other keys, invalid JSON) is left to the manifest's own parser; the
/// linker links these names too (`spec/agents.md` §2).
pub fn manifest_agent_names(manifest: &str) -> Vec<String> {
    let entries: Vec<serde_json::Value> = match serde_json::from_str(manifest) {
        Ok(serde_json::Value::Object(tools)) => tools.into_iter().map(|(_, v)| v).collect(),
        Ok(serde_json::Value::Array(entries)) => entries,
        _ => return Vec::new(),
    };
    entries
        .iter()
        .filter_map(|entry| entry.get("agent")?.as_str().map(str::to_string))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_agents_are_the_agent_strings_of_its_entries() {
        let object =
            r#"{"calc": {"command": ["c"]}, "tr": {"agent": "translator"}, "x": {"agent": 3}}"#;
        assert_eq!(manifest_agent_names(object), ["translator"]);
        let array = r#"[{"agent": "a"}, {"url": "http://x"}, 1, {"agent": "b"}]"#;
        assert_eq!(manifest_agent_names(array), ["a", "b"]);
        assert!(manifest_agent_names("not json").is_empty());
    }

    #[test]
    fn the_source_wins_over_a_bundle_and_the_own_directory_over_agents_dirs() {
        let own = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        std::fs::write(own.path().join("t.aplb"), b"not a bundle").unwrap();
        std::fs::write(own.path().join("t.apl"), "# prompt: a\nhi\n").unwrap();
        std::fs::write(other.path().join("t.apl"), "# prompt: b\nhi\n").unwrap();
        std::fs::write(other.path().join("u.aplb"), b"not a bundle").unwrap();
        let dirs = AgentDirs::beside(&own.path().join("parent.apl"), &[other.path().into()]);
        match dirs.read("t") {
            Ok(Some(AgentFile::Source { source, .. })) => assert!(source.contains("# prompt: a")),
            other => panic!("{other:?}"),
        }
        // A bundle that does not decode is an error naming the file, not a missing agent.
        let err = dirs.read("u").unwrap_err();
        assert!(err.contains("u.aplb"), "{err}");
        assert!(dirs.read("v").unwrap().is_none());
        assert!(
            dirs.searched("v")
                .contains(&other.path().display().to_string())
        );
    }
}
