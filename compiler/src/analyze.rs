//! What the compiler learns from a template's Jinja syntax tree.
//!
//! Templates are parsed with minijinja's own parser (`machinery::parse`), so the checks
//! here see exactly the structure the VM will run: a reserved variable is found where the
//! template *reads* it, never by scanning text (the word "memory" in prose is fine), and
//! `next_step` targets come from literal `set_context('next_step', '<name>')` calls.
//!
//! The walk keeps Jinja's scopes (`{% set %}`, loop variables, `with`, macro arguments)
//! so that [`Facts::reads`] lists only the variables a template takes from the run's
//! context. Like minijinja's `Template::undeclared_variables`, it is a static
//! approximation; where it must guess, it guesses towards *not* reporting a read:
//! a variable that is only tested (`x is defined`, `{% if x %}`, `x | default(…)`) is not
//! a read, and neither is any use of it inside the branches that test guards.
//! What the file as a whole defines is decided in `variables.rs`, not here.

use std::collections::HashSet;

// minijinja is a direct dependency with `unstable_machinery` (compiler/Cargo.toml), not
// reached through the VM's re-export: the compiler walks its syntax tree itself.
use aplc_vm::names::{self, Access, CALL_AGENT, CONTEXT, NEXT_STEP, SET_CONTEXT};
use minijinja::machinery::ast::{self, BinOpKind, CallArg, Expr, Stmt, UnaryOpKind};
use minijinja::machinery::{self, Span as JSpan};
use minijinja::syntax::SyntaxConfig;

pub use aplc_vm::RESERVED_VARIABLES;

/// What the helper called `name` does with the variable its first argument names, if
/// `name` is a helper whose first argument names one.
///
/// Dialect helpers (`spec/dialects.md`) count in every dialect: the name checks refuse a
/// helper the program's dialect lacks, so analysing its call as a write is harmless.
fn helper_access(name: &str) -> Option<Access> {
    names::helper(name)
        .or_else(|| aplc_vm::any_dialect_helper(name))
        .map(|h| h.access)
        .filter(|access| *access != Access::None)
}

/// A byte range within a template's text.
pub(crate) type TSpan = (usize, usize);

/// What one template does that the compiler cares about.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Reads of reserved variables: the name and where.
    pub reserved: Vec<(String, TSpan)>,
    /// Every call that writes `next_step`, in source order.
    pub next_steps: Vec<NextStep>,
    /// Every render that does not fail writes `next_step`: some write is a statement of
    /// its own on every path (both branches of an `{% if %}` with an `{% else %}`
    /// count; a loop's body does not, it may run zero times).
    pub always_sets_next_step: bool,
    /// Statements APL templates cannot use (`include`, `extends`, …): what and where.
    pub unsupported: Vec<(&'static str, TSpan)>,
    /// Context variables written by a helper under a literal name.
    pub writes: Vec<String>,
    /// The same writes with the span of the name's string literal (for editors: where a
    /// variable is set).
    pub write_sites: Vec<(String, TSpan)>,
    /// A helper writes a variable whose name is computed, so any name may be defined.
    pub dynamic_writes: bool,
    /// Variables read from the run's context (not bound by the template itself and not
    /// only tested for definedness), in source order.
    pub reads: Vec<(String, TSpan)>,
    /// Calls of a name the template does not bind (`set_context(…)`, `set(…)`): the
    /// name and the call. The callee is not also a read.
    pub calls: Vec<(String, TSpan)>,
    /// Names assigned with `{% set %}`, which live only as long as this render.
    pub sets: Vec<String>,
    /// Every filter applied (`x | name`, `{% filter name %}`): the name and where.
    pub filters: Vec<(String, TSpan)>,
    /// Every test applied (`x is name`): the name and where.
    pub tests: Vec<(String, TSpan)>,
    /// Every `set_context('call_agent', …)`, in source order (`spec/agents.md` §2).
    pub agent_calls: Vec<AgentCallFact>,
}

/// A `set_context('call_agent', value)` call: what the compiler can tell of the agent it
/// names and the context it gives, when `value` is a dict literal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AgentCallFact {
    /// The `'agent'` value when it is a string literal; `None` when it is computed (or
    /// `value` is not a dict literal).
    pub name: Option<String>,
    /// The string literal naming the agent, or the whole call when the name is computed.
    pub span: TSpan,
    /// The keys of the `'context'` value when it is a dict literal whose keys are all
    /// string literals (none when there is no `'context'`); `None` when unknown.
    pub keys: Option<Vec<String>>,
}

/// A call that writes `next_step`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NextStep {
    /// The value written.
    pub target: Target,
    /// The call.
    pub span: TSpan,
    /// True when every render of the template that does not fail makes this call: it
    /// is a statement of its own (`{{ set_context(…) }}`, `{% do … %}`), outside any
    /// `if`, loop or macro.
    pub always: bool,
    /// The value's expression (the string literal when the target is one), for editors
    /// that rename a step.
    pub value: Option<TSpan>,
}

/// The value a `set_context('next_step', …)` call gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A string literal naming a step (or `return`).
    Literal(String),
    /// `''` or `none`: like `return`, the run ends.
    End,
    /// Anything computed.
    Dynamic,
}

/// A syntax error: message and where.
#[derive(Debug)]
pub(crate) struct SyntaxError {
    pub message: String,
    pub span: Option<TSpan>,
    pub line: Option<usize>,
}

/// Parses `source` and collects its [`Facts`].
pub(crate) fn analyze(source: &str) -> Result<Facts, SyntaxError> {
    let stmt = machinery::parse(source, "<template>", SyntaxConfig::default()).map_err(|e| {
        SyntaxError {
            message: e
                .detail()
                .map(str::to_string)
                .unwrap_or_else(|| e.kind().to_string()),
            span: e.range().map(|r| (r.start, r.end)),
            line: e.line(),
        }
    })?;
    let mut locals = HashSet::new();
    collect_locals(std::slice::from_ref(&stmt), &mut locals);
    let mut walker = Walker {
        facts: Facts::default(),
        scopes: vec![Scope::default()],
        locals,
        depth: 0,
        tested: Vec::new(),
    };
    walker.stmt(&stmt);
    walker.facts.always_sets_next_step = always_sets_next_step(std::slice::from_ref(&stmt));
    Ok(walker.facts)
}

/// How an expression's value is used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Use {
    /// The value itself: printed, iterated, computed with.
    Value,
    /// Only its truth or a test: `{% if x %}`, `not x`, `x is defined`,
    /// `x | default(…)`. Undefined variables are fine here (semi-strict undefined).
    Test,
}

/// Names visible in one block.
#[derive(Debug, Default)]
struct Scope<'a> {
    names: HashSet<&'a str>,
    /// A guard scope holds the names tested by an `if`; assignments go past it to the
    /// enclosing block, because `{% set %}` inside an `if` is visible after it.
    guard: bool,
}

struct Walker<'a> {
    facts: Facts,
    scopes: Vec<Scope<'a>>,
    /// Every name the template binds anywhere; a macro body sees all of them, since it
    /// runs when it is called, not where it is defined.
    locals: HashSet<&'a str>,
    /// How many `if`s, loops and macro bodies enclose the current statement.
    depth: usize,
    /// Variables used in [`Use::Test`] position, collected while walking a condition.
    tested: Vec<&'a str>,
}

impl<'a> Walker<'a> {
    fn is_bound(&self, name: &str) -> bool {
        self.scopes.iter().any(|s| s.names.contains(name))
    }

    fn bind(&mut self, name: &'a str) {
        if let Some(scope) = self.scopes.iter_mut().rev().find(|s| !s.guard) {
            scope.names.insert(name);
        }
    }

    fn bind_target(&mut self, target: &Expr<'a>) {
        match target {
            Expr::Var(v) => self.bind(v.id),
            Expr::List(l) => l.items.iter().for_each(|e| self.bind_target(e)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.bind_target(e)),
            // `{% set ns.attr = … %}` reads `ns`.
            other => self.expr(other, Use::Value),
        }
    }

    fn push(&mut self, names: impl IntoIterator<Item = &'a str>, guard: bool) {
        self.scopes.push(Scope {
            names: names.into_iter().collect(),
            guard,
        });
    }

    fn pop(&mut self) {
        self.scopes.pop();
    }

    fn stmts(&mut self, stmts: &[Stmt<'a>]) {
        for s in stmts {
            self.stmt(s);
        }
    }

    /// Walks `body` one level deeper: its statements may not run.
    fn nested(&mut self, body: &[Stmt<'a>]) {
        self.depth += 1;
        self.stmts(body);
        self.depth -= 1;
    }

    /// Walks a condition and returns the names it tests.
    fn condition(&mut self, expr: &Expr<'a>) -> Vec<&'a str> {
        let start = self.tested.len();
        self.expr(expr, Use::Test);
        self.tested.split_off(start)
    }

    fn stmt(&mut self, stmt: &Stmt<'a>) {
        match stmt {
            Stmt::Template(t) => self.stmts(&t.children),
            Stmt::EmitExpr(e) => self.statement_expr(&e.expr),
            Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
            Stmt::ForLoop(f) => {
                self.expr(&f.iter, Use::Value);
                self.push(["loop"], false);
                self.bind_target(&f.target);
                if let Some(e) = &f.filter_expr {
                    self.condition(e);
                }
                self.nested(&f.body);
                self.pop();
                self.push([], false);
                self.nested(&f.else_body);
                self.pop();
            }
            Stmt::IfCond(i) => {
                let guards = self.condition(&i.expr);
                self.push(guards, true);
                self.nested(&i.true_body);
                self.nested(&i.false_body);
                self.pop();
            }
            Stmt::WithBlock(w) => {
                self.push([], false);
                for (target, value) in &w.assignments {
                    self.expr(value, Use::Value);
                    self.bind_target(target);
                }
                self.stmts(&w.body);
                self.pop();
            }
            Stmt::Set(s) => {
                self.statement_expr(&s.expr);
                self.record_set(&s.target);
                self.bind_target(&s.target);
            }
            Stmt::SetBlock(s) => {
                self.record_set(&s.target);
                self.bind_target(&s.target);
                if let Some(f) = &s.filter {
                    self.expr(f, Use::Value);
                }
                self.stmts(&s.body);
            }
            Stmt::AutoEscape(a) => {
                self.expr(&a.enabled, Use::Value);
                self.stmts(&a.body);
            }
            Stmt::FilterBlock(f) => {
                self.expr(&f.filter, Use::Value);
                self.stmts(&f.body);
            }
            Stmt::Block(b) => {
                self.facts
                    .unsupported
                    .push(("{% block %}", tspan(b.span())));
                self.stmts(&b.body);
            }
            Stmt::Import(i) => {
                self.facts
                    .unsupported
                    .push(("{% import %}", tspan(i.span())));
                self.bind_target(&i.name);
            }
            Stmt::FromImport(i) => {
                self.facts
                    .unsupported
                    .push(("{% from … import %}", tspan(i.span())));
                for (name, alias) in &i.names {
                    self.bind_target(alias.as_ref().unwrap_or(name));
                }
            }
            Stmt::Extends(e) => self
                .facts
                .unsupported
                .push(("{% extends %}", tspan(e.span()))),
            Stmt::Include(i) => self
                .facts
                .unsupported
                .push(("{% include %}", tspan(i.span()))),
            Stmt::Macro(m) => {
                self.bind(m.name);
                self.macro_body(m);
            }
            Stmt::CallBlock(c) => {
                self.call(&c.call, c.call.span(), false);
                self.macro_body(&c.macro_decl);
            }
            Stmt::Do(d) => self.call(&d.call, d.call.span(), true),
        }
    }

    /// An expression that is a statement of its own: a call here always runs when the
    /// statement does.
    fn statement_expr(&mut self, expr: &Expr<'a>) {
        match expr {
            Expr::Call(c) => self.call(c, c.span(), true),
            other => self.expr(other, Use::Value),
        }
    }

    fn record_set(&mut self, target: &Expr<'a>) {
        if let Expr::Var(v) = target {
            self.facts.sets.push(v.id.to_string());
        }
    }

    fn macro_body(&mut self, m: &ast::Macro<'a>) {
        for e in &m.defaults {
            self.expr(e, Use::Value);
        }
        let mut names: Vec<&'a str> = self.locals.iter().copied().collect();
        names.extend(["caller", "varargs", "kwargs"]);
        self.push(names, false);
        for arg in &m.args {
            self.bind_target(arg);
        }
        self.nested(&m.body);
        self.pop();
    }

    fn args(&mut self, args: &[CallArg<'a>]) {
        for arg in args {
            match arg {
                CallArg::Pos(e)
                | CallArg::Kwarg(_, e)
                | CallArg::PosSplat(e)
                | CallArg::KwargSplat(e) => self.expr(e, Use::Value),
            }
        }
    }

    fn var(&mut self, v: &ast::Spanned<ast::Var<'a>>, use_: Use) {
        if RESERVED_VARIABLES.contains(&v.id) {
            self.facts
                .reserved
                .push((v.id.to_string(), tspan(v.span())));
            return;
        }
        match use_ {
            Use::Test => self.tested.push(v.id),
            Use::Value if !self.is_bound(v.id) => {
                self.facts.reads.push((v.id.to_string(), tspan(v.span())));
            }
            Use::Value => {}
        }
    }

    fn expr(&mut self, expr: &Expr<'a>, use_: Use) {
        match expr {
            Expr::Var(v) => self.var(v, use_),
            Expr::Const(_) => {}
            Expr::Slice(s) => {
                self.expr(&s.expr, Use::Value);
                for e in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                    self.expr(e, Use::Value);
                }
            }
            Expr::UnaryOp(u) => {
                let inner = if matches!(u.op, UnaryOpKind::Not) {
                    Use::Test
                } else {
                    Use::Value
                };
                self.expr(&u.expr, inner);
            }
            Expr::BinOp(b) if matches!(b.op, BinOpKind::ScAnd | BinOpKind::ScOr) => {
                // `x is defined and x.y`: the right side only runs when the left allows.
                let guards = self.condition(&b.left);
                self.push(guards.iter().copied(), true);
                let start = self.tested.len();
                self.expr(&b.right, use_);
                let right = self.tested.split_off(start);
                self.pop();
                if use_ == Use::Test {
                    self.tested.extend(guards);
                    self.tested.extend(right);
                }
            }
            Expr::BinOp(b) => {
                self.expr(&b.left, Use::Value);
                self.expr(&b.right, Use::Value);
            }
            Expr::Compare(c) => {
                self.expr(&c.expr, Use::Value);
                for op in &c.ops {
                    self.expr(&op.expr, Use::Value);
                }
            }
            Expr::IfExpr(i) => {
                let guards = self.condition(&i.test_expr);
                self.push(guards, true);
                self.expr(&i.true_expr, use_);
                if let Some(e) = &i.false_expr {
                    self.expr(e, use_);
                }
                self.pop();
            }
            Expr::Filter(f) => {
                self.facts
                    .filters
                    .push((f.name.to_string(), tspan(f.span())));
                if let Some(e) = &f.expr {
                    let inner = if matches!(f.name, "default" | "d") {
                        Use::Test
                    } else {
                        Use::Value
                    };
                    self.expr(e, inner);
                }
                self.args(&f.args);
            }
            Expr::Test(t) => {
                self.facts.tests.push((t.name.to_string(), tspan(t.span())));
                self.expr(&t.expr, Use::Test);
                self.args(&t.args);
            }
            Expr::GetAttr(g) => {
                // `context.memory` reads the reserved variable through the union view.
                if is_var(&g.expr, CONTEXT) && RESERVED_VARIABLES.contains(&g.name) {
                    self.facts
                        .reserved
                        .push((g.name.to_string(), tspan(g.span())));
                }
                self.expr(&g.expr, use_);
            }
            Expr::GetItem(g) => {
                if is_var(&g.expr, CONTEXT)
                    && let Some(name) = const_str(&g.subscript_expr)
                    && RESERVED_VARIABLES.contains(&name.as_str())
                {
                    self.facts.reserved.push((name, tspan(g.span())));
                }
                self.expr(&g.expr, use_);
                self.expr(&g.subscript_expr, Use::Value);
            }
            Expr::Call(c) => self.call(c, c.span(), false),
            Expr::List(l) => l.items.iter().for_each(|e| self.expr(e, Use::Value)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| self.expr(e, Use::Value)),
            Expr::Map(m) => {
                for e in m.keys.iter().chain(&m.values) {
                    self.expr(e, Use::Value);
                }
            }
        }
    }

    /// A call; `statement` is true when it is a statement of its own.
    fn call(&mut self, call: &ast::Call<'a>, span: JSpan, statement: bool) {
        if let Expr::Var(f) = &call.expr
            && helper_access(f.id).is_some()
            && !self.is_bound(f.id)
        {
            self.helper_call(f.id, call, span, statement);
        }
        if let Expr::Var(f) = &call.expr
            && f.id == aplc_vm::dialect_names::NEXT
            && !self.is_bound(f.id)
        {
            // The defuss-1.1 dialect's `next(step)` is `set_context('next_step', step)`.
            let value = arg(&call.args, 0, "step_name");
            self.facts.next_steps.push(NextStep {
                target: target_of(value),
                span: tspan(span),
                always: statement && self.depth == 0,
                value: value.map(|v| tspan(v.span())),
            });
        }
        match &call.expr {
            Expr::Var(f) if !self.is_bound(f.id) && !RESERVED_VARIABLES.contains(&f.id) => {
                self.facts.calls.push((f.id.to_string(), tspan(span)));
            }
            callee => self.expr(callee, Use::Value),
        }
        self.args(&call.args);
    }

    fn helper_call(&mut self, helper: &str, call: &ast::Call<'a>, span: JSpan, statement: bool) {
        let writes = helper_access(helper) == Some(Access::Writes);
        let Some(name_arg) = arg(&call.args, 0, "name") else {
            // `set_context(*args)`, `set_context(**kwargs)`: the name is computed.
            self.facts.dynamic_writes |= writes;
            return;
        };
        let Some(mut name) = const_str(name_arg) else {
            self.facts.dynamic_writes |= writes;
            return;
        };
        if aplc_vm::any_dialect_helper(helper).is_some() {
            // Dialect helpers take a dotted path: its first segment is the variable.
            if let Some(root) = name.split(['.', '[']).next() {
                name = root.to_string();
            }
        }
        if RESERVED_VARIABLES.contains(&name.as_str()) {
            self.facts
                .reserved
                .push((name.clone(), tspan(name_arg.span())));
        }
        if !writes {
            return;
        }
        if name == CALL_AGENT && helper == SET_CONTEXT {
            self.facts
                .agent_calls
                .push(agent_call(arg(&call.args, 1, "value"), tspan(span)));
        }
        if name == NEXT_STEP {
            let value = arg(&call.args, 1, "value").filter(|_| helper == SET_CONTEXT);
            let target = match value {
                Some(_) => target_of(value),
                None => Target::Dynamic,
            };
            self.facts.next_steps.push(NextStep {
                target,
                span: tspan(span),
                always: statement && self.depth == 0,
                value: value.map(|v| tspan(v.span())),
            });
        }
        self.facts
            .write_sites
            .push((name.clone(), tspan(name_arg.span())));
        self.facts.writes.push(name);
    }
}

/// What a `call_agent` value tells: the agent's name and the context's keys when they
/// are literals. `call` is the span of the whole call, used when the name is computed.
fn agent_call(value: Option<&Expr<'_>>, call: TSpan) -> AgentCallFact {
    let dynamic = AgentCallFact {
        name: None,
        span: call,
        keys: None,
    };
    let Some(Expr::Map(map)) = value else {
        return dynamic;
    };
    let entry = |key: &str| {
        map.keys
            .iter()
            .zip(&map.values)
            .find(|(k, _)| const_str(k).is_some_and(|k| k == key))
            .map(|(_, v)| v)
    };
    let Some(agent) = entry("agent") else {
        return dynamic;
    };
    let Some(name) = const_str(agent) else {
        return dynamic;
    };
    let keys = match entry("context") {
        None => Some(Vec::new()),
        Some(Expr::Map(context)) => context.keys.iter().map(const_str).collect(),
        Some(_) => None,
    };
    AgentCallFact {
        name: Some(name),
        span: tspan(agent.span()),
        keys,
    }
}

/// The jump target a `next_step` value gives.
fn target_of(value: Option<&Expr<'_>>) -> Target {
    match value {
        Some(Expr::Const(c)) if c.value.is_none() => Target::End,
        Some(value) => match const_str(value) {
            Some(s) if s.is_empty() => Target::End,
            Some(s) => Target::Literal(s),
            None => Target::Dynamic,
        },
        None => Target::Dynamic,
    }
}

/// True when every path through `stmts` writes `next_step` with a helper call that is a
/// statement of its own.
fn always_sets_next_step(stmts: &[Stmt<'_>]) -> bool {
    let writes_next_step = |call: &ast::Call<'_>| {
        matches!(&call.expr, Expr::Var(f) if f.id == aplc_vm::dialect_names::NEXT)
            || matches!(&call.expr, Expr::Var(f) if helper_access(f.id) == Some(Access::Writes))
                && arg(&call.args, 0, "name")
                    .and_then(const_str)
                    .is_some_and(|name| name == NEXT_STEP)
    };
    let statement = |expr: &Expr<'_>| matches!(expr, Expr::Call(c) if writes_next_step(c));
    stmts.iter().any(|stmt| match stmt {
        Stmt::Template(t) => always_sets_next_step(&t.children),
        Stmt::EmitExpr(e) => statement(&e.expr),
        Stmt::Set(s) => statement(&s.expr),
        Stmt::Do(d) => writes_next_step(&d.call),
        Stmt::IfCond(i) => {
            always_sets_next_step(&i.true_body) && always_sets_next_step(&i.false_body)
        }
        Stmt::WithBlock(w) => always_sets_next_step(&w.body),
        Stmt::SetBlock(s) => always_sets_next_step(&s.body),
        Stmt::AutoEscape(a) => always_sets_next_step(&a.body),
        Stmt::FilterBlock(f) => always_sets_next_step(&f.body),
        _ => false,
    })
}

/// Argument `index` by position, or by keyword `keyword`, when it is passed plainly.
fn arg<'x, 'a>(args: &'x [CallArg<'a>], index: usize, keyword: &str) -> Option<&'x Expr<'a>> {
    if args
        .iter()
        .any(|a| matches!(a, CallArg::PosSplat(_) | CallArg::KwargSplat(_)))
    {
        return None;
    }
    let positional: Vec<&Expr<'a>> = args
        .iter()
        .filter_map(|a| match a {
            CallArg::Pos(e) => Some(e),
            _ => None,
        })
        .collect();
    positional.get(index).copied().or_else(|| {
        args.iter().find_map(|a| match a {
            CallArg::Kwarg(k, e) if *k == keyword => Some(e),
            _ => None,
        })
    })
}

/// Every name the template binds anywhere, for macro bodies.
fn collect_locals<'a>(stmts: &[Stmt<'a>], out: &mut HashSet<&'a str>) {
    fn targets<'a>(e: &Expr<'a>, out: &mut HashSet<&'a str>) {
        match e {
            Expr::Var(v) => {
                out.insert(v.id);
            }
            Expr::List(l) => l.items.iter().for_each(|e| targets(e, out)),
            Expr::Tuple(t) => t.items.iter().for_each(|e| targets(e, out)),
            _ => {}
        }
    }
    for stmt in stmts {
        match stmt {
            Stmt::Template(t) => collect_locals(&t.children, out),
            Stmt::ForLoop(f) => {
                targets(&f.target, out);
                collect_locals(&f.body, out);
                collect_locals(&f.else_body, out);
            }
            Stmt::IfCond(i) => {
                collect_locals(&i.true_body, out);
                collect_locals(&i.false_body, out);
            }
            Stmt::WithBlock(w) => {
                w.assignments.iter().for_each(|(t, _)| targets(t, out));
                collect_locals(&w.body, out);
            }
            Stmt::Set(s) => targets(&s.target, out),
            Stmt::SetBlock(s) => {
                targets(&s.target, out);
                collect_locals(&s.body, out);
            }
            Stmt::AutoEscape(a) => collect_locals(&a.body, out),
            Stmt::FilterBlock(f) => collect_locals(&f.body, out),
            Stmt::Block(b) => collect_locals(&b.body, out),
            Stmt::Import(i) => targets(&i.name, out),
            Stmt::FromImport(i) => {
                for (name, alias) in &i.names {
                    targets(alias.as_ref().unwrap_or(name), out);
                }
            }
            Stmt::Macro(m) => {
                out.insert(m.name);
                m.args.iter().for_each(|a| targets(a, out));
                collect_locals(&m.body, out);
            }
            Stmt::CallBlock(c) => {
                c.macro_decl.args.iter().for_each(|a| targets(a, out));
                collect_locals(&c.macro_decl.body, out);
            }
            Stmt::EmitExpr(_)
            | Stmt::EmitRaw(_)
            | Stmt::Extends(_)
            | Stmt::Include(_)
            | Stmt::Continue(_)
            | Stmt::Break(_)
            | Stmt::Do(_) => {}
        }
    }
}

fn tspan(span: JSpan) -> TSpan {
    (span.start_offset as usize, span.end_offset as usize)
}

fn is_var(expr: &Expr<'_>, name: &str) -> bool {
    matches!(expr, Expr::Var(v) if v.id == name)
}

fn const_str(expr: &Expr<'_>) -> Option<String> {
    match expr {
        Expr::Const(c) => c.value.as_str().map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reserved(src: &str) -> Vec<String> {
        analyze(src)
            .unwrap()
            .reserved
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    #[test]
    fn reserved_reads_are_found_in_the_tree() {
        assert_eq!(reserved("{{ memory }}"), ["memory"]);
        assert_eq!(reserved("{% if trace %}x{% endif %}"), ["trace"]);
        assert_eq!(reserved("{{ context.session }}"), ["session"]);
        assert_eq!(reserved("{{ context['checkpoint'] }}"), ["checkpoint"]);
        assert_eq!(reserved("{{ get_context('memory', 1) }}"), ["memory"]);
        assert_eq!(reserved("{% for x in metrics %}{% endfor %}"), ["metrics"]);
    }

    #[test]
    fn call_agent_literals_are_found_with_their_context_keys() {
        let calls = |src: &str| analyze(src).unwrap().agent_calls;
        let src = "{{ set_context('call_agent', {'agent': 't', 'context': {'a': 1, 'b': x}}) }}";
        let found = calls(src);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].name.as_deref(), Some("t"));
        assert_eq!(&src[found[0].span.0..found[0].span.1], "'t'");
        assert_eq!(found[0].keys, Some(vec!["a".into(), "b".into()]));
        // No context: no keys given. A computed context or key: unknown keys.
        assert_eq!(
            calls("{% do set_context('call_agent', {'agent': 't'}) %}")[0].keys,
            Some(vec![])
        );
        assert_eq!(
            calls("{{ set_context('call_agent', {'agent': 't', 'context': c}) }}")[0].keys,
            None
        );
        assert_eq!(
            calls("{{ set_context('call_agent', {'agent': 't', 'context': {k: 1}}) }}")[0].keys,
            None
        );
        // Computed names, and values that are no dict literal, are dynamic.
        assert_eq!(
            calls("{{ set_context('call_agent', {'agent': n}) }}")[0].name,
            None
        );
        assert_eq!(calls("{{ set_context('call_agent', v) }}")[0].name, None);
        // Reading it is no call.
        assert!(calls("{{ get_context('call_agent') }}").is_empty());
    }

    #[test]
    fn prose_is_not_a_read() {
        assert!(reserved("Remember: memory and trace are just words.").is_empty());
        assert!(reserved("{{ result_json.memory }}").is_empty());
        assert!(reserved("{{ 'memory' }}").is_empty());
    }

    #[test]
    fn next_step_targets() {
        let f = analyze(
            "{% if a %}{{ set_context('next_step', 'b') }}{% else %}{{ set_context('next_step', x) }}{% endif %}",
        )
        .unwrap();
        let targets: Vec<_> = f.next_steps.into_iter().map(|n| n.target).collect();
        assert_eq!(targets, [Target::Literal("b".into()), Target::Dynamic]);
    }

    fn always(src: &str) -> Vec<(Target, bool)> {
        analyze(src)
            .unwrap()
            .next_steps
            .into_iter()
            .map(|n| (n.target, n.always))
            .collect()
    }

    #[test]
    fn next_step_writes_know_whether_they_always_run() {
        let lit = |s: &str| Target::Literal(s.into());
        assert_eq!(
            always("{{ set_context('next_step', 'a') }}"),
            [(lit("a"), true)]
        );
        assert_eq!(
            always("{% do set_context('next_step', 'a') %}"),
            [(lit("a"), true)]
        );
        assert_eq!(
            always("{% with x = 1 %}{{ set_context(name='next_step', value='a') }}{% endwith %}"),
            [(lit("a"), true)]
        );
        assert_eq!(
            always("{% if x %}{{ set_context('next_step', 'a') }}{% endif %}"),
            [(lit("a"), false)]
        );
        assert_eq!(
            always("{% for i in [1] %}{{ set_context('next_step', 'a') }}{% endfor %}"),
            [(lit("a"), false)]
        );
        assert_eq!(
            always("{{ x and set_context('next_step', 'a') }}"),
            [(lit("a"), false)]
        );
        assert_eq!(
            always("{{ set_context('next_step', none) }}{{ set_context('next_step', '') }}"),
            [(Target::End, true), (Target::End, true)]
        );
        assert_eq!(
            always("{{ inc_context('next_step') }}"),
            [(Target::Dynamic, true)]
        );
    }

    #[test]
    fn always_sets_next_step_follows_every_branch() {
        let always = |src: &str| analyze(src).unwrap().always_sets_next_step;
        assert!(always("{{ set_context('next_step', 'a') }}"));
        assert!(always(
            "{% if x %}{{ set_context('next_step', 'a') }}{% else %}{{ set_context('next_step', x) }}{% endif %}"
        ));
        assert!(always(
            "{% if x %}{{ set_context('next_step', 'a') }}{% elif y %}{% do set_context('next_step', 'b') %}{% else %}{{ inc_context('next_step') }}{% endif %}"
        ));
        assert!(!always(
            "{% if x %}{{ set_context('next_step', 'a') }}{% elif y %}{{ set_context('next_step', 'b') }}{% endif %}"
        ));
        assert!(!always(
            "{% if x %}{{ set_context('next_step', 'a') }}{% endif %}"
        ));
        assert!(!always(
            "{% for i in x %}{{ set_context('next_step', 'a') }}{% endfor %}"
        ));
        assert!(!always("{{ set_context('other', 'a') }}"));
        assert!(!always("{{ x and set_context('next_step', 'a') }}"));
    }

    fn reads(src: &str) -> Vec<String> {
        analyze(src)
            .unwrap()
            .reads
            .into_iter()
            .map(|(n, _)| n)
            .collect()
    }

    #[test]
    fn reads_respect_scopes() {
        assert_eq!(reads("{{ a }}{{ b.c }}{{ d[e] }}"), ["a", "b", "d", "e"]);
        assert!(reads("{% set x = 1 %}{{ x }}").is_empty());
        assert_eq!(reads("{{ x }}{% set x = 1 %}"), ["x"]);
        assert!(reads("{% for i in [1] %}{{ i }}{{ loop.index }}{% endfor %}").is_empty());
        assert_eq!(reads("{% for i in [1] %}{% endfor %}{{ i }}"), ["i"]);
        assert!(reads("{% with y = 2 %}{{ y }}{% endwith %}").is_empty());
        assert!(reads("{% if c %}{% set z = 1 %}{% endif %}{{ z }}").is_empty());
        assert!(reads("{% macro m(a, b=1) %}{{ a }}{{ b }}{{ caller }}{{ later }}{% endmacro %}{% set later = 1 %}").is_empty());
        assert!(reads("{% set t %}text{% endset %}{{ t }}").is_empty());
        assert!(reads("{% for k, v in {}|items %}{{ k }}{{ v }}{% endfor %}").is_empty());
        assert_eq!(reads("{% set ns.x = 1 %}"), ["ns"]);
    }

    #[test]
    fn tests_and_guards_are_not_reads() {
        assert!(reads("{% if maybe %}x{% endif %}").is_empty());
        assert!(reads("{% if not maybe %}x{% endif %}").is_empty());
        assert!(reads("{{ maybe is defined }}{{ maybe is none }}").is_empty());
        assert!(reads("{{ maybe | default('x') }}{{ maybe | d(1) }}").is_empty());
        assert!(
            reads("{% if maybe is defined %}{{ maybe.x }}{% else %}{{ maybe }}{% endif %}")
                .is_empty()
        );
        assert!(reads("{{ maybe.x if maybe else 'none' }}").is_empty());
        assert!(reads("{% if maybe is defined and maybe > 1 %}x{% endif %}").is_empty());
        assert!(reads("{{ maybe or 'fallback' }}").is_empty());
        assert!(
            reads("{{ get_context('maybe', 1) }}")
                .iter()
                .all(|n| n == "get_context")
        );
        assert_eq!(reads("{% if other %}{{ maybe }}{% endif %}"), ["maybe"]);
        assert_eq!(reads("{{ maybe | length }}"), ["maybe"]);
        assert_eq!(reads("{% if maybe > 1 %}x{% endif %}"), ["maybe"]);
    }

    #[test]
    fn writes_by_name() {
        let f = analyze(
            "{{ set_context('a', 1) }}{{ add_context('b', 1) }}{{ inc_context(name='c') }}{{ get_context('d') }}",
        )
        .unwrap();
        assert_eq!(f.writes, ["a", "b", "c"]);
        assert!(!f.dynamic_writes);
        assert!(analyze("{{ set_context(k, 1) }}").unwrap().dynamic_writes);
        assert!(!analyze("{{ get_context(k) }}").unwrap().dynamic_writes);
    }

    #[test]
    fn calls_sets_filters_and_tests() {
        let f = analyze(
            "{% set a = 1 %}{% set b %}x{% endset %}{% macro m() %}{% endmacro %}\
             {{ set('x', 1) }}{{ m() }}{{ range(2) }}{{ y | upper | foo }}{{ y is odd }}",
        )
        .unwrap();
        let calls: Vec<&str> = f.calls.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(calls, ["set", "range"]);
        assert_eq!(f.sets, ["a", "b"]);
        let filters: Vec<&str> = f.filters.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(filters, ["foo", "upper"]);
        assert_eq!(f.tests.len(), 1);
        // The callee of a call is not a read.
        assert_eq!(reads("{{ set('x', 1) }}"), Vec::<String>::new());
    }

    #[test]
    fn syntax_errors_have_spans() {
        let e = analyze("ok\n{% if x %}\nunclosed").unwrap_err();
        assert!(e.line.is_some());
        assert!(!e.message.is_empty());
    }

    #[test]
    fn unsupported_statements() {
        let f = analyze("{% include 'x' %}").unwrap();
        assert_eq!(f.unsupported.len(), 1);
    }
}
