//! Function symbols from `.symtab` or `.dynsym`, sorted for binary search.

use object::{Object, ObjectSection, ObjectSymbol, SectionFlags, SymbolFlags, SymbolKind};

use crate::{Error, Inputs, Source};

/// One function symbol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Symbol<'data> {
    pub address: u64,
    /// Size; symbols without one extend to the next symbol.
    pub size: u64,
    pub name: &'data str,
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
        let symbols = kept;
        Self {
            source: Some(source),
            symbols,
        }
    }

    /// The symbol containing `address`.
    pub fn find(&self, address: u64) -> Option<&Symbol<'data>> {
        let i = self.symbols.partition_point(|s| s.address <= address);
        let symbol = self.symbols.get(i.checked_sub(1)?)?;
        let end = match symbol.size {
            0 => self.symbols.get(i).map_or(u64::MAX, |next| next.address),
            size => symbol.address.saturating_add(size),
        };
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
            Some(Symbol {
                address: s.address(),
                size: s.size(),
                name,
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
