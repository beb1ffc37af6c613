//! What a command is, as `COMMAND DOCS` and `HELP` describe it: its name,
//! arity, flags and arguments. A leaf: the stock commands describe
//! themselves with a [`Doc`] in their own files without depending on how
//! commands are dispatched ([`crate::command::spec::stock`] pairs each with
//! who serves it), so the command table can name the stock service without
//! an import circle.

/// One argument, as `COMMAND DOCS` and `HELP` describe it.
#[derive(Debug, Clone, Copy)]
pub struct ArgSpec {
    pub name: &'static str,
    /// `string`, `integer` or `key`, as in Redis's docs.
    pub kind: &'static str,
    pub optional: bool,
    /// It may be given any number of times (`COMMAND INFO [name ...]`).
    pub multiple: bool,
}

pub const fn arg(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: false,
        multiple: false,
    }
}

pub const fn optional(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
        multiple: false,
    }
}

/// An optional argument that may be repeated.
pub const fn optional_many(name: &'static str, kind: &'static str) -> ArgSpec {
    ArgSpec {
        name,
        kind,
        optional: true,
        multiple: true,
    }
}

/// A command without subcommands, as its own file describes it.
pub struct Doc {
    /// Lowercase, as Redis lists commands.
    pub name: &'static str,
    /// Redis arity: the name included; negative means "at least".
    pub arity: i64,
    /// Most arguments, the name included (Redis arity can't say "4 or 5").
    pub max_args: Option<usize>,
    pub flags: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
    pub args: &'static [ArgSpec],
}

impl Doc {
    /// Whether `count` words (the name included) fit the arity.
    pub fn arity_ok(&self, count: usize) -> bool {
        arity_fits(self.arity, self.max_args, count)
    }
}

/// Whether `count` words (the name included) fit a Redis arity and an
/// optional most.
pub fn arity_fits(arity: i64, max_args: Option<usize>, count: usize) -> bool {
    let count = count as i64;
    let fits = if arity >= 0 {
        count == arity
    } else {
        count >= -arity
    };
    fits && max_args.is_none_or(|max| count <= max as i64)
}
