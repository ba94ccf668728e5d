//! What the compiler learns from a template's Jinja syntax tree.
//!
//! Templates are parsed with minijinja's own parser (`machinery::parse`), so the checks
//! here see exactly the structure the VM will run: a reserved variable is found where the
//! template *reads* it, never by scanning text (the word "memory" in prose is fine), and
//! `next_step` targets come from literal `set_context('next_step', '<name>')` calls.

use aplc_vm::minijinja::machinery::ast::{self, CallArg, Expr, Stmt};
use aplc_vm::minijinja::machinery::{self, Span as JSpan};
use aplc_vm::minijinja::syntax::SyntaxConfig;

pub use aplc_vm::RESERVED_VARIABLES;

/// Helpers whose first argument names a context variable.
const NAMING_HELPERS: &[&str] = &["set_context", "get_context", "add_context", "inc_context"];

/// A byte range within a template's text.
pub(crate) type TSpan = (usize, usize);

/// What one template does that the compiler cares about.
#[derive(Debug, Default)]
pub(crate) struct Facts {
    /// Reads of reserved variables: the name and where.
    pub reserved: Vec<(String, TSpan)>,
    /// `set_context('next_step', …)` calls.
    pub next_steps: Vec<(Target, TSpan)>,
    /// Statements APL templates cannot use (`include`, `extends`, …): what and where.
    pub unsupported: Vec<(&'static str, TSpan)>,
}

/// The value a `set_context('next_step', …)` call gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Target {
    /// A string literal.
    Literal(String),
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
    let mut facts = Facts::default();
    stmt_facts(&stmt, &mut facts);
    Ok(facts)
}

fn tspan(span: JSpan) -> TSpan {
    (span.start_offset as usize, span.end_offset as usize)
}

fn stmts_facts(stmts: &[Stmt<'_>], facts: &mut Facts) {
    for s in stmts {
        stmt_facts(s, facts);
    }
}

fn stmt_facts(stmt: &Stmt<'_>, facts: &mut Facts) {
    match stmt {
        Stmt::Template(t) => stmts_facts(&t.children, facts),
        Stmt::EmitExpr(e) => expr_facts(&e.expr, facts),
        Stmt::EmitRaw(_) | Stmt::Continue(_) | Stmt::Break(_) => {}
        Stmt::ForLoop(f) => {
            expr_facts(&f.target, facts);
            expr_facts(&f.iter, facts);
            if let Some(e) = &f.filter_expr {
                expr_facts(e, facts);
            }
            stmts_facts(&f.body, facts);
            stmts_facts(&f.else_body, facts);
        }
        Stmt::IfCond(i) => {
            expr_facts(&i.expr, facts);
            stmts_facts(&i.true_body, facts);
            stmts_facts(&i.false_body, facts);
        }
        Stmt::WithBlock(w) => {
            for (target, value) in &w.assignments {
                expr_facts(target, facts);
                expr_facts(value, facts);
            }
            stmts_facts(&w.body, facts);
        }
        Stmt::Set(s) => {
            expr_facts(&s.target, facts);
            expr_facts(&s.expr, facts);
        }
        Stmt::SetBlock(s) => {
            expr_facts(&s.target, facts);
            if let Some(f) = &s.filter {
                expr_facts(f, facts);
            }
            stmts_facts(&s.body, facts);
        }
        Stmt::AutoEscape(a) => {
            expr_facts(&a.enabled, facts);
            stmts_facts(&a.body, facts);
        }
        Stmt::FilterBlock(f) => {
            expr_facts(&f.filter, facts);
            stmts_facts(&f.body, facts);
        }
        Stmt::Block(b) => {
            facts.unsupported.push(("{% block %}", tspan(b.span())));
            stmts_facts(&b.body, facts);
        }
        Stmt::Import(i) => facts.unsupported.push(("{% import %}", tspan(i.span()))),
        Stmt::FromImport(i) => facts
            .unsupported
            .push(("{% from … import %}", tspan(i.span()))),
        Stmt::Extends(e) => facts.unsupported.push(("{% extends %}", tspan(e.span()))),
        Stmt::Include(i) => facts.unsupported.push(("{% include %}", tspan(i.span()))),
        Stmt::Macro(m) => macro_facts(m, facts),
        Stmt::CallBlock(c) => {
            call_facts(&c.call, c.call.span(), facts);
            macro_facts(&c.macro_decl, facts);
        }
        Stmt::Do(d) => call_facts(&d.call, d.call.span(), facts),
    }
}

fn macro_facts(m: &ast::Macro<'_>, facts: &mut Facts) {
    for e in m.args.iter().chain(&m.defaults) {
        expr_facts(e, facts);
    }
    stmts_facts(&m.body, facts);
}

fn args_facts(args: &[CallArg<'_>], facts: &mut Facts) {
    for arg in args {
        match arg {
            CallArg::Pos(e)
            | CallArg::Kwarg(_, e)
            | CallArg::PosSplat(e)
            | CallArg::KwargSplat(e) => expr_facts(e, facts),
        }
    }
}

fn expr_facts(expr: &Expr<'_>, facts: &mut Facts) {
    match expr {
        Expr::Var(v) => {
            if RESERVED_VARIABLES.contains(&v.id) {
                facts.reserved.push((v.id.to_string(), tspan(v.span())));
            }
        }
        Expr::Const(_) => {}
        Expr::Slice(s) => {
            expr_facts(&s.expr, facts);
            for e in [&s.start, &s.stop, &s.step].into_iter().flatten() {
                expr_facts(e, facts);
            }
        }
        Expr::UnaryOp(u) => expr_facts(&u.expr, facts),
        Expr::BinOp(b) => {
            expr_facts(&b.left, facts);
            expr_facts(&b.right, facts);
        }
        Expr::Compare(c) => {
            expr_facts(&c.expr, facts);
            for op in &c.ops {
                expr_facts(&op.expr, facts);
            }
        }
        Expr::IfExpr(i) => {
            expr_facts(&i.test_expr, facts);
            expr_facts(&i.true_expr, facts);
            if let Some(e) = &i.false_expr {
                expr_facts(e, facts);
            }
        }
        Expr::Filter(f) => {
            if let Some(e) = &f.expr {
                expr_facts(e, facts);
            }
            args_facts(&f.args, facts);
        }
        Expr::Test(t) => {
            expr_facts(&t.expr, facts);
            args_facts(&t.args, facts);
        }
        Expr::GetAttr(g) => {
            // `context.memory` reads the reserved variable through the union view.
            if is_var(&g.expr, "context") && RESERVED_VARIABLES.contains(&g.name) {
                facts.reserved.push((g.name.to_string(), tspan(g.span())));
            }
            expr_facts(&g.expr, facts);
        }
        Expr::GetItem(g) => {
            if is_var(&g.expr, "context")
                && let Some(name) = const_str(&g.subscript_expr)
                && RESERVED_VARIABLES.contains(&name.as_str())
            {
                facts.reserved.push((name, tspan(g.span())));
            }
            expr_facts(&g.expr, facts);
            expr_facts(&g.subscript_expr, facts);
        }
        Expr::Call(c) => call_facts(c, c.span(), facts),
        Expr::List(l) => l.items.iter().for_each(|e| expr_facts(e, facts)),
        Expr::Tuple(t) => t.items.iter().for_each(|e| expr_facts(e, facts)),
        Expr::Map(m) => {
            for e in m.keys.iter().chain(&m.values) {
                expr_facts(e, facts);
            }
        }
    }
}

fn call_facts(call: &ast::Call<'_>, span: JSpan, facts: &mut Facts) {
    if let Expr::Var(f) = &call.expr
        && NAMING_HELPERS.contains(&f.id)
        && let Some(CallArg::Pos(first)) = call.args.first()
        && let Some(name) = const_str(first)
    {
        if RESERVED_VARIABLES.contains(&name.as_str()) {
            facts.reserved.push((name.clone(), tspan(first.span())));
        }
        if f.id == "set_context" && name == "next_step" {
            let target = match call.args.get(1) {
                Some(CallArg::Pos(value)) => match const_str(value) {
                    Some(s) => Target::Literal(s),
                    None => Target::Dynamic,
                },
                _ => Target::Dynamic,
            };
            facts.next_steps.push((target, tspan(span)));
        } else if f.id != "get_context" && name == "next_step" {
            facts.next_steps.push((Target::Dynamic, tspan(span)));
        }
    }
    expr_facts(&call.expr, facts);
    args_facts(&call.args, facts);
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
        let targets: Vec<_> = f.next_steps.into_iter().map(|(t, _)| t).collect();
        assert_eq!(targets, [Target::Literal("b".into()), Target::Dynamic]);
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
