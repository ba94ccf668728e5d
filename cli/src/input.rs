//! Reading input files, writing output files atomically, and printing diagnostics,
//! shared by every command.

use std::io::{IsTerminal, Write};
use std::path::Path;

use std::borrow::Cow;

use aplc_compiler::{Diagnostic, render};
use aplc_vm::text::escape_control;

use crate::Failure;

use aplc_runtime::files::MAX_INPUT_LEN;

pub(crate) fn print_diagnostics(diagnostics: &[Diagnostic], file: &Path, source: &str) {
    if diagnostics.is_empty() {
        return;
    }
    let color = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let name = display_name(file);
    // Source text, file names and messages may hold escape sequences. The plain report is
    // escaped as a whole; colour (which is made of escape sequences) is only used when
    // there was nothing to escape.
    let plain = render(diagnostics, &name, source, false);
    match escape_control(&plain) {
        Cow::Borrowed(_) if color => eprint!("{}", render(diagnostics, &name, source, true)),
        escaped => eprint!("{escaped}"),
    }
}

/// Prints the reports of a linking (spec/agents.md §2): the root file's, then each
/// agent's under its own file name.
pub(crate) fn print_linked(linked: &aplc_compiler::Linked, file: &Path, source: &str) {
    print_diagnostics(&linked.diagnostics, file, source);
    for child in &linked.children {
        print_diagnostics(
            &child.diagnostics,
            Path::new(&child.file_name),
            &child.source,
        );
    }
}

pub(crate) fn display_name(file: &Path) -> String {
    file.display().to_string()
}

/// Reads a whole input file, refusing files over [`MAX_INPUT_LEN`] bytes (before reading
/// where the file says its size, while reading otherwise).
pub(crate) fn read_bytes(file: &Path) -> Result<Vec<u8>, Failure> {
    read_at_most(file, MAX_INPUT_LEN, "files")
}

/// [`read_bytes`] with another limit, for inputs that cost more memory per byte once
/// parsed; `what` names them in the error.
pub(crate) fn read_at_most(
    file: &Path,
    limit: u64,
    what: &'static str,
) -> Result<Vec<u8>, Failure> {
    aplc_runtime::files::read_at_most(file, limit, what).map_err(|e| Failure::usage(e.to_string()))
}

pub(crate) fn into_text(file: &Path, bytes: Vec<u8>) -> Result<String, Failure> {
    aplc_runtime::files::into_text(file, bytes).map_err(|e| Failure::usage(e.to_string()))
}

pub(crate) fn read_text(file: &Path) -> Result<String, Failure> {
    into_text(file, read_bytes(file)?)
}

/// Reads a JSON input file (`--context`, `--mock`, `--tools`, `--providers`, a test's
/// responses and tools files): [`read_text`], then [`check_unique_keys`].
pub(crate) fn read_json(file: &Path) -> Result<String, Failure> {
    let text = read_text(file)?;
    check_unique_keys(file, &text)?;
    Ok(text)
}

/// Refuses JSON with an object that has a key twice, at any depth. serde_json (like most
/// parsers) keeps the last value: the user would run with other input than the file
/// says, and nothing would tell them. The message names the file, the key, its line and
/// column. Invalid JSON passes: the reader that parses the text reports it in its terms.
pub(crate) fn check_unique_keys(file: &Path, text: &str) -> Result<(), Failure> {
    match serde_json::from_str::<UniqueKeys>(text) {
        Err(e) if e.is_data() => Err(Failure::usage(format!("{}: {e}", file.display()))),
        _ => Ok(()),
    }
}

/// Deserializes any JSON value, failing on an object that has a key twice.
struct UniqueKeys;

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(UniqueKeys)
    }
}

impl<'de> serde::de::Visitor<'de> for UniqueKeys {
    type Value = UniqueKeys;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, _: bool) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_i64<E>(self, _: i64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_u64<E>(self, _: u64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_f64<E>(self, _: f64) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_str<E>(self, _: &str) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_unit<E>(self) -> Result<UniqueKeys, E> {
        Ok(UniqueKeys)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<UniqueKeys, A::Error> {
        while seq.next_element::<UniqueKeys>()?.is_some() {}
        Ok(UniqueKeys)
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<UniqueKeys, A::Error> {
        let mut seen = std::collections::HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                return Err(serde::de::Error::custom(format!(
                    "duplicate key `{}` (refused rather than keep only one of its values)",
                    escape_control(&key)
                )));
            }
            map.next_value::<UniqueKeys>()?;
            seen.insert(key);
        }
        Ok(UniqueKeys)
    }
}

/// Writes `bytes` to `output` through a temporary file in the same directory, renamed
/// over `output` only once it is complete: a failed or interrupted write leaves an
/// existing file as it was. A symlink is written through to its target, as a plain write
/// would, and an existing file keeps its permissions.
pub(crate) fn write_atomically(output: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let target = std::fs::canonicalize(output).unwrap_or_else(|_| output.to_path_buf());
    let dir = match target.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    let existing = std::fs::metadata(&target).ok().map(|m| m.permissions());
    let mut builder = tempfile::Builder::new();
    builder.prefix(".aplc-").suffix(".tmp");
    #[cfg(unix)]
    {
        // tempfile's default is 0600; a new bundle gets what `fs::write` would give it.
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o666));
    }
    // Dropping the temporary file on an error removes it.
    let mut temp = builder.tempfile_in(dir)?;
    temp.write_all(bytes)?;
    if let Some(permissions) = existing {
        temp.as_file().set_permissions(permissions)?;
    }
    temp.as_file().sync_all()?;
    temp.persist(&target).map_err(|e| e.error)?;
    Ok(())
}
