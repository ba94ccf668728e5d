//! `aplc init NAME`: a new agent project to start from.
//!
//! The files are templates kept in `cli/templates/init/`, compiled into the binary. The
//! starter agent has two steps, a loop with a retry limit, and a test file that passes as
//! created (`cli/tests/agent_tests.rs` checks that). Nothing is ever overwritten: if any
//! of the files exists, nothing is written at all.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;

use crate::Failure;

#[derive(Args, Debug)]
pub(crate) struct InitArgs {
    /// The directory to create (it may exist if it holds none of the new files).
    name: PathBuf,
}

/// The files of a new project: name and contents. `{name}` in the README becomes the
/// project's name.
const FILES: [(&str, &str); 4] = [
    ("agent.apl", include_str!("../templates/init/agent.apl")),
    (
        "agent.test.toml",
        include_str!("../templates/init/agent.test.toml"),
    ),
    (
        "providers.json",
        include_str!("../templates/init/providers.json"),
    ),
    ("README.md", include_str!("../templates/init/README.md")),
];

pub(crate) fn init(args: &InitArgs) -> Result<ExitCode, Failure> {
    let dir = &args.name;
    if dir.exists() && !dir.is_dir() {
        return Err(Failure::usage(format!(
            "{} exists and is not a directory; nothing was written",
            dir.display()
        )));
    }
    let existing: Vec<String> = FILES
        .iter()
        .map(|(file, _)| dir.join(file))
        .filter(|path| path.symlink_metadata().is_ok())
        .map(|path| path.display().to_string())
        .collect();
    if !existing.is_empty() {
        return Err(Failure::usage(format!(
            "not overwriting existing files: {}; nothing was written",
            existing.join(", ")
        )));
    }
    std::fs::create_dir_all(dir)
        .map_err(|e| Failure::run(format!("cannot create {}: {e}", dir.display())))?;
    let name = project_name(dir);
    for (file, contents) in FILES {
        let contents = contents.replace("{name}", &name);
        write_new(&dir.join(file), &contents)?;
    }
    eprintln!(
        "created {}: agent.apl, agent.test.toml, providers.json, README.md\n\
         next: cd {} && aplc test",
        dir.display(),
        dir.display()
    );
    Ok(ExitCode::SUCCESS)
}

/// Writes a file that must not exist yet: `create_new` refuses a file that appeared
/// since the check above, rather than overwriting it.
fn write_new(path: &Path, contents: &str) -> Result<(), Failure> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| Failure::usage(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(contents.as_bytes())
        .map_err(|e| Failure::run(format!("cannot write {}: {e}", path.display())))
}

fn project_name(dir: &Path) -> String {
    std::path::absolute(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| "agent".to_string())
}
