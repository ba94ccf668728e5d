//! Checks made on a template's tokens before minijinja parses it: expression depth and
//! statements APL does not support.
//!
//! minijinja's parser, code generator and syntax-tree destructor recurse once per level
//! of an expression tree, and so does the compiler's own analysis. Operator chains
//! (`1+1+…`, `not not …`, `x.a.a…`, `x|f|f…`) build trees as deep as they are long,
//! and minijinja bounds only bracket and statement nesting, so about 50,000 terms
//! overflowed the stack. [`check_depth`] runs minijinja's own lexer (the exact tokens its
//! parser will see), estimates each expression's tree depth from them and refuses a
//! template past [`MAX_EXPRESSION_DEPTH`] before anything recursive runs. Both the
//! compiler (before it parses a template) and [`Program::from_bundle`] (before it
//! compiles one) call it, so a crafted bundle is covered too.
//!
//! [`check_statements`] refuses `include`, `import`, `extends` and `block`: every APL
//! template is self-contained, the compiler rejects them, and a crafted bundle must not
//! get them past the loader either.
//!
//! The checks are linear in the template's length and allocate only a stack of
//! counters, one per open bracket.
//!
//! [`Program::from_bundle`]: crate::Program::from_bundle

use minijinja::machinery::{Token, tokenize};
use minijinja::syntax::SyntaxConfig;

/// The deepest expression tree a template may contain, estimated from its tokens: along
/// the way into any point of an expression, the number of operators, attribute and item
/// lookups, calls, filters, tests, conditional-expression keywords and brackets not yet
/// closed, counting only the current element of each list, argument list or map.
///
/// Chosen so that the deepest allowed expression parses, compiles, renders and is
/// dropped on a 2 MiB thread stack (tokio's worker default) in a debug build, with room
/// to spare; a test below proves it. Real templates stay far below: a condition of 20
/// `or`ed comparisons is about 40 deep.
pub const MAX_EXPRESSION_DEPTH: usize = 256;

/// Why a template was refused before it was parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TemplateFault {
    /// An expression is nested deeper than [`MAX_EXPRESSION_DEPTH`].
    #[error(
        "an expression is nested too deeply (more than {MAX_EXPRESSION_DEPTH} operators, lookups, filters or brackets deep)"
    )]
    TooDeep {
        /// Byte range, in the template, of the token where the limit was passed.
        span: (usize, usize),
    },
    /// A statement that would pull in another template.
    #[error(
        "`{{% {statement} %}}` is not supported in APL templates: each template is self-contained"
    )]
    Unsupported {
        /// The statement's keyword: `include`, `import`, `from`, `extends` or `block`.
        statement: &'static str,
        /// Byte range, in the template, of the keyword.
        span: (usize, usize),
    },
}

impl TemplateFault {
    /// Where in the template the fault is, as a byte range.
    pub fn span(&self) -> (usize, usize) {
        match self {
            TemplateFault::TooDeep { span } | TemplateFault::Unsupported { span, .. } => *span,
        }
    }
}

/// Runs every check: [`check_depth`], then [`check_statements`].
pub fn check_template(source: &str) -> Result<(), TemplateFault> {
    check_depth(source)?;
    check_statements(source)
}

/// Refuses a template with an expression deeper than [`MAX_EXPRESSION_DEPTH`].
///
/// A lexer error ends the check with `Ok`: minijinja's parser reads the same tokens and
/// stops with a syntax error at that same point, never past it.
pub fn check_depth(source: &str) -> Result<(), TemplateFault> {
    // The running count of each open bracket level, outermost first; `depth` is their
    // sum, the estimated depth of the tree at the current token.
    let mut levels: Vec<usize> = vec![0];
    let mut depth = 0usize;
    for token in tokenize(source, false, SyntaxConfig::default()) {
        let Ok((token, span)) = token else {
            return Ok(());
        };
        match token {
            Token::TemplateData(_)
            | Token::VariableStart
            | Token::VariableEnd
            | Token::BlockStart
            | Token::BlockEnd => {
                levels.clear();
                levels.push(0);
                depth = 0;
            }
            // Separators start a sibling: list items, arguments, map keys and values,
            // slice bounds, assignment targets and values do not nest in one another.
            Token::Comma | Token::Colon | Token::Assign => {
                if let Some(top) = levels.last_mut() {
                    depth -= *top;
                    *top = 0;
                }
            }
            Token::ParenOpen | Token::BracketOpen | Token::BraceOpen => {
                if let Some(top) = levels.last_mut() {
                    *top += 1;
                }
                depth += 1;
                levels.push(0);
            }
            // An unbalanced closer is the parser's to report; the base level stays.
            Token::ParenClose | Token::BracketClose | Token::BraceClose if levels.len() > 1 => {
                depth -= levels.pop().unwrap_or(0);
            }
            token if deepens(&token) => {
                if let Some(top) = levels.last_mut() {
                    *top += 1;
                }
                depth += 1;
            }
            _ => {}
        }
        if depth > MAX_EXPRESSION_DEPTH {
            return Err(TemplateFault::TooDeep {
                span: (span.start_offset as usize, span.end_offset as usize),
            });
        }
    }
    Ok(())
}

/// Refuses a template that uses `include`, `import`, `from … import`, `extends` or
/// `block`.
///
/// minijinja picks a statement by the identifier right after `{%`, so that is where
/// these are found; the same word anywhere else (a variable named `block`) is fine.
pub fn check_statements(source: &str) -> Result<(), TemplateFault> {
    let mut after_block_start = false;
    for token in tokenize(source, false, SyntaxConfig::default()) {
        let Ok((token, span)) = token else {
            return Ok(());
        };
        if after_block_start && let Token::Ident(word) = token {
            let statement = match word {
                "include" => Some("include"),
                "import" => Some("import"),
                "from" => Some("from"),
                "extends" => Some("extends"),
                "block" => Some("block"),
                _ => None,
            };
            if let Some(statement) = statement {
                return Err(TemplateFault::Unsupported {
                    statement,
                    span: (span.start_offset as usize, span.end_offset as usize),
                });
            }
        }
        after_block_start = matches!(token, Token::BlockStart);
    }
    Ok(())
}

/// Tokens that add a level to the expression tree (or to the parser's recursion):
/// binary and unary operators, `.` lookups, filters, tests and `if`/`else`.
/// Comparisons build one flat node, and a word like `and` after a `.` is an attribute,
/// not an operator; counting them anyway only makes the estimate safer.
fn deepens(token: &Token<'_>) -> bool {
    match token {
        Token::Plus
        | Token::Minus
        | Token::Mul
        | Token::Div
        | Token::FloorDiv
        | Token::Pow
        | Token::Mod
        | Token::Dot
        | Token::Tilde
        | Token::Pipe
        | Token::Eq
        | Token::Ne
        | Token::Gt
        | Token::Gte
        | Token::Lt
        | Token::Lte => true,
        Token::Ident(word) => matches!(*word, "and" | "or" | "not" | "is" | "in" | "if" | "else"),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn depth_ok(source: &str) -> bool {
        check_depth(source).is_ok()
    }

    #[test]
    fn chains_past_the_limit_are_refused() {
        let n = MAX_EXPRESSION_DEPTH;
        for (ok, bad) in [
            (
                format!("{{{{ 1{} }}}}", "+1".repeat(n)),
                format!("{{{{ 1{} }}}}", "+1".repeat(n + 1)),
            ),
            (
                format!("{{{{ {}x }}}}", "not ".repeat(n)),
                format!("{{{{ {}x }}}}", "not ".repeat(n + 1)),
            ),
            (
                format!("{{{{ x{} }}}}", ".a".repeat(n)),
                format!("{{{{ x{} }}}}", ".a".repeat(n + 1)),
            ),
            (
                format!("{{{{ x{} }}}}", "|e".repeat(n)),
                format!("{{{{ x{} }}}}", "|e".repeat(n + 1)),
            ),
            (
                format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n)),
                format!("{{{{ {}1{} }}}}", "(".repeat(n + 1), ")".repeat(n + 1)),
            ),
        ] {
            assert!(depth_ok(&ok), "{}", &ok[..20]);
            assert!(!depth_ok(&bad), "{}", &bad[..20]);
        }
    }

    #[test]
    fn siblings_do_not_add_up() {
        let n = MAX_EXPRESSION_DEPTH;
        let items = vec!["a.b.c + 1"; n].join(", ");
        assert!(depth_ok(&format!("{{{{ [{items}] }}}}")));
        assert!(depth_ok(&format!("{{{{ f({items}) }}}}")));
        let pairs = (0..n)
            .map(|i| format!("'k{i}': x.y"))
            .collect::<Vec<_>>()
            .join(", ");
        assert!(depth_ok(&format!("{{{{ {{{pairs}}} }}}}")));
        // Each block starts again at zero.
        let block = format!("{{{{ 1{} }}}}", "+1".repeat(n / 2));
        assert!(depth_ok(&block.repeat(10)));
        assert!(depth_ok(&format!(
            "{{% if a {} %}}x{{% endif %}}",
            "or a ".repeat(n / 2 - 1)
        )));
    }

    #[test]
    fn nesting_adds_the_chains_along_the_way() {
        let half = MAX_EXPRESSION_DEPTH / 2;
        let inner = format!("1{}", "+1".repeat(half));
        assert!(!depth_ok(&format!(
            "{{{{ 1{}+({inner}) }}}}",
            "+1".repeat(half)
        )));
        // Text outside blocks and lexer errors are not this check's business.
        assert!(depth_ok(&"+".repeat(10 * MAX_EXPRESSION_DEPTH)));
        assert!(depth_ok("{{ 'unterminated"));
        assert!(depth_ok(")))))) {{ ))) ((( }}"));
    }

    #[test]
    fn unsupported_statements_are_found_after_the_block_start() {
        for (source, statement) in [
            ("{% include 'a' %}", "include"),
            ("x {%- import 'a' as m %}", "import"),
            ("{% from 'a' import m %}", "from"),
            ("{% extends 'a' %}", "extends"),
            ("{% block b %}{% endblock %}", "block"),
        ] {
            match check_statements(source) {
                Err(TemplateFault::Unsupported { statement: s, span }) => {
                    assert_eq!(s, statement);
                    assert_eq!(&source[span.0..span.1], statement);
                }
                other => panic!("{source}: {other:?}"),
            }
        }
        for source in [
            "{{ include }}",
            "{% set block = 1 %}{{ block }}",
            "{% for from in x %}{% endfor %}",
            "{% raw %}{% include 'a' %}{% endraw %}",
            "{# {% include 'a' %} #}",
        ] {
            assert_eq!(check_statements(source), Ok(()), "{source}");
        }
    }
}

/// The deepest templates the checks allow must be safe on a small stack: parsed,
/// compiled, rendered and dropped on a 2 MiB thread (tokio's worker default), in
/// whatever build the tests run in (a debug build in CI).
#[cfg(test)]
mod stack_tests {
    use minijinja::context;

    use super::*;
    use crate::template::env::{Limits, template_env};

    /// Templates at (or just under) every limit, in the shapes that recurse.
    fn deepest() -> Vec<String> {
        let n = MAX_EXPRESSION_DEPTH;
        let half = n / 2;
        let mut out = vec![
            format!("{{{{ 1{} }}}}", "+1".repeat(n)),
            format!("{{{{ 2{} }}}}", "**2".repeat(n)),
            format!("{{{{ {}x }}}}", "not ".repeat(n)),
            format!("{{{{ {}1 }}}}", "- ".repeat(n)),
            format!("{{{{ x{} }}}}", ".a".repeat(n)),
            format!("{{{{ x{} }}}}", "|string".repeat(n)),
            format!("{{{{ x{} }}}}", " is defined".repeat(n)),
            format!("{{{{ 1{} }}}}", " if x else 1".repeat(half)),
            format!("{{{{ {}1{} }}}}", "(1+".repeat(half), ")".repeat(half)),
            format!("{{{{ {}1{} }}}}", "x[".repeat(half), "]".repeat(half)),
            format!("{{{{ {}1{} }}}}", "[".repeat(n), "]".repeat(n)),
            format!("{{{{ {}1{} }}}}", "{'a': ".repeat(n), "}".repeat(n)),
            format!("{{{{ {}1{} }}}}", "range(".repeat(n), ")".repeat(n)),
            format!("{{{{ {}1{} }}}}", "(".repeat(n), ")".repeat(n)),
        ];
        // Statements nested as deep as minijinja allows, around the deepest expression.
        for levels in [140, 150] {
            out.push(format!(
                "{}{{{{ 1{} }}}}{}",
                "{% if x %}".repeat(levels),
                "+1".repeat(n),
                "{% endif %}".repeat(levels)
            ));
            out.push(format!(
                "{}{{{{ 1 }}}}{}",
                "{% for i in x %}".repeat(levels),
                "{% endfor %}".repeat(levels)
            ));
        }
        out
    }

    #[test]
    fn the_deepest_allowed_templates_are_safe_on_a_2_mib_stack() {
        let templates = deepest();
        for t in &templates {
            assert_eq!(check_template(t), Ok(()), "{}", &t[..t.len().min(40)]);
        }
        // A test thread with tokio's worker stack size; the crate itself spawns none.
        #[allow(clippy::disallowed_methods)]
        let worker = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || {
                let env = template_env(&Limits::default());
                for (i, t) in templates.into_iter().enumerate() {
                    let mut env = env.clone();
                    // minijinja may refuse some (its own nesting limit); it must not crash.
                    if env.add_template_owned("t", t).is_ok() {
                        let tmpl = env.get_template("t").expect("just added");
                        let _ = tmpl.render(context! { x => context! { a => 1 } });
                    }
                    drop(env);
                    let _ = i;
                }
            })
            .expect("spawn a 2 MiB thread");
        worker.join().expect("no stack overflow on a 2 MiB stack");
    }
}
