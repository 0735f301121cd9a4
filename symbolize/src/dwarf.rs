//! The first-request path: answers straight from DWARF through the
//! `addr2line` crate, which parses each compile unit lazily on first touch.
//! The batch is sorted and de-duplicated first (neighbouring addresses share
//! a unit and its parsed tables), and each distinct raw name is demangled
//! once.

use std::collections::HashMap;

use crate::elf::{LoadedDwarf, Reader};
use crate::symtab::SymbolTable;
use crate::{demangle, Error, Frame, Inputs, Miss, Source};

/// One address's answer: frames innermost first, or why there are none.
pub type Answer = Result<(Source, Vec<Frame>), Miss>;

/// Symbolizes batches of addresses of one build-ID from its DWARF and
/// symbol tables.
pub struct DwarfSymbolizer<'data> {
    dwarf: Option<LoadedDwarf<'data>>,
    symbols: SymbolTable<'data>,
}

impl std::fmt::Debug for DwarfSymbolizer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DwarfSymbolizer")
            .field("dwarf", &self.dwarf.is_some())
            .field("symbols", &self.symbols.symbols.len())
            .finish()
    }
}

impl<'data> DwarfSymbolizer<'data> {
    /// Opens the inputs (cheap: no compile unit is parsed yet).
    pub fn new(inputs: &Inputs<'data>) -> Result<Self, Error> {
        let dwarf = LoadedDwarf::load(inputs)?;
        let dwarf = dwarf.primary.has_debug_info().then_some(dwarf);
        let symbols = SymbolTable::load(inputs)?;
        Ok(Self { dwarf, symbols })
    }

    /// The best source these files can answer from (`None`: no DWARF and
    /// no symbol table).
    pub fn best_source(&self) -> Option<Source> {
        if self.dwarf.is_some() {
            Some(Source::Dwarf)
        } else {
            self.symbols.source
        }
    }

    /// Answers for `addresses`, in their order.
    pub fn symbolize(&self, addresses: &[u64]) -> Result<Vec<Answer>, Error> {
        if addresses.len() > crate::MAX_BATCH {
            return Err(Error::BatchTooLarge(addresses.len()));
        }
        let mut order: Vec<u64> = addresses.to_vec();
        order.sort_unstable();
        order.dedup();
        let mut answers: Vec<Answer> = Vec::with_capacity(order.len());
        let mut names = NameCache::default();
        match &self.dwarf {
            Some(dwarf) => {
                let context = addr2line::Context::from_dwarf(dwarf.dwarf())?;
                for &address in &order {
                    let frames = self.dwarf_frames(&context, address, &mut names);
                    answers.push(match frames {
                        Some(frames) => Ok((Source::Dwarf, frames)),
                        None => self.symbol_answer(address, &mut names),
                    });
                }
            }
            None => {
                for &address in &order {
                    answers.push(self.symbol_answer(address, &mut names));
                }
            }
        }
        Ok(addresses
            .iter()
            .map(|a| {
                answers[order
                    .binary_search(a)
                    .expect("every address is in the sorted set")]
                .clone()
            })
            .collect())
    }

    /// DWARF frames, with the symbol table naming functions DWARF leaves
    /// unnamed (assembly units have line rows but no subprograms). Malformed
    /// DWARF for one address is treated like no DWARF for it.
    fn dwarf_frames(
        &self,
        context: &addr2line::Context<Reader<'_>>,
        address: u64,
        names: &mut NameCache,
    ) -> Option<Vec<Frame>> {
        let mut iter = context.find_frames(address).skip_all_loads().ok()?;
        let mut frames = Vec::new();
        while let Ok(Some(frame)) = iter.next() {
            let raw = frame
                .function
                .as_ref()
                .and_then(|f| f.raw_name().ok())
                .map(|n| n.into_owned());
            let (function, linkage_name) = match raw {
                Some(raw) => names.get(&raw),
                None => (None, None),
            };
            let (file, line, column) = match frame.location {
                Some(l) => (
                    l.file.map(str::to_owned),
                    l.line.unwrap_or(0),
                    l.column.unwrap_or(0),
                ),
                None => (None, 0, 0),
            };
            frames.push(Frame {
                function,
                linkage_name,
                file,
                line,
                column,
            });
        }
        if frames.is_empty() {
            return None;
        }
        // Like llvm-symbolizer (and perf): the function that was not inlined
        // is named by the symbol table when it has a symbol here, which
        // tells `foo.cold` and `foo.isra.0` from `foo`.
        if let Some(symbol) = self.symbols.find(address) {
            let outermost = frames.last_mut().expect("not empty");
            (outermost.function, outermost.linkage_name) = names.get(symbol.name);
        }
        Some(frames)
    }

    fn symbol_answer(&self, address: u64, names: &mut NameCache) -> Answer {
        let Some(source) = self.symbols.source else {
            return Err(if self.dwarf.is_some() {
                Miss::OutsideFunctions
            } else {
                Miss::NoSymbols
            });
        };
        let symbol = self.symbols.find(address).ok_or(Miss::OutsideFunctions)?;
        let (function, linkage_name) = names.get(symbol.name);
        Ok((
            source,
            vec![Frame {
                function,
                linkage_name,
                ..Frame::default()
            }],
        ))
    }
}

/// Raw name → (display name, linkage name if different), demangled once.
#[derive(Default)]
struct NameCache {
    names: HashMap<String, (Option<String>, Option<String>)>,
}

impl NameCache {
    fn get(&mut self, raw: &str) -> (Option<String>, Option<String>) {
        if let Some(hit) = self.names.get(raw) {
            return hit.clone();
        }
        let entry = match demangle(raw) {
            Some(demangled) => (Some(demangled), Some(raw.to_owned())),
            None => (Some(raw.to_owned()), None),
        };
        self.names.insert(raw.to_owned(), entry.clone());
        entry
    }
}
