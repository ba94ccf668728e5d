//! A program's dialect: the set of template helpers beyond the spec's it was compiled
//! with, recorded in the bundle header's flags (`spec/dialects.md`,
//! `spec/bundle-format.md`). The helpers themselves are in `template/dialect.rs`.
//!
//! The default is [`Dialect::Spec`], which adds nothing. [`Dialect::Defuss11`] is
//! defuss-apl 1.1.0's: `set`/`get` with dotted paths, the accumulators `add`, `inc`,
//! `dec` and `rem`, `next`, `prev`, `result` and `set_json_path`, and the variable
//! `current_step`. Their behaviour was learnt by running that runtime; what still
//! differs is listed in `spec/dialects.md`.
//!
//! A dialect is chosen when a program is compiled or loaded: the compiler checks names
//! against the same environment the run renders with.

use crate::names::{Access, Helper};

/// A set of template helpers beyond the spec's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
#[non_exhaustive]
pub enum Dialect {
    /// The spec alone.
    #[default]
    Spec,
    /// defuss-apl 1.1.0's helpers.
    Defuss11,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 2] = [Dialect::Spec, Dialect::Defuss11];

    /// The dialect's name, as `--dialect` and the Python `dialect` option take it.
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Spec => "spec",
            Dialect::Defuss11 => "defuss-1.1",
        }
    }

    /// The dialect called `name`.
    pub fn from_name(name: &str) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.as_str() == name)
    }

    /// The bundle header's flags for a program of this dialect
    /// (`spec/bundle-format.md`): its number in the low byte, the spec's being 0.
    pub fn bundle_flags(self) -> u16 {
        match self {
            Dialect::Spec => 0,
            Dialect::Defuss11 => 1,
        }
    }

    /// The dialect a bundle header's flags name; `None` for flags no dialect has (a
    /// bundle from a later aplc, or damaged).
    pub fn from_bundle_flags(flags: u16) -> Option<Dialect> {
        Dialect::ALL.into_iter().find(|d| d.bundle_flags() == flags)
    }

    /// The variables the dialect's executor maintains beyond the spec's: defuss-apl's
    /// `current_step`, the step being run, set when a step is entered.
    pub fn variables(self) -> &'static [&'static str] {
        match self {
            Dialect::Spec => &[],
            Dialect::Defuss11 => &[CURRENT_STEP],
        }
    }

    /// The helpers the dialect adds to the spec's.
    pub fn helpers(self) -> &'static [Helper] {
        match self {
            Dialect::Spec => &[],
            Dialect::Defuss11 => DEFUSS_HELPERS,
        }
    }
}

impl std::fmt::Display for Dialect {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `set(path, value)`.
pub const SET: &str = "set";
/// `get(path, default=None)`.
pub const GET: &str = "get";
/// `add(path, value, default=0)`.
pub const ADD: &str = "add";
/// `inc(path, default=0)`.
pub const INC: &str = "inc";
/// `dec(path, default=0)`.
pub const DEC: &str = "dec";
/// `rem(path, value, default=0)`.
pub const REM: &str = "rem";
/// `next(step)`: sets `next_step`.
pub const NEXT: &str = "next";
/// `prev()`: `prev_step`.
pub const PREV: &str = "prev";
/// `result(kind=None)`: `result_text`, or `result_<kind>`.
pub const RESULT: &str = "result";
/// `set_json_path(data, path, value)`: writes into `data` where the context holds it.
pub const SET_JSON_PATH: &str = "set_json_path";
/// The variable holding the name of the step being run.
pub const CURRENT_STEP: &str = "current_step";

/// defuss-apl 1.1.0's helpers. The first argument of the accumulators and `set` is a
/// dotted path whose first segment is the variable written.
const DEFUSS_HELPERS: &[Helper] = &[
    Helper {
        name: SET,
        access: Access::Writes,
    },
    Helper {
        name: GET,
        access: Access::Reads,
    },
    Helper {
        name: ADD,
        access: Access::Writes,
    },
    Helper {
        name: INC,
        access: Access::Writes,
    },
    Helper {
        name: DEC,
        access: Access::Writes,
    },
    Helper {
        name: REM,
        access: Access::Writes,
    },
    Helper {
        name: NEXT,
        access: Access::None,
    },
    Helper {
        name: PREV,
        access: Access::None,
    },
    Helper {
        name: RESULT,
        access: Access::None,
    },
    Helper {
        name: SET_JSON_PATH,
        access: Access::None,
    },
];

/// The dialect helper called `name` in any dialect, for the compiler's analysis (which
/// knows every dialect; the name checks then refuse a helper the program's dialect
/// lacks).
pub fn any_dialect_helper(name: &str) -> Option<&'static Helper> {
    DEFUSS_HELPERS.iter().find(|h| h.name == name)
}
