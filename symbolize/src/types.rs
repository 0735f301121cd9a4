//! Frames and the reasons an address has none.

use std::fmt;

/// Where an answer came from, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// DWARF: function, file, line and inline frames.
    Dwarf,
    /// `.symtab`: the function name only.
    Symtab,
    /// `.dynsym`: the name of an exported function only.
    Dynsym,
}

impl Source {
    /// Stable lower-case name, for APIs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dwarf => "dwarf",
            Self::Symtab => "symtab",
            Self::Dynsym => "dynsym",
        }
    }
}

/// Why an address has no frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Miss {
    /// The file has DWARF or symbols, but none covers this address.
    OutsideFunctions,
    /// The file has neither DWARF nor a symbol table.
    NoSymbols,
}

impl Miss {
    /// Stable lower-case name, for APIs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::OutsideFunctions => "outside_functions",
            Self::NoSymbols => "no_symbols",
        }
    }
}

impl fmt::Display for Miss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::OutsideFunctions => "the address is outside every function the file describes",
            Self::NoSymbols => "the file has neither DWARF nor a symbol table",
        })
    }
}

/// One frame, borrowed from a [`crate::SymbolIndex`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameRef<'a> {
    /// Demangled function name (Rust legacy hashes removed).
    pub function: Option<&'a str>,
    /// The raw (linkage) name when it differs from `function`.
    pub linkage_name: Option<LinkageName<'a>>,
    /// Source file path as the DWARF names it.
    pub file: Option<&'a str>,
    /// Line, 0 when unknown.
    pub line: u32,
    /// Column, 0 when unknown.
    pub column: u32,
}

impl FrameRef<'_> {
    /// An owned copy.
    pub fn to_owned(&self) -> Frame {
        Frame {
            function: self.function.map(str::to_owned),
            linkage_name: self.linkage_name.map(|l| l.to_string()),
            file: self.file.map(str::to_owned),
            line: self.line,
            column: self.column,
        }
    }
}

/// One frame, owned.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Frame {
    /// Demangled function name (Rust legacy hashes removed).
    pub function: Option<String>,
    /// The raw (linkage) name when it differs from `function`.
    pub linkage_name: Option<String>,
    /// Source file path as the DWARF names it.
    pub file: Option<String>,
    /// Line, 0 when unknown.
    pub line: u32,
    /// Column, 0 when unknown.
    pub column: u32,
}

impl Frame {
    /// A borrowed view.
    pub fn as_ref(&self) -> FrameRef<'_> {
        FrameRef {
            function: self.function.as_deref(),
            linkage_name: self.linkage_name.as_deref().map(LinkageName::text),
            file: self.file.as_deref(),
            line: self.line,
            column: self.column,
        }
    }
}

/// A linkage (mangled) name: borrowed text, or an entry of an index's
/// front-coded name table, decoded only when displayed (lookups that do not
/// print it never pay for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkageName<'a>(Repr<'a>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repr<'a> {
    Text(&'a str),
    Coded { bucket: &'a [u8], position: usize },
}

impl<'a> LinkageName<'a> {
    /// A name given as text.
    pub fn text(name: &'a str) -> Self {
        Self(Repr::Text(name))
    }

    pub(crate) fn coded(bucket: &'a [u8], position: usize) -> Self {
        Self(Repr::Coded { bucket, position })
    }
}

impl fmt::Display for LinkageName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Repr::Text(name) => f.write_str(name),
            Repr::Coded { bucket, position } => {
                let mut name = Vec::new();
                if crate::index::blocks::decode_name(bucket, position, &mut name) {
                    f.write_str(&String::from_utf8_lossy(&name))
                } else {
                    f.write_str("<damaged name>")
                }
            }
        }
    }
}
