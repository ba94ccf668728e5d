//! The step graph: where each step's post phase can send the run, where the run can end,
//! and the checks on the graph (unreachable steps, cycles without an exit).
//!
//! Only the post phase decides where a run goes (`next_step` is cleared before it), so
//! the graph is built from the `next_step` writes of post templates. A literal target
//! is an edge to that step; a computed one ([`Jump::Dynamic`]) may lead anywhere, and
//! then reachability cannot be decided. [`StepGraph`] is the public form, built from a
//! bundle so that `aplc graph` and `aplc inspect` work without the source; the checks
//! work on the same per-step [`Flow`]s, with source spans.
//!
//! Not in here: rendering the graph as DOT or Mermaid (the CLI does that).

use std::collections::{HashMap, HashSet};

use aplc_vm::bundle::{Bundle, Edge, EdgeTarget, TemplateKind};

use crate::analyze::{self, Facts, TSpan, Target};
use crate::diagnostic::{Code, Diagnostic, Span};

/// The step graph of a program.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StepGraph {
    /// Steps in source order; the first one is the entry step.
    pub steps: Vec<GraphStep>,
}

/// One step of a [`StepGraph`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphStep {
    /// The step identifier.
    pub name: String,
    /// Where its post phase can send the run, each target once, in source order.
    pub jumps: Vec<Jump>,
    /// Why the run can end after this step; empty when it always jumps on.
    pub ends: Vec<Ending>,
}

/// Where a post phase can send the run.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Jump {
    /// To the step with this index.
    Step(usize),
    /// `return` (or `''`, `none`): the run ends.
    Return,
    /// A computed target: any step, or the end.
    Dynamic,
    /// A literal name no step has: the run fails with `Unknown step: <name>`.
    Unknown(String),
}

/// Why a run can end after a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// The step has no post phase, so nothing sets `next_step`.
    NoPost,
    /// Some path through the post phase leaves `next_step` unset.
    MayLeaveUnset,
    /// The post phase can set `next_step` to `return`.
    Return,
    /// The post phase sets a computed `next_step`, which may be `return` or none.
    Dynamic,
}

impl Ending {
    /// A short explanation, for listings.
    pub fn describe(self) -> &'static str {
        match self {
            Ending::NoPost => "no post phase",
            Ending::MayLeaveUnset => "the post phase may leave next_step unset",
            Ending::Return => "the post phase can jump to return",
            Ending::Dynamic => "the post phase sets a computed next_step",
        }
    }
}

impl StepGraph {
    /// The index of the entry step, if there is a step at all.
    pub fn entry(&self) -> Option<usize> {
        (!self.steps.is_empty()).then_some(0)
    }

    /// Builds the graph of a (validated) bundle from its post templates.
    ///
    /// A post template that does not parse or is too deep (which a bundle from this
    /// compiler never has) falls back to the bundle's stored edges, and is taken to
    /// possibly leave `next_step` unset.
    ///
    /// Linear in the size of the bundle: `aplc graph` and `aplc inspect` run it on
    /// bundles of any size.
    pub fn from_bundle(bundle: &Bundle) -> StepGraph {
        let names: Vec<&str> = bundle.steps.iter().map(|s| s.name.as_str()).collect();
        let index = name_index(names.iter().copied());
        // Each step's first post template, found in one pass: a search per step made
        // `graph` and `inspect` cost steps × templates.
        let mut posts: Vec<Option<&str>> = vec![None; names.len()];
        for t in &bundle.templates {
            if t.kind == TemplateKind::Post
                && let Some(slot @ None) = posts.get_mut(t.step.index())
            {
                *slot = Some(t.source.as_str());
            }
        }
        let mut edges_from: Vec<Vec<&Edge>> = vec![Vec::new(); names.len()];
        for e in &bundle.edges {
            if let Some(from) = edges_from.get_mut(e.from.index()) {
                from.push(e);
            }
        }
        let steps = names
            .iter()
            .zip(posts)
            .enumerate()
            .map(|(id, (name, post))| {
                // A bundle is untrusted: the depth check comes before the parser, as
                // when the VM loads it.
                let facts = post.map(|source| {
                    aplc_vm::check_depth(source)
                        .ok()
                        .and_then(|()| analyze::analyze(source).ok())
                });
                let flow = match facts {
                    None => Flow::default(),
                    Some(Some(facts)) => Flow::of_post(&facts, &index, |_| Span::default()),
                    Some(None) => Flow {
                        post: true,
                        always: false,
                        jumps: edges_from[id]
                            .iter()
                            .map(|e| FlowJump {
                                to: match &e.to {
                                    EdgeTarget::Step(s) => To::Step(s.index()),
                                    EdgeTarget::Return => To::End,
                                    EdgeTarget::Dynamic => To::Dynamic,
                                },
                                span: Span::default(),
                                value: None,
                                always: false,
                            })
                            .collect(),
                    },
                };
                flow.graph_step(name)
            })
            .collect();
        StepGraph { steps }
    }
}

/// What a step's post phase does with `next_step`.
#[derive(Debug, Default)]
pub(crate) struct Flow {
    /// The step has a post phase.
    pub post: bool,
    /// Every render of the post phase sets `next_step`.
    pub always: bool,
    /// Every `next_step` write of the post phase, in source order.
    pub jumps: Vec<FlowJump>,
}

/// One `next_step` write.
#[derive(Debug)]
pub(crate) struct FlowJump {
    pub to: To,
    /// The call, in the `.apl` source.
    pub span: Span,
    /// The value's expression (a string literal: quotes included), in the source.
    pub value: Option<Span>,
    /// The write is a statement of its own outside any condition: it happens on every
    /// render of the post phase.
    pub always: bool,
}

/// Where a `next_step` write sends the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum To {
    Step(usize),
    /// `return`, `''` or `none`.
    End,
    Dynamic,
    Unknown(String),
}

impl Flow {
    /// The flow of a post phase with these facts; `span` maps template offsets to the
    /// `.apl` source.
    pub fn of_post(
        facts: &Facts,
        index: &HashMap<&str, usize>,
        span: impl Fn(TSpan) -> Span,
    ) -> Flow {
        let jumps = facts
            .next_steps
            .iter()
            .map(|n| FlowJump {
                to: match &n.target {
                    Target::Dynamic => To::Dynamic,
                    Target::End => To::End,
                    Target::Literal(name) if name == "return" => To::End,
                    Target::Literal(name) => match index.get(name.as_str()) {
                        Some(&i) => To::Step(i),
                        None => To::Unknown(name.clone()),
                    },
                },
                span: span(n.span),
                value: n.value.map(&span),
                always: n.always,
            })
            .collect();
        Flow {
            post: true,
            always: facts.always_sets_next_step,
            jumps,
        }
    }

    pub(crate) fn graph_step(&self, name: &str) -> GraphStep {
        let mut jumps: Vec<Jump> = Vec::new();
        // A set beside the list: a post phase may write `next_step` any number of times.
        let mut seen = HashSet::new();
        for j in &self.jumps {
            let jump = match &j.to {
                To::Step(s) => Jump::Step(*s),
                To::End => Jump::Return,
                To::Dynamic => Jump::Dynamic,
                To::Unknown(name) => Jump::Unknown(name.clone()),
            };
            if seen.insert(jump.clone()) {
                jumps.push(jump);
            }
        }
        let mut ends = Vec::new();
        if !self.post {
            ends.push(Ending::NoPost);
        } else if !self.always {
            ends.push(Ending::MayLeaveUnset);
        }
        if jumps.contains(&Jump::Return) {
            ends.push(Ending::Return);
        }
        if jumps.contains(&Jump::Dynamic) {
            ends.push(Ending::Dynamic);
        }
        GraphStep {
            name: name.to_string(),
            jumps,
            ends,
        }
    }
}

/// Step names to indexes; the first step of a name wins.
pub(crate) fn name_index<'a>(names: impl Iterator<Item = &'a str>) -> HashMap<&'a str, usize> {
    let mut index = HashMap::new();
    for (i, name) in names.enumerate() {
        index.entry(name).or_insert(i);
    }
    index
}

/// A step as the checks see it.
pub(crate) struct CheckedStep<'a> {
    pub name: &'a str,
    /// The step's first heading.
    pub span: Span,
    pub flow: &'a Flow,
}

/// Warns about steps the entry step cannot reach (APL0016) and cycles no run can leave
/// (APL0017).
pub(crate) fn check(steps: &[CheckedStep<'_>], diags: &mut Vec<Diagnostic>) {
    unreachable_steps(steps, diags);
    cycles_without_exit(steps, diags);
}

fn unreachable_steps(steps: &[CheckedStep<'_>], diags: &mut Vec<Diagnostic>) {
    // A computed target may name any step: nothing can be said. An unknown name is
    // most likely a typo for a step, which would then be reported twice.
    let incomplete = steps
        .iter()
        .flat_map(|s| &s.flow.jumps)
        .any(|j| matches!(j.to, To::Dynamic | To::Unknown(_)));
    let Some(entry) = steps.first() else { return };
    if incomplete {
        return;
    }
    let mut seen = vec![false; steps.len()];
    let mut stack = vec![0];
    seen[0] = true;
    while let Some(s) = stack.pop() {
        for j in &steps[s].flow.jumps {
            if let To::Step(t) = j.to
                && !seen[t]
            {
                seen[t] = true;
                stack.push(t);
            }
        }
    }
    for (step, _) in steps.iter().zip(&seen).filter(|(_, seen)| !**seen) {
        diags.push(
            Diagnostic::warning(
                Code::UnreachableStep,
                format!("Unreachable step: {}", step.name),
                step.span,
            )
            .with_label_message(format!(
                "no chain of `next_step` jumps from the entry step `{}` leads here",
                entry.name
            ))
            .with_note("a run starts at the first step and moves only where a post phase sets `next_step`")
            .with_help(format!(
                "jump here from a post phase with `{{{{ set_context('next_step', '{}') }}}}`, or remove the step",
                step.name
            )),
        );
    }
}

fn cycles_without_exit(steps: &[CheckedStep<'_>], diags: &mut Vec<Diagnostic>) {
    let successors: Vec<Vec<usize>> = steps
        .iter()
        .map(|s| {
            s.flow
                .jumps
                .iter()
                .filter_map(|j| match j.to {
                    To::Step(t) => Some(t),
                    _ => None,
                })
                .collect()
        })
        .collect();
    for component in strongly_connected(&successors) {
        let is_cycle = component.len() > 1 || successors[component[0]].contains(&component[0]);
        if !is_cycle {
            continue;
        }
        // A step keeps the run in the cycle only if its post phase always sets
        // `next_step`, and only ever to steps of the cycle: any other write (`return`, a
        // step outside, a computed or unknown name) or a path that sets nothing is a
        // way out.
        let trapped = component.iter().all(|&s| {
            let flow = steps[s].flow;
            flow.post
                && flow.always
                && flow
                    .jumps
                    .iter()
                    .all(|j| matches!(j.to, To::Step(t) if component.contains(&t)))
        });
        if trapped {
            diags.push(cycle_diagnostic(steps, &component));
        }
    }
}

fn cycle_diagnostic(steps: &[CheckedStep<'_>], component: &[usize]) -> Diagnostic {
    let mut members = component.to_vec();
    members.sort_unstable();
    // Each step's label sits at its unconditional jump, or at its first one when every
    // jump is in a branch (an `if`/`else` that jumps on every path).
    let label = |s: usize| {
        let flow = steps[s].flow;
        let jump = flow
            .jumps
            .iter()
            .find(|j| j.always)
            .or(flow.jumps.first())?;
        let To::Step(target) = jump.to else {
            return None;
        };
        let verb = if jump.always {
            "always jumps to"
        } else {
            "jumps to"
        };
        Some((jump.span, format!("{verb} `{}`", steps[target].name)))
    };
    let message = if let [only] = members[..] {
        format!(
            "Cycle with no exit: step `{}` always jumps back to itself",
            steps[only].name
        )
    } else {
        let names: Vec<String> = members
            .iter()
            .map(|&s| format!("`{}`", steps[s].name))
            .collect();
        format!(
            "Cycle with no exit: steps {} only ever jump to each other",
            names.join(", ")
        )
    };
    let primary = members[0];
    let (span, text) = label(primary).unwrap_or((steps[primary].span, String::new()));
    let mut diag =
        Diagnostic::warning(Code::CycleWithoutExit, message, span).with_label_message(text);
    for &s in &members[1..] {
        if let Some((span, text)) = label(s) {
            diag = diag.with_secondary(span, text);
        }
    }
    diag.with_note(
        "every post phase in the cycle sets `next_step` to a step of the cycle on every path, \
         so a run that enters it only ends at `max_steps` (`Step budget exceeded`), `max_runs` \
         (`Run budget exceeded`) or the timeout",
    )
    .with_help(format!(
        "give the cycle an exit, e.g. `{{% if runs >= 3 %}}{{{{ set_context('next_step', 'return') }}}}{{% endif %}}` after the jump in step `{}`",
        steps[primary].name
    ))
}

/// Tarjan's algorithm, iteratively: the strongly connected components of the graph.
fn strongly_connected(successors: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = successors.len();
    let mut index = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut components = Vec::new();
    let mut next = 0;
    for root in 0..n {
        if index[root] != UNSEEN {
            continue;
        }
        // (node, next successor to visit)
        let mut work = vec![(root, 0)];
        while let Some(&mut (v, ref mut i)) = work.last_mut() {
            if *i == 0 && index[v] == UNSEEN {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on_stack[v] = true;
            }
            if let Some(&w) = successors[v].get(*i) {
                *i += 1;
                if index[w] == UNSEEN {
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                components.push(component);
            }
        }
    }
    components
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sorted(mut c: Vec<Vec<usize>>) -> Vec<Vec<usize>> {
        for x in &mut c {
            x.sort_unstable();
        }
        c.sort();
        c
    }

    #[test]
    fn components() {
        assert_eq!(
            sorted(strongly_connected(&[
                vec![1],
                vec![2],
                vec![0],
                vec![3],
                vec![]
            ])),
            [vec![0, 1, 2], vec![3], vec![4]]
        );
        assert_eq!(
            sorted(strongly_connected(&[vec![1, 2], vec![0], vec![3], vec![2]])),
            [vec![0, 1], vec![2, 3]]
        );
        assert!(strongly_connected(&[]).is_empty());
    }
}
