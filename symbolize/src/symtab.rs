//! Function symbols from `.symtab` or `.dynsym`, sorted for binary search.

use object::{Object, ObjectSection, ObjectSymbol, SectionFlags, SymbolFlags, SymbolKind};

use crate::{Error, Inputs, Source};

/// One function symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Symbol<'data> {
    pub address: u64,
    /// Size. A symbol without one (`st_size` 0: crt's
    /// `deregister_tm_clones`, functions written in assembly) extends to
    /// the next symbol or the end of its section, as llvm-symbolizer,
    /// addr2line and perf read it ([`SymbolTable::load`] fills it in); a
    /// symbol with a size names nothing past it.
    pub size: u64,
    pub name: &'data str,
    /// The end of the symbol's section (`u64::MAX`: unknown), where a
    /// size-0 symbol's extent stops at the latest.
    pub section_end: u64,
}

/// The function symbols of the best table the inputs have.
#[derive(Debug, Default)]
pub(crate) struct SymbolTable<'data> {
    pub source: Option<Source>,
    pub symbols: Vec<Symbol<'data>>,
}

impl<'data> SymbolTable<'data> {
    /// `.symtab` of the primary file, then of the executable, then `.dynsym`
    /// of either.
    pub fn load(inputs: &Inputs<'data>) -> Result<Self, Error> {
        let primary = object::File::parse(inputs.primary)?;
        let exe = match inputs.executable {
            Some(data) => Some(object::File::parse(data)?),
            None => None,
        };
        let files: Vec<&object::File<'data>> =
            std::iter::once(&primary).chain(exe.as_ref()).collect();
        for file in &files {
            let symbols = collect(file, file.symbols());
            if !symbols.is_empty() {
                return Ok(Self::sorted(Source::Symtab, symbols));
            }
        }
        for file in &files {
            let symbols = collect(file, file.dynamic_symbols());
            if !symbols.is_empty() {
                return Ok(Self::sorted(Source::Dynsym, symbols));
            }
        }
        Ok(Self::default())
    }

    fn sorted(source: Source, mut symbols: Vec<Symbol<'data>>) -> Self {
        // At one address (aliases, C1/C2 constructors, identical code
        // folding) keep one symbol, by llvm-symbolizer's rule so answers
        // agree: the largest size, then the last in symbol-table order.
        symbols.sort_by_key(|s| (s.address, s.size));
        let mut kept: Vec<Symbol<'data>> = Vec::with_capacity(symbols.len());
        for symbol in symbols {
            match kept.last_mut() {
                Some(last) if last.address == symbol.address => *last = symbol,
                _ => kept.push(symbol),
            }
        }
        let mut symbols = kept;
        // A size-0 symbol extends to the next symbol (a distinct address,
        // after the merge above) or the end of its section.
        for i in 0..symbols.len() {
            if symbols[i].size != 0 {
                continue;
            }
            let next = symbols.get(i + 1).map_or(u64::MAX, |s| s.address);
            let end = next.min(symbols[i].section_end);
            symbols[i].size = end.saturating_sub(symbols[i].address);
        }
        Self {
            source: Some(source),
            symbols,
        }
    }

    /// The symbol whose extent holds `address`; `None` between symbols
    /// (past a sized symbol's end), never the nearest one before.
    pub fn find(&self, address: u64) -> Option<&Symbol<'data>> {
        let i = self.symbols.partition_point(|s| s.address <= address);
        let symbol = self.symbols.get(i.checked_sub(1)?)?;
        let end = symbol.address.saturating_add(symbol.size.max(1));
        (address < end).then_some(symbol)
    }
}

fn collect<'data, 'file>(
    file: &'file object::File<'data>,
    symbols: impl Iterator<Item = object::Symbol<'data, 'file>>,
) -> Vec<Symbol<'data>>
where
    'data: 'file,
{
    symbols
        .filter(|s| s.is_definition() && s.address() != 0 && is_code(file, s))
        .filter_map(|s| {
            let name = s.name().ok().filter(|n| !n.is_empty())?;
            let section_end = s
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .and_then(|sec| sec.address().checked_add(sec.size()))
                .unwrap_or(u64::MAX);
            Some(Symbol {
                address: s.address(),
                size: s.size(),
                name,
                section_end,
            })
        })
        .collect()
}

/// Functions, and untyped symbols in executable sections (functions written
/// in assembly), as llvm-symbolizer counts them.
fn is_code<'data>(file: &object::File<'data>, symbol: &object::Symbol<'data, '_>) -> bool {
    let SymbolFlags::Elf { st_info, .. } = symbol.flags() else {
        return symbol.kind() == SymbolKind::Text;
    };
    match st_info & 0xf {
        object::elf::STT_FUNC | object::elf::STT_GNU_IFUNC => true,
        object::elf::STT_NOTYPE => {
            let name = symbol.name().unwrap_or("");
            let executable = symbol
                .section_index()
                .and_then(|i| file.section_by_index(i).ok())
                .is_some_and(|section| {
                    matches!(section.flags(), SectionFlags::Elf { sh_flags }
                        if sh_flags & u64::from(object::elf::SHF_EXECINSTR) != 0)
                });
            executable && !name.starts_with('$') && !name.starts_with(".L")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_is_named_inside_a_symbols_extent_and_a_size_0_symbol_reaches_the_next() {
        let sym = |address, size, name| Symbol {
            address,
            size,
            name,
            section_end: 0x1300,
        };
        let table = SymbolTable::sorted(
            Source::Dynsym,
            vec![
                sym(0x1000, 0x20, "a"),
                sym(0x1100, 0, "label"),
                sym(0x1200, 0x10, "b"),
                sym(0x1280, 0, "last"),
                // An alias without a size at a sized symbol's address: the
                // sized one is kept.
                sym(0x1200, 0, "b_alias"),
            ],
        );
        let name = |address| table.find(address).map(|s| s.name);
        assert_eq!(name(0xfff), None);
        assert_eq!(name(0x1000), Some("a"));
        assert_eq!(name(0x101f), Some("a"));
        // A gap (a static function .dynsym leaves out): not a's.
        assert_eq!(name(0x1020), None);
        assert_eq!(name(0x1100), Some("label"));
        assert_eq!(name(0x1101), Some("label"), "a size-0 symbol runs on");
        assert_eq!(name(0x11ff), Some("label"), "up to the next symbol");
        assert_eq!(name(0x1200), Some("b"));
        assert_eq!(name(0x120f), Some("b"));
        assert_eq!(name(0x1210), None);
        assert_eq!(name(0x12ff), Some("last"), "to its section's end");
        assert_eq!(name(0x1300), None, "not past its section");
    }
}
