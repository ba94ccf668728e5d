//! The agents a server hosts: every `.aplb` and `.apl` file of its directory, by file
//! name without the extension, reloaded when a file changes.
//!
//! Changes are found by polling the files' modification times and sizes every
//! `reload_interval` (500 ms by default) rather than with OS notifications (`notify`):
//! polling one directory is cheap, works the same on every OS and file system (network
//! mounts and container volumes included, where notifications are unreliable), and
//! needs no crate. A new version serves new runs only: a run resumes on the bundle the
//! store keeps for it.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use aplc_runtime::durable::bundle_hash;
use aplc_runtime::files::{MAX_INPUT_LEN, read_at_most};
use aplc_vm::Program;
use aplc_vm::text::truncate_chars;

use crate::ServeError;
use crate::link::{LinkOptions, compile_and_link, render_linked};

/// The longest error about one agent file that goes to the log, in characters.
const MAX_LOGGED_ERROR: usize = 4_000;

/// One hosted agent.
#[derive(Debug)]
pub(crate) struct Agent {
    pub(crate) name: String,
    pub(crate) program: Arc<Program>,
    /// The content hash the store keeps its bundle under.
    pub(crate) hash: String,
    pub(crate) inputs: Vec<String>,
    pub(crate) steps: Vec<String>,
    /// The agent's description, from its first preamble comment (the bundle's).
    pub(crate) description: Option<String>,
}

impl Agent {
    /// The declared inputs `context` lacks, in declaration order.
    pub(crate) fn missing_inputs<'a>(
        &'a self,
        context: &serde_json::Map<String, serde_json::Value>,
    ) -> Vec<&'a str> {
        self.inputs
            .iter()
            .filter(|input| !context.contains_key(*input))
            .map(String::as_str)
            .collect()
    }
}

/// Why `context` cannot be a run's initial context: the first entry a run cannot set
/// (`context_history`, a reserved variable, a helper's name), by the VM's own rule
/// ([`aplc_vm::names::check_settable`]), as `` `context` cannot set `x`: … ``.
pub(crate) fn unsettable(context: &serde_json::Map<String, serde_json::Value>) -> Option<String> {
    context.keys().find_map(|name| {
        aplc_vm::names::check_settable(name)
            .err()
            .map(|problem| format!("`context` cannot set `{name}`: {}", problem.reason()))
    })
}

/// What a file looked like when it was last loaded. Symlinks are followed: the stamp is
/// the target's, with the target's resolved path, so re-pointing a link (a Kubernetes
/// ConfigMap swaps its `..data` link to a new directory) is a change even when the new
/// file has the old one's size and modification time. A link that cannot be resolved (a
/// loop, a dangling target) has an empty stamp and fails to load once, with one log
/// line, until it changes.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
struct Stamp {
    target: Option<PathBuf>,
    modified: Option<SystemTime>,
    len: u64,
}

/// The hosted agents, by name.
#[derive(Debug)]
pub(crate) struct Agents {
    dir: PathBuf,
    by_name: RwLock<BTreeMap<String, Arc<Agent>>>,
    /// Every agent file seen, loaded or not, with its stamp: a file that failed is not
    /// compiled again until it changes.
    seen: std::sync::Mutex<HashMap<PathBuf, Stamp>>,
}

impl Agents {
    /// Loads every agent of `dir`. A file that fails is logged and skipped; a directory
    /// that cannot be read is an error.
    pub(crate) fn load(dir: PathBuf) -> Result<Arc<Agents>, ServeError> {
        if !dir.is_dir() {
            return Err(ServeError::Config(format!(
                "--agents {}: not a directory",
                dir.display()
            )));
        }
        let agents = Arc::new(Agents {
            dir,
            by_name: RwLock::new(BTreeMap::new()),
            seen: std::sync::Mutex::new(HashMap::new()),
        });
        agents.rescan();
        let count = agents.list().len();
        tracing::info!(agents = count, dir = %agents.dir.display(), "agents loaded");
        Ok(agents)
    }

    /// The agent named `name`.
    pub(crate) fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(name)
            .cloned()
    }

    /// Every agent's program, by name: the agents a run may call by a name computed at
    /// run time (`spec/agents.md` §2), as the directory serves them now.
    pub(crate) fn table(&self) -> Arc<aplc_vm::AgentTable> {
        let by_name = self.by_name.read().unwrap_or_else(|e| e.into_inner());
        Arc::new(
            by_name
                .iter()
                .map(|(name, agent)| (name.clone(), agent.program.clone()))
                .collect(),
        )
    }

    /// Every agent, by name.
    pub(crate) fn list(&self) -> Vec<Arc<Agent>> {
        self.by_name
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect()
    }

    /// Loads what changed since the last scan: new and changed files are (re)loaded, the
    /// agents of removed files are dropped. A changed file that no longer loads keeps
    /// its last good version serving, with an error in the log.
    fn rescan(&self) {
        let files = match agent_files(&self.dir) {
            Ok(files) => files,
            Err(e) => {
                tracing::error!(dir = %self.dir.display(), error = %e, "cannot read the agents directory");
                return;
            }
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let mut names: BTreeMap<String, PathBuf> = BTreeMap::new();
        for (path, stamp) in &files {
            let Some(name) = agent_name(path) else {
                continue;
            };
            if let Some(other) = names.get(&name) {
                tracing::warn!(
                    agent = %name,
                    file = %path.display(),
                    kept = %other.display(),
                    "two files define the same agent; this one is skipped"
                );
                continue;
            }
            names.insert(name.clone(), path.clone());
            if seen.get(path) == Some(stamp) {
                continue;
            }
            seen.insert(path.clone(), stamp.clone());
            match load_agent(&name, path) {
                Ok(agent) => {
                    let replaced = self
                        .by_name
                        .write()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(name.clone(), Arc::new(agent));
                    let hash = self.get(&name).map(|a| a.hash.clone()).unwrap_or_default();
                    if replaced.is_some() {
                        tracing::info!(agent = %name, bundle_hash = %hash, "agent reloaded");
                    } else {
                        tracing::info!(agent = %name, bundle_hash = %hash, "agent loaded");
                    }
                }
                Err(message) => {
                    // Bounded: a compiler report quotes source lines, which a hostile or
                    // broken file can make as long as it likes.
                    let message = truncate_chars(&message, MAX_LOGGED_ERROR);
                    tracing::error!(agent = %name, file = %path.display(), "{message}");
                }
            }
        }
        seen.retain(|path, _| files.iter().any(|(p, _)| p == path));
        let mut by_name = self.by_name.write().unwrap_or_else(|e| e.into_inner());
        let removed: Vec<String> = by_name
            .keys()
            .filter(|name| !names.contains_key(*name))
            .cloned()
            .collect();
        for name in removed {
            by_name.remove(&name);
            tracing::info!(agent = %name, "agent removed");
        }
    }
}

/// Rescans `agents` every `interval` until `stop`.
pub(crate) async fn watch(
    agents: Arc<Agents>,
    interval: Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        let agents = agents.clone();
        // Compiling is CPU work and reading is file I/O: off the async workers.
        let _ = tokio::task::spawn_blocking(move || agents.rescan()).await;
    }
}

/// The `.apl` and `.aplb` files of `dir`, sorted by path, with their stamps: regular
/// files and symlinks to regular files (followed; the OS refuses a symlink loop with
/// `ELOOP` after a bounded number of hops, so a loop cannot hang a scan). Directories and
/// other file types are skipped; a symlink that does not resolve is listed with an empty
/// stamp, so that loading it reports why once.
fn agent_files(dir: &Path) -> std::io::Result<Vec<(PathBuf, Stamp)>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if agent_name(&path).is_none() {
            continue;
        }
        let stamp = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => Stamp {
                target: std::fs::canonicalize(&path).ok(),
                modified: meta.modified().ok(),
                len: meta.len(),
            },
            Ok(_) => continue,
            Err(_) => Stamp::default(),
        };
        files.push((path, stamp));
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(files)
}

/// The agent a file defines: its name without `.apl`/`.aplb`, if that is a name a URL
/// path segment carries as is.
fn agent_name(path: &Path) -> Option<String> {
    let ext = path.extension()?.to_str()?;
    if ext != "apl" && ext != "aplb" {
        return None;
    }
    let stem = path.file_stem()?.to_str()?;
    aplc_vm::names::is_agent_name(stem).then(|| stem.to_string())
}

/// Loads a bundle or compiles source; the error is the message to log (with the
/// compiler's diagnostics).
fn load_agent(name: &str, path: &Path) -> Result<Agent, String> {
    // The CLI's input limit: a huge (or sparse) file is refused from its size, unread.
    let bytes = read_at_most(path, MAX_INPUT_LEN, "files").map_err(|e| format!("{e}; skipped"))?;
    let program = if aplc_vm::bundle::is_bundle(&bytes) {
        Program::load(&bytes).map_err(|e| format!("unreadable bundle: {e}"))?
    } else {
        let source = String::from_utf8(bytes).map_err(|_| "the file is not UTF-8".to_string())?;
        if source.len() > aplc_compiler::MAX_SOURCE_LEN {
            // Not compiled: the compiler would refuse it too, with a report that quotes
            // the first line, which can be the whole file.
            return Err(format!(
                "the source is {} bytes; aplc compiles files of at most {} bytes; skipped",
                source.len(),
                aplc_compiler::MAX_SOURCE_LEN
            ));
        }
        let file_name = path
            .file_name()
            .map_or_else(|| name.to_string(), |n| n.to_string_lossy().into_owned());
        let options = aplc_compiler::Options::for_run(false);
        // The agents it names are linked from this same directory (`spec/agents.md` §2).
        let linked = compile_and_link(&source, path, &file_name, &options, &LinkOptions::default());
        let Some(bundle) = linked.bundle else {
            let report = render_linked(&linked, &file_name, &source, false);
            return Err(format!("does not compile; skipped:\n{report}"));
        };
        Program::from_bundle(bundle, aplc_vm::Limits::default()).map_err(|e| e.to_string())?
    };
    let encoded = aplc_vm::bundle::encode(program.bundle()).map_err(|e| e.to_string())?;
    let bundle = program.bundle();
    Ok(Agent {
        name: name.to_string(),
        hash: bundle_hash(&encoded),
        inputs: bundle.inputs.clone(),
        steps: bundle.steps.iter().map(|s| s.name.clone()).collect(),
        description: bundle.description.clone(),
        program: Arc::new(program),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_agent_files_only() {
        assert_eq!(
            agent_name(Path::new("d/greet.apl")).as_deref(),
            Some("greet")
        );
        assert_eq!(
            agent_name(Path::new("d/greet.v2.aplb")).as_deref(),
            Some("greet.v2")
        );
        assert_eq!(agent_name(Path::new("d/notes.md")), None);
        assert_eq!(agent_name(Path::new("d/has space.apl")), None);
        assert_eq!(agent_name(Path::new("d/.apl")), None);
    }

    /// The served directory is where a served agent's agents are found: `chain` links
    /// `translator` beside it, and one calling an agent the directory lacks is skipped
    /// with the linker's report in the log's message.
    #[test]
    fn a_directory_of_agents_links_them_to_each_other() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/agents");
        let dir = tempfile::tempdir().unwrap();
        for file in ["chain.apl", "translator.apl", "err_missing.apl"] {
            std::fs::copy(fixtures.join(file), dir.path().join(file)).unwrap();
        }
        let agents = Agents::load(dir.path().to_path_buf()).unwrap();
        let chain = agents.get("chain").expect("chain is served");
        let linked: Vec<&str> = chain
            .program
            .bundle()
            .agents
            .iter()
            .map(|a| a.name.as_str())
            .collect();
        assert_eq!(linked, ["translator"]);
        assert!(agents.get("translator").is_some());
        assert!(agents.get("err_missing").is_none());
        let err = load_agent("err_missing", &dir.path().join("err_missing.apl")).unwrap_err();
        assert!(
            err.contains("[APL0027] Error: Unknown agent: nowhere"),
            "{err}"
        );
    }
}
