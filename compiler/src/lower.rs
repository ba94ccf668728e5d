//! Stage 3: check the §1 rules and lower the syntax tree to the IR.
//!
//! Phases are grouped into steps (a step ends at the first phase heading whose identifier
//! differs), every rule about steps, phases and roles is checked, and every template is
//! parsed with the VM's own minijinja environment so that a Jinja error is a build error
//! pointing at the `.apl` line. All problems are collected; nothing stops at the first.
//!
//! Once every step is lowered, the file-level checks run: `next_step` writes outside
//! post phases, unknown jump targets, and, when the file has no errors so far (a file
//! with errors has an incomplete step table, so these would only add noise), the
//! step-graph checks of `graph.rs`, the undefined-variable check of `variables.rs` and
//! the `human_input` check of `human.rs`.

use std::collections::HashMap;

use aplc_vm::bundle::{Role, TemplateKind};
use aplc_vm::names::{Unsettable, check_settable, is_identifier};
use aplc_vm::{Limits, minijinja, template_env_for};

use crate::Options;
use crate::agents::{AgentCall, AgentName};
use crate::analyze::{self, Facts};
use crate::ast::{File, Phase, PhaseKind};
use crate::blocks::{self, Unclosed};
use crate::diagnostic::{Code, Diagnostic, Severity, Span};
use crate::graph::{self, CheckedStep, Flow, To};
use crate::heading::indented_phase_heading;
use crate::ir::{Edge, EdgeTo, Ir, Step, Template};
use crate::parser::{find_jinja, suggest};
use crate::relaxed::{self, TemplateMap};
use crate::{human, names, variables};

/// Lowers a parsed file, appending diagnostics.
pub(crate) fn lower(
    source: &str,
    file: &File<'_>,
    options: &Options,
    diags: &mut Vec<Diagnostic>,
) -> Ir {
    let env = template_env_for(&Limits::default(), options.dialect);
    let globals: Vec<String> = env.globals().map(|(n, _)| n.to_string()).collect();
    let comments = check_preamble(source, file.preamble, diags);
    let mut declared = declared_inputs(source, &comments, &globals, diags);
    let description = description(&comments);
    // A name declared twice is one input; the bundle lists each once.
    let mut seen = std::collections::HashSet::new();
    declared.retain(|name| seen.insert(name.clone()));
    // The caller's inputs (`aplc run --context`) count as declared for APL0018, but only
    // the file's own declaration goes into the bundle and is required at run time.
    let mut inputs = declared.clone();
    inputs.extend(options.inputs.iter().cloned());
    // The dialect's executor defines its own variables (defuss-1.1's `current_step`).
    inputs.extend(options.dialect.variables().iter().map(|v| v.to_string()));

    let mut lowerer = Lowerer {
        source,
        relaxed: options.relaxed,
        dialect: options.dialect,
        indented: indented_headings(source),
        env,
        diags,
        steps: Vec::new(),
        templates: Vec::new(),
    };
    let groups = group_steps(file, lowerer.diags);
    let prompted: Vec<String> = groups
        .iter()
        .filter(|g| g.phases.iter().any(|&(k, _)| k == PhaseKind::Prompt))
        .map(|g| g.name.clone())
        .collect();
    for group in groups {
        lowerer.lower_step(group, &prompted);
    }
    if file.phases.is_empty() {
        lowerer.diags.push(
            Diagnostic::error(
                Code::NoSteps,
                "no steps: the file has no phase headings",
                Span::new(0, 0),
            )
            .with_help(
                "the simplest APL program is a `# prompt:` heading followed by the prompt text",
            ),
        );
    }
    let had_errors = lowerer.diags.iter().any(Diagnostic::is_error);
    let defined: Vec<&str> = lowerer
        .templates
        .iter()
        .flat_map(|t| t.facts.writes.iter().map(String::as_str))
        .chain(inputs.iter().map(String::as_str))
        .collect();
    names::check(
        &lowerer.env,
        &lowerer.templates,
        &globals,
        &defined,
        lowerer.diags,
    );
    // defuss-apl keeps a `next_step` set before post (the VM does too in its dialect).
    if options.dialect != aplc_vm::Dialect::Defuss11 {
        lowerer.next_step_outside_post();
    }
    let flows = lowerer.flows();
    lowerer.unknown_steps(&flows, options.unknown_step_is_error);
    if !had_errors {
        let checked: Vec<CheckedStep<'_>> = lowerer
            .steps
            .iter()
            .zip(&flows)
            .map(|(step, flow)| CheckedStep {
                name: &step.name,
                span: step.span,
                flow,
            })
            .collect();
        graph::check(&checked, lowerer.diags);
        variables::check(&lowerer.templates, &inputs, &globals, lowerer.diags);
        // defuss-apl keeps a jump set in pre or prompt, which `flows` does not see.
        let jumps_outside_post = options.dialect == aplc_vm::Dialect::Defuss11
            && lowerer
                .templates
                .iter()
                .any(|t| t.kind != TemplateKind::Post && !t.facts.next_steps.is_empty());
        if !jumps_outside_post {
            human::check(&checked, &lowerer.templates, &inputs, lowerer.diags);
        }
    }
    let edges = edges(&flows);
    let agent_calls = lowerer.agent_calls();
    Ir {
        inputs: declared,
        description,
        steps: lowerer.steps,
        templates: lowerer.templates,
        edges,
        agent_calls,
    }
}

/// Every line that would be a phase heading were it not indented (APL0021), by step
/// name: the first such line of each. Code fences are not tracked: a fenced match is
/// still worth pointing at when a step of that name is missing.
fn indented_headings(source: &str) -> HashMap<&str, Span> {
    let mut found = HashMap::new();
    let mut at = 0;
    for line in source.split_inclusive('\n') {
        let start = at;
        at += line.len();
        let text = line.trim_end_matches(['\n', '\r']);
        if let Some((_, name)) = indented_phase_heading(text) {
            let lead = text.len() - text.trim_start().len();
            let span = Span::new(start + lead, start + text.trim_end().len());
            // `# prompt:` without a name is the step `default`.
            let name = if name.is_empty() { "default" } else { name };
            found.entry(name).or_insert(span);
        }
    }
    found
}

/// The bundle's edges: every known target of every post phase.
fn edges(flows: &[Flow]) -> Vec<Edge> {
    let mut edges = Vec::new();
    for (from, flow) in flows.iter().enumerate() {
        for jump in &flow.jumps {
            let to = match jump.to {
                To::Step(s) => EdgeTo::Step(s),
                To::End => EdgeTo::Return,
                To::Dynamic => EdgeTo::Dynamic,
                // The run fails there; there is no edge to record.
                To::Unknown(_) => continue,
            };
            edges.push(Edge {
                from,
                to,
                span: jump.span,
            });
        }
    }
    edges
}

/// A `{# … #}` comment before the first heading: its text between the delimiters.
struct Comment {
    /// Where the text between `{#` and `#}` starts in the source.
    start: usize,
    text: String,
}

/// Text before the first heading may only be blank lines and comments: anything else
/// would belong to no step and be lost. Returns the Jinja comments found.
fn check_preamble(source: &str, preamble: Span, diags: &mut Vec<Diagnostic>) -> Vec<Comment> {
    let text = &source[preamble.range()];
    let mut rest = text;
    let mut offset = preamble.start;
    let mut comments = Vec::new();
    loop {
        let trimmed = rest.trim_start();
        offset += rest.len() - trimmed.len();
        rest = trimmed;
        let close = if rest.starts_with("{#") {
            "#}"
        } else if rest.starts_with("<!--") {
            "-->"
        } else {
            break;
        };
        match rest.find(close) {
            Some(i) => {
                if close == "#}" {
                    comments.push(Comment {
                        start: offset + 2,
                        text: rest[2..i].to_string(),
                    });
                }
                offset += i + close.len();
                rest = &rest[i + close.len()..];
            }
            None => break,
        }
    }
    if !rest.is_empty() {
        let first_line = rest.lines().next().unwrap_or("").trim_end();
        diags.push(
            Diagnostic::error(
                Code::TextBeforeFirstStep,
                "text before the first step heading",
                Span::new(offset, offset + first_line.len()),
            )
            .with_label_message("this text belongs to no step")
            .with_help("start the file with a phase heading such as `# prompt:`, or turn the text into a `{# … #}` comment"),
        );
    }
    comments
}

/// The agent's description: the first `{# … #}` comment before the first heading that is
/// not an `{# inputs: … #}` declaration, its lines trimmed at the end and the whole
/// trimmed; `None` when there is none or it is blank.
fn description(comments: &[Comment]) -> Option<String> {
    let comment = comments.iter().find(|c| !is_inputs_declaration(&c.text))?;
    let lines: Vec<&str> = comment.text.lines().map(str::trim_end).collect();
    let text = lines.join("\n");
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// True when a comment's text starts with `inputs:` (any case, after blanks).
fn is_inputs_declaration(text: &str) -> bool {
    text.trim_start()
        .get(..INPUTS_KEYWORD.len())
        .is_some_and(|k| k.eq_ignore_ascii_case(INPUTS_KEYWORD))
}

/// The word that starts an inputs declaration.
const INPUTS_KEYWORD: &str = "inputs:";

/// The `with_context` variables declared in `{# inputs: a, b #}` comments before the
/// first heading. Names are separated by commas or whitespace.
fn declared_inputs(
    source: &str,
    comments: &[Comment],
    globals: &[String],
    diags: &mut Vec<Diagnostic>,
) -> Vec<String> {
    const KEYWORD: &str = INPUTS_KEYWORD;
    let mut inputs = Vec::new();
    for comment in comments {
        let lead = comment.text.len() - comment.text.trim_start().len();
        let body = &comment.text[lead..];
        if !is_inputs_declaration(body) {
            continue;
        }
        let list_start = comment.start + lead + KEYWORD.len();
        let list = &body[KEYWORD.len()..];
        let mut at = 0;
        for token in list.split(|c: char| c == ',' || c.is_whitespace()) {
            let start = list_start + at;
            at += token.len() + 1;
            if token.is_empty() {
                continue;
            }
            let span = Span::new(start, start + token.len());
            debug_assert_eq!(&source[span.range()], token);
            // The VM's own rule for what `with_context` may set, then what a template
            // could not read as a plain variable.
            let problem = if !is_identifier(token) {
                Some(
                    "an input must be a variable name: letters, digits and `_`, not starting with a digit",
                )
            } else {
                match check_settable(token) {
                    Err(Unsettable::Reserved) => {
                        Some("reserved for a future version of APL (§8); `with_context` refuses it")
                    }
                    Err(Unsettable::View) => {
                        Some("maintained by the executor; `with_context` refuses it")
                    }
                    Err(Unsettable::Helper | Unsettable::Empty) => {
                        Some("a helper or Jinja function has this name")
                    }
                    Ok(()) if globals.iter().any(|g| g == token) => {
                        Some("a helper or Jinja function has this name")
                    }
                    Ok(()) => None,
                }
            };
            match problem {
                Some(problem) => diags.push(
                    Diagnostic::warning(
                        Code::InvalidInputs,
                        format!("Invalid input declaration: {token}"),
                        span,
                    )
                    .with_label_message(problem)
                    .with_note("`{# inputs: name, other #}` before the first step declares the variables the agent expects from `with_context`"),
                ),
                None => inputs.push(token.to_string()),
            }
        }
    }
    inputs
}

/// The phases of one step, in file order.
struct Group<'a, 'src> {
    name: String,
    /// The first heading of the step.
    span: Span,
    phases: Vec<(PhaseKind, &'a Phase<'src>)>,
    /// False when the step is a duplicate or reserved: checked, but not emitted.
    valid: bool,
    /// A prompt phase was seen but rejected (out of order): no "missing prompt" error.
    rejected_prompt: bool,
}

fn group_steps<'a, 'src>(
    file: &'a File<'src>,
    diags: &mut Vec<Diagnostic>,
) -> Vec<Group<'a, 'src>> {
    let mut groups: Vec<Group<'a, 'src>> = Vec::new();
    let mut first_seen: HashMap<String, Span> = HashMap::new();
    for phase in &file.phases {
        let Some(header) = phase.heading.parsed else {
            continue;
        };
        let (name, name_span) = header
            .name
            .map(|(n, s)| (n.to_string(), s))
            .unwrap_or_else(|| ("default".to_string(), phase.heading.span));

        if let Some(current) = groups.last_mut().filter(|g| g.name == name) {
            let last = current.phases.last().map(|&(k, p)| (k, p.heading.span));
            let has_prompt = current.phases.iter().any(|&(k, _)| k == PhaseKind::Prompt);
            if let Some((last, _)) = last.filter(|&(last, _)| header.kind <= last)
                && has_prompt
                && header.kind != PhaseKind::Post
            {
                // The step already has its prompt, and a pre or prompt heading can only
                // start a step: this is a second step with the same identifier, written
                // right after the first. Say so in the spec's words (§1.1); the phase
                // order is the detail. The new step is checked but not emitted, so its
                // own later phases do not add phase-order errors.
                let first = first_seen.get(&name).copied().unwrap_or(current.span);
                diags.push(
                    duplicate_step(&name, name_span, first)
                        .with_note(format!(
                            "step `{name}` already has a `{}` phase; a step's phases come in the order pre → prompt → post, each at most once, so this heading starts a second step `{name}`",
                            last.as_str()
                        ))
                        .with_help("give one of the steps another identifier: identifiers are unique within a file"),
                );
                groups.push(Group {
                    name,
                    span: phase.heading.span,
                    phases: vec![(header.kind, phase)],
                    valid: false,
                    rejected_prompt: false,
                });
                continue;
            }
            if let Some((last, last_span)) = last.filter(|&(last, _)| header.kind <= last) {
                let message = if header.kind == last {
                    format!(
                        "step `{name}` has more than one `{}` phase",
                        header.kind.as_str()
                    )
                } else {
                    format!(
                        "the `{}` phase of step `{name}` comes after its `{}` phase",
                        header.kind.as_str(),
                        last.as_str()
                    )
                };
                let (here, there) = if header.kind == last {
                    ("repeated here", "first here")
                } else {
                    ("out of order", "this phase must come after it")
                };
                diags.push(
                    Diagnostic::error(Code::PhaseOrder, message, phase.heading.span)
                        .with_label_message(here)
                        .with_secondary(last_span, there)
                        .with_note("the phases of a step come in the order pre → prompt → post, each at most once"),
                );
                current.rejected_prompt |= header.kind == PhaseKind::Prompt;
                continue;
            }
            current.phases.push((header.kind, phase));
            continue;
        }

        let mut valid = true;
        if name == "return" {
            diags.push(
                Diagnostic::error(
                    Code::ReservedStep,
                    "Reserved step identifier: return",
                    name_span,
                )
                .with_label_message(
                    "`return` ends the run when used as `next_step`; no step can have this name",
                ),
            );
            valid = false;
        }
        if let Some(&first) = first_seen.get(&name) {
            diags.push(duplicate_step(&name, name_span, first).with_note(
                "a step's phases must be adjacent; step identifiers are unique within a file",
            ));
            valid = false;
        } else {
            first_seen.insert(name.clone(), name_span);
        }
        groups.push(Group {
            name,
            span: phase.heading.span,
            phases: vec![(header.kind, phase)],
            valid,
            rejected_prompt: false,
        });
    }
    groups
}

/// Where the step name `name` is in the phase heading at `heading`: after the colon.
/// An empty span (which carries no edit) when it is not found there.
fn heading_name(source: &str, heading: Span, name: &str) -> Span {
    let Some(text) = source.get(heading.range()) else {
        return Span::default();
    };
    text.find(':')
        .and_then(|colon| Some(colon + 1 + text[colon + 1..].find(name)?))
        .map_or(Span::default(), |i| {
            Span::new(heading.start + i, heading.start + i + name.len())
        })
}

/// The inside of the string literal at `literal` when it is exactly `name` in quotes
/// (no escapes). An empty span (which carries no edit) otherwise.
fn quoted(source: &str, literal: Option<Span>, name: &str) -> Span {
    let Some(literal) = literal else {
        return Span::default();
    };
    let text = source.get(literal.range()).unwrap_or_default();
    let exact = ['\'', '"']
        .iter()
        .any(|q| text.strip_prefix(*q).and_then(|t| t.strip_suffix(*q)) == Some(name));
    if exact {
        Span::new(literal.start + 1, literal.end - 1)
    } else {
        Span::default()
    }
}

/// `Duplicate step identifier: <name>` (APL0002), the spec's words (§1.1), for a step
/// named at `here` whose identifier was first used at `first`.
fn duplicate_step(name: &str, here: Span, first: Span) -> Diagnostic {
    Diagnostic::error(
        Code::DuplicateStep,
        format!("Duplicate step identifier: {name}"),
        here,
    )
    .with_label_message(format!("`{name}` is defined again here"))
    .with_secondary(first, "first defined here")
}

struct Lowerer<'a, 'src> {
    source: &'src str,
    relaxed: bool,
    /// The dialect: its helpers are calls, not statements, in relaxed syntax.
    dialect: aplc_vm::Dialect,
    /// Step names of indented phase headings (APL0021) and where the first of each is.
    indented: HashMap<&'src str, Span>,
    env: minijinja::Environment<'static>,
    diags: &'a mut Vec<Diagnostic>,
    steps: Vec<Step>,
    templates: Vec<Template>,
}

impl Lowerer<'_, '_> {
    /// `prompted` names every step that has a prompt phase, for a did-you-mean when a
    /// phase heading misspells its step's name.
    fn lower_step(&mut self, group: Group<'_, '_>, prompted: &[String]) {
        let step = self.steps.len();
        let mut pre = None;
        let mut post = None;
        let mut messages = Vec::new();
        let mut prompt_span = None;
        for &(kind, phase) in &group.phases {
            match kind {
                PhaseKind::Pre => pre = Some(self.phase_template(step, TemplateKind::Pre, phase)),
                PhaseKind::Post => {
                    post = Some(self.phase_template(step, TemplateKind::Post, phase))
                }
                PhaseKind::Prompt => {
                    prompt_span = Some(phase.heading.span);
                    messages = self.prompt_messages(step, phase);
                }
            }
        }
        let Some(prompt_span) = prompt_span else {
            if group.valid && !group.rejected_prompt {
                let mut diag = Diagnostic::error(
                    Code::MissingPrompt,
                    format!("step `{}` has no prompt phase", group.name),
                    group.span,
                )
                .with_label_message("the step starts here");
                let indented = self.indented.get(group.name.as_str()).copied();
                if let Some(at) = indented {
                    diag = diag.with_secondary(at, "this heading is indented, so it is text");
                }
                // One- and two-letter names are all one edit apart: no guess there.
                let guess = suggest(&group.name, prompted.iter().map(String::as_str))
                    .filter(|_| group.name.chars().count() > 2);
                diag = match guess {
                    // `# post: clasify` next to a step `classify`: a typo, not a new step.
                    Some(s) => diag
                        .with_note(format!(
                            "a phase heading with another name starts another step: `{}` is not `{s}`",
                            group.name
                        ))
                        .with_did_you_mean(
                            s,
                            heading_name(self.source, group.span, &group.name),
                            s,
                        ),
                    None if indented.is_some() => diag.with_help(
                        "remove the indentation of the `# prompt:` heading",
                    ),
                    None => diag.with_help(format!(
                        "add a `# prompt: {}` phase after this one",
                        group.name
                    )),
                };
                self.diags.push(diag);
            }
            return;
        };
        if !group.valid {
            return;
        }
        self.steps.push(Step {
            name: group.name,
            span: group.span,
            prompt_span,
            pre,
            messages,
            post,
        });
    }

    /// A `pre` or `post` phase: the whole body is one template.
    fn phase_template(&mut self, step: usize, kind: TemplateKind, phase: &Phase<'_>) -> usize {
        for section in &phase.sections {
            if let Some(line) = section.heading
                && let Some(role) = line.role
            {
                self.diags.push(
                    Diagnostic::warning(
                        Code::RoleHeadingOutsidePrompt,
                        format!("role heading `## {}` outside a prompt phase", role.as_str()),
                        line.span,
                    )
                    .with_label_message("this line is template text of the phase")
                    .with_help("role sections belong in a `# prompt:` phase"),
                );
            }
        }
        let body = &self.source[phase.body.range()];
        let (text, map) = if self.relaxed {
            relaxed::desugar(body, phase.body.start, self.dialect)
        } else {
            (body.to_string(), TemplateMap::Verbatim(phase.body.start))
        };
        self.add_template(step, kind, text, map, phase.body)
    }

    /// A prompt phase: one message per role section; text before the first role heading is
    /// a `user` message. Never rewritten by relaxed mode.
    fn prompt_messages(&mut self, step: usize, phase: &Phase<'_>) -> Vec<(Role, usize)> {
        let mut messages = Vec::new();
        for section in &phase.sections {
            let body = &self.source[section.body.range()];
            let role = match section.heading {
                None if body.trim().is_empty() => continue,
                None => Role::User,
                Some(line) => match line.role {
                    Some(role) => role,
                    None => {
                        self.invalid_role(line.text, line.span);
                        continue;
                    }
                },
            };
            let t = self.add_template(
                step,
                TemplateKind::Prompt(role),
                body.to_string(),
                TemplateMap::Verbatim(section.body.start),
                section.body,
            );
            messages.push((role, t));
        }
        messages
    }

    fn invalid_role(&mut self, text: &str, span: Span) {
        let word = text
            .trim_start_matches('#')
            .trim()
            .trim_end_matches(':')
            .trim();
        let roles = aplc_vm::bundle::Role::ALL.map(|r| r.as_str());
        let mut diag = Diagnostic::error(
            Code::InvalidRoleHeading,
            format!("Invalid role heading: {}", text.trim_end()),
            span,
        );
        diag = if find_jinja(text).is_some() {
            diag.with_label_message("role headings cannot contain Jinja")
        } else {
            diag.with_label_message(format!(
                "expected one of `system`, `user`, `assistant`, `developer`, `tool_result`, found `{word}`"
            ))
        };
        diag = match suggest(word, roles.into_iter()) {
            Some(s) => {
                // The edit replaces the word only: a trailing colon stays.
                let hashes = text.len() - text.trim_start_matches('#').len();
                let at = text[hashes..].find(word).map_or(Span::default(), |i| {
                    let start = span.start + hashes + i;
                    Span::new(start, start + word.len())
                });
                diag.with_did_you_mean(&format!("## {s}"), at, s)
            }
            None => diag.with_help(
                "a `##` at column 0 in a prompt phase starts a role section; to keep this line as text, indent it or put it in a code fence",
            ),
        };
        self.diags.push(diag);
    }

    /// Checks a template and adds it to the table.
    fn add_template(
        &mut self,
        step: usize,
        kind: TemplateKind,
        source: String,
        map: TemplateMap,
        span: Span,
    ) -> usize {
        // Before anything parses it: minijinja's parser and the analysis recurse once per
        // level of an expression, and the VM refuses to load what this refuses.
        let facts = if let Err(fault) = aplc_vm::check_depth(&source) {
            self.too_deep(&source, &map, fault);
            Facts::default()
        } else {
            self.checked_facts(&source, &map)
        };
        for (name, (start, end)) in &facts.reserved {
            self.diags.push(
                Diagnostic::error(
                    Code::ReservedVariable,
                    format!("Reserved variable: {name}"),
                    map.span(*start, *end),
                )
                .with_label_message("reserved for a future version of APL (§8)")
                .with_help("choose another variable name"),
            );
        }
        for (what, (start, end)) in &facts.unsupported {
            self.diags.push(
                Diagnostic::error(
                    Code::TemplateSyntax,
                    format!("`{what}` is not supported in APL templates"),
                    map.span(*start, *end),
                )
                .with_note("each APL template is self-contained: there are no other templates to include, import or extend"),
            );
        }
        self.templates.push(Template {
            source,
            step,
            kind,
            span,
            map,
            facts,
        });
        self.templates.len() - 1
    }

    /// Parses a template that passed the depth check and collects its facts; a syntax
    /// error is reported and gives no facts.
    fn checked_facts(&mut self, source: &str, map: &TemplateMap) -> Facts {
        match analyze::analyze(source) {
            Ok(facts) => {
                // The VM compiles with this same environment at load time; a template the
                // parser accepts but the code generator rejects must fail here, not there.
                if let Err(err) = self.env.add_template_owned("check", source.to_string()) {
                    self.template_error(
                        source,
                        map,
                        err.detail().unwrap_or("invalid template"),
                        err.range().map(|r| (r.start, r.end)),
                        err.line(),
                    );
                }
                self.env.remove_template("check");
                facts
            }
            Err(err) => {
                match blocks::unclosed(source).filter(|_| {
                    err.message.contains("end of input")
                        || err.message.starts_with("unknown statement end")
                }) {
                    Some(unclosed) => self.unclosed_block(source, map, unclosed),
                    None => self.template_error(source, map, &err.message, err.span, err.line),
                }
                Facts::default()
            }
        }
    }

    /// Reports a template expression nested deeper than the VM loads (APL0024).
    fn too_deep(&mut self, source: &str, map: &TemplateMap, fault: aplc_vm::TemplateFault) {
        let (start, end) = fault.span();
        let span = Span::new(start, end).snap(source);
        self.diags.push(
            Diagnostic::error(
                Code::ExpressionTooDeep,
                format!(
                    "expression nested too deeply: more than {} levels",
                    aplc_vm::MAX_EXPRESSION_DEPTH
                ),
                map.span(span.start, span.end),
            )
            .with_label_message("the expression is this deep here")
            .with_note("operators, attribute and item lookups, calls, filters and brackets each add a level; aplc refuses deeper expressions so that parsing them cannot overflow the stack")
            .with_help("split the expression with `{% set %}` into shorter parts"),
        );
    }

    /// A block tag without its end tag (APL0009): name the missing end tag and point at
    /// the opening one.
    fn unclosed_block(&mut self, source: &str, map: &TemplateMap, unclosed: Unclosed) {
        let keyword = &unclosed.keyword;
        let open = map.span(unclosed.open.0, unclosed.open.1);
        let mut diag = Diagnostic::error(
            Code::TemplateSyntax,
            format!("template syntax error: `{{% {keyword} %}}` is never closed: `{{% end{keyword} %}}` is missing"),
            open,
        )
        .with_label_message(format!("this `{{% {keyword} %}}` has no `{{% end{keyword} %}}`"));
        diag = match &unclosed.closed_by {
            Some((end, (start, stop))) => diag
                .with_secondary(
                    map.span(*start, *stop),
                    format!(
                        "`{{% {end} %}}` closes an outer block while `{keyword}` is still open"
                    ),
                )
                .with_help(format!(
                    "add `{{% end{keyword} %}}` before this `{{% {end} %}}`"
                )),
            None => {
                let end = source.trim_end().len();
                diag.with_secondary(map.span(end, end), "the template ends here")
                    .with_help(format!(
                        "add `{{% end{keyword} %}}` where the block should end"
                    ))
            }
        };
        self.diags.push(diag);
    }

    fn template_error(
        &mut self,
        source: &str,
        map: &TemplateMap,
        message: &str,
        span: Option<(usize, usize)>,
        line: Option<usize>,
    ) {
        let (start, end) = span.unwrap_or_else(|| {
            // Without a span, point at the start of the reported line.
            let start = line
                .and_then(|l| {
                    source
                        .split_inclusive('\n')
                        .take(l.saturating_sub(1))
                        .map(str::len)
                        .reduce(|a, b| a + b)
                })
                .unwrap_or(0);
            (start, start)
        });
        // minijinja may report a position inside a multi-byte character (`{{ café }}`).
        let snapped = Span::new(start, end).snap(source);
        let span = map.span(snapped.start, snapped.end);
        self.diags.push(
            Diagnostic::error(
                Code::TemplateSyntax,
                format!("template syntax error: {message}"),
                span,
            )
            .with_label_message(message.to_string()),
        );
    }

    /// Warns at every `next_step` write in a pre or prompt phase: `next_step` is
    /// cleared before post, so the value is lost (APL0015).
    fn next_step_outside_post(&mut self) {
        for t in &self.templates {
            let phase = match t.kind {
                TemplateKind::Pre => "pre",
                TemplateKind::Prompt(_) => "prompt",
                TemplateKind::Post => continue,
            };
            let step = self.step_name(t.step);
            for n in &t.facts.next_steps {
                self.diags.push(
                    Diagnostic::warning(
                        Code::NextStepOutsidePost,
                        format!("`next_step` set in a {phase} phase has no effect"),
                        t.map.span(n.span.0, n.span.1),
                    )
                    .with_label_message("this value is discarded")
                    .with_note("`next_step` is cleared before the post phase runs: only a value set in post decides where the run goes")
                    .with_help(format!("move this call to the `# post: {step}` phase")),
                );
            }
        }
    }

    /// Every `call_agent` write of every template, with its spans in the source.
    fn agent_calls(&self) -> Vec<AgentCall> {
        self.templates
            .iter()
            .flat_map(|t| {
                t.facts.agent_calls.iter().map(|call| AgentCall {
                    name: call
                        .name
                        .clone()
                        .map_or(AgentName::Dynamic, AgentName::Literal),
                    span: t.map.span(call.span.0, call.span.1),
                    keys: call.keys.clone(),
                    step: self.step_name(t.step),
                })
            })
            .collect()
    }

    /// The name of step `id`. (In a file with errors, a template of a rejected step may
    /// name the index of the next step.)
    fn step_name(&self, id: usize) -> String {
        self.steps
            .get(id)
            .map_or_else(|| "…".to_string(), |s| s.name.clone())
    }

    /// What each step's post phase does with `next_step`, in step order.
    fn flows(&self) -> Vec<Flow> {
        let index = graph::name_index(self.steps.iter().map(|s| s.name.as_str()));
        self.steps
            .iter()
            .map(|step| match step.post {
                None => Flow::default(),
                Some(post) => {
                    let t = &self.templates[post];
                    Flow::of_post(&t.facts, &index, |(start, end)| t.map.span(start, end))
                }
            })
            .collect()
    }

    /// A literal target that names no step (APL0014): an error for `check` and `build`,
    /// a warning for `run`, where the spec makes it a run-time failure (§2.1).
    fn unknown_steps(&mut self, flows: &[Flow], is_error: bool) {
        let severity = if is_error {
            Severity::Error
        } else {
            Severity::Warning
        };
        for jump in flows.iter().flat_map(|f| &f.jumps) {
            let To::Unknown(name) = &jump.to else {
                continue;
            };
            let mut diag = Diagnostic::warning(
                Code::UnknownStep,
                format!("Unknown step: {name}"),
                jump.span,
            )
            .with_label_message(format!("no step is named `{name}`"));
            diag.severity = severity;
            diag = diag.with_note(if is_error {
                "a run that reached this jump would fail with this error (§2.1); step names are case-sensitive"
            } else {
                "if `next_step` still holds this value when the post phase ends, the run fails with this error"
            });
            let indented = self.indented.get(name.as_str()).copied();
            if let Some(at) = indented {
                diag = diag
                    .with_secondary(
                        at,
                        format!(
                            "a heading for `{name}` exists here, but it is indented, so it is text"
                        ),
                    )
                    .with_help("remove the indentation: a heading counts only at column 0 (§1.3)");
                self.diags.push(diag);
                continue;
            }
            diag = match suggest(name, self.steps.iter().map(|s| s.name.as_str())) {
                Some(s) => diag.with_did_you_mean(s, quoted(self.source, jump.value, name), s),
                None => diag.with_help(format!(
                    "add a step `# prompt: {name}`, or set `next_step` to `return` to end the run"
                )),
            };
            self.diags.push(diag);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::{Options, compile};

    fn description(source: &str) -> Option<String> {
        let compilation = compile(source, "a.apl", &Options::default());
        let diagnostics = format!("{:?}", compilation.diagnostics);
        compilation.bundle.expect(&diagnostics).description
    }

    #[test]
    fn the_description_is_the_first_comment_that_declares_no_inputs() {
        let source = "{# inputs: topic #}\n{#\n  Writes a haiku   \n  about a topic. #}\n{# later #}\n# prompt: a\nhi {{ topic }}\n";
        assert_eq!(
            description(source).as_deref(),
            Some("Writes a haiku\n  about a topic.")
        );
        assert_eq!(description("{# inputs: a #}\n# prompt: a\n{{ a }}\n"), None);
        assert_eq!(description("{#   #}\n# prompt: a\nhi\n"), None);
        assert_eq!(description("# prompt: a\nhi\n"), None);
    }
}
