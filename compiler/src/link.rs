//! The linker: resolves the agents a program names at build time, compiles them, checks
//! each call against the agent it names, and puts them all in the root's bundle
//! (`spec/agents.md` §2).
//!
//! Pure: the caller's [`Resolve`] finds an agent by name (a file beside the parent, a
//! served directory, a test's map), and the linker never touches a file itself. Every
//! problem is a diagnostic at the reference that caused it, in the file that holds it.

use std::collections::{BTreeMap, VecDeque};

use aplc_vm::bundle::{Bundle, LinkedAgent, MAX_LINKED_AGENTS};
use aplc_vm::names::is_agent_name;

use crate::agents::AgentName;
use crate::diagnostic::{Code, Diagnostic, Span};
use crate::{Compilation, Options, compile};

/// An agent as a resolver found it.
#[derive(Debug, Clone)]
pub enum Child {
    /// `.apl` source, compiled by the linker with the root's options.
    Source {
        /// The text.
        source: String,
        /// The file name messages show (`translator.apl`).
        file_name: String,
    },
    /// A bundle built earlier (`.aplb`); its own linked agents join the root's table.
    Bundle {
        /// The decoded bundle (boxed: it is much larger than a source's two strings).
        bundle: Box<Bundle>,
        /// The file name messages show (`translator.aplb`).
        file_name: String,
    },
}

/// Finds agents by name for [`link`].
pub trait Resolve {
    /// The agent called `name` (a valid agent name): `Ok(None)` when there is none,
    /// `Err` when there is one that cannot be read.
    fn resolve(&mut self, name: &str) -> Result<Option<Child>, String>;
    /// Where [`Resolve::resolve`] looked for `name`, for the note of a missing agent.
    fn searched(&self, name: &str) -> String;
}

/// The diagnostics of one linked agent's source file.
#[derive(Debug, Clone)]
pub struct ChildReport {
    /// The agent's name.
    pub name: String,
    /// Its file name, as the resolver gave it.
    pub file_name: String,
    /// Its text, for rendering.
    pub source: String,
    /// Its own diagnostics, then the problems of the references it holds.
    pub diagnostics: Vec<Diagnostic>,
}

/// The result of [`link`].
#[derive(Debug)]
pub struct Linked {
    /// The root's bundle with every agent linked, when no file has an error.
    pub bundle: Option<Bundle>,
    /// The root file's diagnostics: its compilation's, then the linking's.
    pub diagnostics: Vec<Diagnostic>,
    /// The agents' source files that have diagnostics, by name.
    pub children: Vec<ChildReport>,
}

impl Linked {
    /// True when any file has an error.
    pub fn has_errors(&self) -> bool {
        self.diagnostics
            .iter()
            .chain(self.children.iter().flat_map(|c| &c.diagnostics))
            .any(Diagnostic::is_error)
    }
}

/// A reference to an agent by a name known at build time.
#[derive(Debug, Clone)]
struct Ref {
    /// The agent whose file holds the reference; `None` for the root.
    from: Option<String>,
    name: String,
    span: Span,
    /// The literal context's keys, when known; `None` also for manifest entries.
    keys: Option<Vec<String>>,
    /// Named by a tool manifest (`--tools`), not by a `call_agent` in a file.
    manifest: bool,
}

/// What a name resolved to.
#[derive(Debug)]
enum Resolution {
    /// The root itself (a name equal to its file stem): any reference to it is a cycle.
    Root,
    Missing,
    Unreadable(String),
    Found(Box<Node>),
}

/// A resolved agent.
#[derive(Debug)]
struct Node {
    file_name: String,
    /// The source of an `.apl` agent (none for an `.aplb`).
    source: Option<String>,
    /// `None` when it does not compile.
    bundle: Option<Bundle>,
    diagnostics: Vec<Diagnostic>,
    /// The agents an `.aplb` agent brings linked.
    brought: Vec<LinkedAgent>,
}

/// [`link`] over sources held in memory: `root` (shown as `root_file`) with `agents`,
/// `(name, source)` pairs, as the agents it may name (each shown as `NAME.apl`). For
/// embedders and tests that keep a tree of agents as strings, not files.
pub fn link_sources(
    root: &str,
    root_file: &str,
    agents: &[(&str, &str)],
    options: &Options,
) -> Linked {
    struct Sources<'a>(&'a [(&'a str, &'a str)]);
    impl Resolve for Sources<'_> {
        fn resolve(&mut self, name: &str) -> Result<Option<Child>, String> {
            Ok(self
                .0
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(n, source)| Child::Source {
                    source: (*source).to_owned(),
                    file_name: format!("{n}.apl"),
                }))
        }
        fn searched(&self, name: &str) -> String {
            format!("`{name}` is not among the agents given")
        }
    }
    let compilation = compile(root, root_file, options);
    link(compilation, root_file, &[], options, &mut Sources(agents))
}

/// Links `root` (compiled from `root_file` with `options`): resolves every agent named
/// by a literal `call_agent` and every name of `extra_names` (the `{"agent": …}` entries
/// of tool manifests), transitively, and returns the root's bundle with all of them in
/// its flat table of agents, or the diagnostics that prevent it.
pub fn link(
    root: Compilation,
    root_file: &str,
    extra_names: &[String],
    options: &Options,
    resolver: &mut dyn Resolve,
) -> Linked {
    let root_stem = stem(root_file);
    let mut refs = root_refs(&root, extra_names);
    let mut table: BTreeMap<String, Resolution> = BTreeMap::new();
    let child_options = Options {
        inputs: Vec::new(),
        ..options.clone()
    };
    let mut queue: VecDeque<String> = refs.iter().map(|r| r.name.clone()).collect();
    while let Some(name) = queue.pop_front() {
        if table.contains_key(&name) || !is_agent_name(&name) {
            continue;
        }
        let resolution = if name == root_stem {
            Resolution::Root
        } else if table.len() >= MAX_LINKED_AGENTS {
            Resolution::Unreadable(format!("more than {MAX_LINKED_AGENTS} agents to link"))
        } else {
            resolve(&name, resolver, &child_options, &mut refs, &mut queue)
        };
        table.insert(name, resolution);
    }
    let mut linker = Linker {
        root_diagnostics: root.diagnostics,
        table,
        resolver,
    };
    for r in &refs {
        linker.check_ref(r);
    }
    linker.cycles(&refs, &root_stem);
    linker.finish(root.bundle, &refs)
}

/// The root's references: its literal `call_agent` names, then the manifests' names.
fn root_refs(root: &Compilation, extra_names: &[String]) -> Vec<Ref> {
    let calls = root.agent_calls.iter().filter_map(|call| match &call.name {
        AgentName::Literal(name) => Some(Ref {
            from: None,
            name: name.clone(),
            span: call.span,
            keys: call.keys.clone(),
            manifest: false,
        }),
        AgentName::Dynamic => None,
    });
    let manifest = extra_names.iter().map(|name| Ref {
        from: None,
        name: name.clone(),
        span: Span::new(0, 0),
        keys: None,
        manifest: true,
    });
    calls.chain(manifest).collect()
}

/// Resolves and compiles one agent, queueing the names it calls.
fn resolve(
    name: &str,
    resolver: &mut dyn Resolve,
    options: &Options,
    refs: &mut Vec<Ref>,
    queue: &mut VecDeque<String>,
) -> Resolution {
    match resolver.resolve(name) {
        Ok(None) => Resolution::Missing,
        Err(message) => Resolution::Unreadable(message),
        Ok(Some(Child::Bundle {
            mut bundle,
            file_name,
        })) => {
            let brought = std::mem::take(&mut bundle.agents);
            Resolution::Found(Box::new(Node {
                file_name,
                source: None,
                bundle: Some(*bundle),
                diagnostics: Vec::new(),
                brought,
            }))
        }
        Ok(Some(Child::Source { source, file_name })) => {
            // The bundle records the file's name, not where this machine keeps it.
            let compilation = compile(&source, base_name(&file_name), options);
            for call in &compilation.agent_calls {
                if let AgentName::Literal(callee) = &call.name {
                    queue.push_back(callee.clone());
                    refs.push(Ref {
                        from: Some(name.to_string()),
                        name: callee.clone(),
                        span: call.span,
                        keys: call.keys.clone(),
                        manifest: false,
                    });
                }
            }
            Resolution::Found(Box::new(Node {
                file_name,
                source: Some(source),
                bundle: compilation.bundle,
                diagnostics: compilation.diagnostics,
                brought: Vec::new(),
            }))
        }
    }
}

struct Linker<'r> {
    root_diagnostics: Vec<Diagnostic>,
    table: BTreeMap<String, Resolution>,
    resolver: &'r mut dyn Resolve,
}

impl Linker<'_> {
    /// Reports `diagnostic` in the file that holds `r`.
    fn report(&mut self, r: &Ref, diagnostic: Diagnostic) {
        let diagnostic = if r.manifest {
            diagnostic.with_note("the agent is named by a tool manifest given with `--tools`")
        } else {
            diagnostic
        };
        match r.from.as_ref().and_then(|from| self.table.get_mut(from)) {
            Some(Resolution::Found(node)) => node.diagnostics.push(diagnostic),
            _ => self.root_diagnostics.push(diagnostic),
        }
    }

    /// Checks one reference against what its name resolved to.
    fn check_ref(&mut self, r: &Ref) {
        if !is_agent_name(&r.name) {
            let d = Diagnostic::error(
                Code::InvalidAgentName,
                format!("Invalid agent name: {:?}", r.name),
                r.span,
            )
            .with_label_message("not an agent name")
            .with_note("an agent name is 1 to 128 ASCII letters, digits, `-`, `_` and `.`: the stem of its `.apl` file");
            return self.report(r, d);
        }
        let d = match self.table.get(&r.name) {
            Some(Resolution::Missing) => Some(
                Diagnostic::error(
                    Code::UnknownAgent,
                    format!("Unknown agent: {}", r.name),
                    r.span,
                )
                .with_label_message(format!("no `{0}.apl` or `{0}.aplb` is found", r.name))
                .with_note(self.resolver.searched(&r.name)),
            ),
            Some(Resolution::Unreadable(message)) => Some(not_linked(r, message)),
            Some(Resolution::Found(node)) => check_found(r, node),
            Some(Resolution::Root) | None => None,
        };
        if let Some(d) = d {
            self.report(r, d);
        }
    }

    /// Reports every cycle of literal delegations once, at the reference that closes it.
    fn cycles(&mut self, refs: &[Ref], root_stem: &str) {
        let mut state: BTreeMap<Option<String>, Visit> = BTreeMap::new();
        let mut path = Vec::new();
        let mut found = Vec::new();
        visit(None, refs, root_stem, &mut state, &mut path, &mut found);
        for (r, cycle) in found {
            let d = Diagnostic::error(
                Code::AgentCycle,
                format!("Agent cycle: {}", cycle.join(" → ")),
                r.span,
            )
            .with_label_message(format!("this call of `{}` closes the cycle", r.name))
            .with_note("agents that delegate to each other by literal names would never end; a bounded recursion must name its agent at run time (`--max-agent-depth`)");
            self.report(&r, d);
        }
    }

    /// The linked bundle and every report.
    fn finish(mut self, root: Option<Bundle>, refs: &[Ref]) -> Linked {
        let agents = self.agents(refs);
        let mut children = Vec::new();
        for (name, resolution) in &mut self.table {
            if let Resolution::Found(node) = resolution
                && let Some(source) = node.source.take()
                && !node.diagnostics.is_empty()
            {
                node.diagnostics.sort_by_key(|d| d.span().start);
                children.push(ChildReport {
                    name: name.clone(),
                    file_name: node.file_name.clone(),
                    source,
                    diagnostics: std::mem::take(&mut node.diagnostics),
                });
            }
        }
        let mut linked = Linked {
            bundle: None,
            diagnostics: self.root_diagnostics,
            children,
        };
        if !linked.has_errors() {
            linked.bundle = root.map(|mut bundle| {
                bundle.agents = agents;
                bundle
            });
        }
        linked
    }

    /// The flat table: every agent found, and those `.aplb` agents bring, which must
    /// agree with any of the same name.
    fn agents(&mut self, refs: &[Ref]) -> Vec<LinkedAgent> {
        let mut agents: BTreeMap<String, Bundle> = self
            .table
            .iter()
            .filter_map(|(name, r)| match r {
                Resolution::Found(node) => Some((name.clone(), node.bundle.clone()?)),
                _ => None,
            })
            .collect();
        let mut conflicts = Vec::new();
        for (name, resolution) in &self.table {
            let Resolution::Found(node) = resolution else {
                continue;
            };
            for brought in &node.brought {
                match agents.get(&brought.name) {
                    Some(b) if *b != brought.bundle => {
                        conflicts.push((
                            name.clone(),
                            node.file_name.clone(),
                            brought.name.clone(),
                        ));
                    }
                    Some(_) => {}
                    None => {
                        agents.insert(brought.name.clone(), brought.bundle.clone());
                    }
                }
            }
        }
        for (name, file, other) in conflicts {
            let message = format!(
                "`{file}` links its own agent `{other}`, which differs from the `{other}` linked here"
            );
            for r in refs.iter().filter(|r| r.name == name) {
                self.report(r, not_linked(r, &message));
            }
        }
        agents
            .into_iter()
            .map(|(name, bundle)| LinkedAgent { name, bundle })
            .collect()
    }
}

/// The problem with a reference to an agent that was found, if any: it does not
/// compile, or the call's literal context lacks inputs it declares.
fn check_found(r: &Ref, node: &Node) -> Option<Diagnostic> {
    let Some(bundle) = &node.bundle else {
        return Some(
            not_linked(r, &format!("`{}` does not compile", node.file_name)).with_note(format!(
                "its own diagnostics are reported in `{}`",
                node.file_name
            )),
        );
    };
    let keys = r.keys.as_ref()?;
    let missing: Vec<&str> = bundle
        .inputs
        .iter()
        .filter(|input| !keys.contains(input))
        .map(String::as_str)
        .collect();
    if missing.is_empty() {
        return None;
    }
    let list = missing
        .iter()
        .map(|m| format!("`{m}`"))
        .collect::<Vec<_>>()
        .join(", ");
    Some(
        Diagnostic::error(
            Code::MissingAgentInputs,
            format!("agent `{}` needs inputs this call does not give: {list}", r.name),
            r.span,
        )
        .with_label_message(format!("the context given to `{}` lacks {list}", r.name))
        .with_note(format!(
            "`{}` declares `{{# inputs: {} #}}`; a run of it without them fails before its first step",
            node.file_name,
            bundle.inputs.join(", ")
        ))
        .with_help(format!("add {list} to the call's `'context'`")),
    )
}

fn not_linked(r: &Ref, why: &str) -> Diagnostic {
    Diagnostic::error(
        Code::AgentNotLinked,
        format!("agent `{}` cannot be linked: {why}", r.name),
        r.span,
    )
    .with_label_message("called here")
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Visit {
    Open,
    Done,
}

/// Depth-first walk of the literal delegations from `node` (`None`: the root), pushing
/// every reference that leads back to an open agent, with the cycle's names.
fn visit(
    node: Option<String>,
    refs: &[Ref],
    root_stem: &str,
    state: &mut BTreeMap<Option<String>, Visit>,
    path: &mut Vec<String>,
    found: &mut Vec<(Ref, Vec<String>)>,
) {
    state.insert(node.clone(), Visit::Open);
    path.push(node.clone().unwrap_or_else(|| root_stem.to_string()));
    for r in refs
        .iter()
        .filter(|r| r.from == node && is_agent_name(&r.name))
    {
        // The root's own name is the root.
        let next = (r.name != root_stem).then(|| r.name.clone());
        match state.get(&next) {
            Some(Visit::Open) => {
                let shown = next.as_deref().unwrap_or(root_stem);
                let start = path.iter().position(|p| p == shown).unwrap_or(0);
                let mut cycle = path[start..].to_vec();
                cycle.push(shown.to_string());
                found.push((r.clone(), cycle));
            }
            Some(Visit::Done) => {}
            None => visit(next, refs, root_stem, state, path, found),
        }
    }
    path.pop();
    state.insert(node, Visit::Done);
}

/// A path's last component: `dir/chain.apl` → `chain.apl`.
fn base_name(file_name: &str) -> &str {
    file_name.rsplit(['/', '\\']).next().unwrap_or(file_name)
}

/// A file name's stem: `dir/chain.apl` → `chain`.
fn stem(file_name: &str) -> String {
    let base = base_name(file_name);
    base.strip_suffix(".aplb")
        .or_else(|| base.strip_suffix(".apl"))
        .unwrap_or(base)
        .to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    /// Agents from a map of name → source (`.apl`) or bundle (`.aplb`).
    #[derive(Default)]
    struct Map {
        sources: HashMap<String, String>,
        bundles: HashMap<String, Bundle>,
        asked: Vec<String>,
    }

    impl Resolve for Map {
        fn resolve(&mut self, name: &str) -> Result<Option<Child>, String> {
            self.asked.push(name.to_string());
            if let Some(bundle) = self.bundles.get(name) {
                return Ok(Some(Child::Bundle {
                    bundle: Box::new(bundle.clone()),
                    file_name: format!("{name}.aplb"),
                }));
            }
            Ok(self.sources.get(name).map(|source| Child::Source {
                source: source.clone(),
                file_name: format!("agents/{name}.apl"),
            }))
        }

        fn searched(&self, name: &str) -> String {
            format!("looked for {name} in the map")
        }
    }

    fn caller(agent: &str, context: &str) -> String {
        format!(
            "{{# inputs: x #}}\n# prompt: s\nhi\n# post: s\n{{{{ set_context('call_agent', {{'agent': '{agent}', 'context': {context}}}) }}}}\n"
        )
    }

    fn leaf(inputs: &str) -> String {
        format!(
            "{{# inputs: {inputs} #}}\n# prompt: t\n{{{{ {} }}}}\n",
            inputs.replace(", ", " ~ ")
        )
    }

    fn link_with(root: &str, extra: &[String], map: &mut Map) -> Linked {
        let options = Options::default();
        let compilation = compile(root, "root.apl", &options);
        link(compilation, "dir/root.apl", extra, &options, map)
    }

    fn codes(linked: &Linked) -> Vec<&'static str> {
        linked
            .diagnostics
            .iter()
            .chain(linked.children.iter().flat_map(|c| &c.diagnostics))
            .map(|d| d.code.as_str())
            .collect()
    }

    #[test]
    fn agents_link_transitively_into_one_flat_sorted_table() {
        let mut map = Map::default();
        map.sources
            .insert("b".into(), caller("c", "{'x': 1, 'y': 2}"));
        map.sources.insert("c".into(), leaf("x, y"));
        map.sources
            .insert("a".into(), caller("c", "{'x': 1, 'y': 2, 'z': 3}"));
        let root = format!(
            "{}{}",
            caller("b", "{'x': 1}"),
            "{{ set_context('call_agent', {'agent': 'a', 'context': {'x': 1}}) }}\n"
        );
        let linked = link_with(&root, &[], &mut map);
        assert!(codes(&linked).is_empty(), "{:?}", linked);
        let bundle = linked.bundle.expect("links");
        let names: Vec<&str> = bundle.agents.iter().map(|a| a.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(bundle.agents.iter().all(|a| a.bundle.agents.is_empty()));
        assert_eq!(bundle.agents[2].bundle.source_name, "c.apl");
        // Each name is resolved once, however many call it.
        assert_eq!(map.asked, ["b", "a", "c"]);
    }

    #[test]
    fn unknown_context_keys_are_not_checked_and_dynamic_names_not_resolved() {
        let mut map = Map::default();
        map.sources.insert("c".into(), leaf("x, y"));
        let root = format!(
            "{}{}",
            caller("c", "x"),
            "{{ set_context('call_agent', {'agent': x}) }}\n"
        );
        let compilation = compile(&root, "root.apl", &Options::default());
        assert_eq!(compilation.agent_calls.len(), 2);
        assert_eq!(compilation.agent_calls[0].keys, None);
        assert_eq!(compilation.agent_calls[1].name, AgentName::Dynamic);
        let linked = link_with(&root, &[], &mut map);
        assert!(codes(&linked).is_empty(), "{:?}", linked);
        assert_eq!(map.asked, ["c"]);
    }

    #[test]
    fn manifest_names_are_linked_and_reported_at_the_file_start() {
        let mut map = Map::default();
        map.sources.insert("c".into(), leaf("x"));
        let root = "# prompt: s\nhi\n";
        let linked = link_with(root, &["c".into()], &mut map);
        assert_eq!(linked.bundle.expect("links").agents.len(), 1);
        let linked = link_with(root, &["gone".into()], &mut map);
        assert_eq!(codes(&linked), ["APL0027"]);
        assert!(
            linked.diagnostics[0]
                .notes
                .iter()
                .any(|n| n.contains("--tools"))
        );
        assert!(linked.bundle.is_none());
    }

    #[test]
    fn a_bundle_brings_its_agents_which_must_agree() {
        let options = Options::default();
        let leaf_bundle = |inputs: &str| compile(&leaf(inputs), "c.apl", &options).bundle.unwrap();
        let mut prebuilt = compile(&caller("c", "{'x': 1}"), "b.apl", &options)
            .bundle
            .unwrap();
        prebuilt.agents = vec![LinkedAgent {
            name: "c".into(),
            bundle: leaf_bundle("x"),
        }];
        let mut map = Map::default();
        map.bundles.insert("b".into(), prebuilt);
        let linked = link_with(&caller("b", "{'x': 1}"), &[], &mut map);
        let names: Vec<String> = linked
            .bundle
            .expect("links")
            .agents
            .into_iter()
            .map(|a| a.name)
            .collect();
        assert_eq!(names, ["b", "c"]);
        // The root also names `c`, found as another program: the two disagree.
        map.sources.insert("c".into(), leaf("x, y"));
        let root = format!(
            "{}{}",
            caller("b", "{'x': 1}"),
            "{{ set_context('call_agent', {'agent': 'c', 'context': {'x': 1, 'y': 1}}) }}\n"
        );
        let linked = link_with(&root, &[], &mut map);
        assert_eq!(codes(&linked), ["APL0028"]);
        assert!(
            linked.diagnostics[0].message.contains("differs"),
            "{:?}",
            linked.diagnostics
        );
    }

    #[test]
    fn a_cycle_is_reported_once_in_the_file_that_closes_it() {
        let mut map = Map::default();
        map.sources.insert("b".into(), caller("c", "{'x': 1}"));
        map.sources.insert("c".into(), caller("b", "{'x': 1}"));
        let linked = link_with(&caller("b", "{'x': 1}"), &[], &mut map);
        assert_eq!(codes(&linked), ["APL0030"]);
        assert_eq!(linked.children[0].name, "c");
        assert!(
            linked.children[0].diagnostics[0]
                .message
                .contains("b → c → b")
        );
    }

    #[test]
    fn sources_in_memory_link_as_files_do() {
        let options = Options::default();
        let root = caller("b", "{'x': 1}");
        let b = leaf("x");
        let linked = link_sources(&root, "root.apl", &[("b", &b)], &options);
        assert!(codes(&linked).is_empty(), "{linked:?}");
        let bundle = linked.bundle.expect("links");
        assert_eq!(bundle.agents[0].name, "b");
        assert_eq!(bundle.agents[0].bundle.source_name, "b.apl");
        // An agent not given is unknown, with a note that says so.
        let linked = link_sources(&root, "root.apl", &[], &options);
        assert_eq!(codes(&linked), ["APL0027"]);
        let notes = format!("{:?}", linked.diagnostics[0]);
        assert!(notes.contains("not among the agents given"), "{notes}");
    }
}
