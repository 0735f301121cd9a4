//! The vDSO: the kernel's small shared library mapped into every process
//! (`clock_gettime`, `gettimeofday`, `getcpu`, `time`). No CI uploads it and
//! no file backs it, so the agent names its frames itself, from its dynamic
//! symbols, and steps out of it with its `.eh_frame`. Every 64-bit process
//! of a kernel maps the same image, so the agent reads its own, once.

use std::sync::Arc;

use crate::jit::Symbol;

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::cfi::{self, FileCfi};

/// Bytes of vDSO read at most (it is 8 KiB on x86-64 today).
const MAX_VDSO_BYTES: usize = 1 << 20;

pub struct Vdso {
    /// (start, end, name) in the image's virtual addresses, sorted.
    symbols: Vec<(u64, u64, Arc<Symbol>)>,
    /// The virtual address of the image's first byte (its mapping start).
    pub base: u64,
    image: Vec<u8>,
}

impl Vdso {
    /// This process's vDSO (`[vdso]` in `/proc/self/maps`), `None` when
    /// there is none or it cannot be parsed.
    pub fn read_own() -> Option<Vdso> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let line = maps.lines().find(|l| l.ends_with("[vdso]"))?;
        let (start, end) = line.split_whitespace().next()?.split_once('-')?;
        let (start, end) = (
            u64::from_str_radix(start, 16).ok()?,
            u64::from_str_radix(end, 16).ok()?,
        );
        let len = usize::try_from(end.checked_sub(start)?).ok()?;
        if len > MAX_VDSO_BYTES {
            return None;
        }
        // SAFETY: [start, end) is this process's vDSO mapping (readable,
        // never unmapped while the process lives).
        let image = unsafe { std::slice::from_raw_parts(start as *const u8, len) }.to_vec();
        Vdso::parse(image)
    }

    /// A vDSO image (an ELF shared object).
    pub fn parse(image: Vec<u8>) -> Option<Vdso> {
        let file = object::File::parse(&*image).ok()?;
        let base = file.segments().map(|s| s.address()).min().unwrap_or(0);
        let mut symbols: Vec<(u64, u64, Arc<Symbol>)> = file
            .dynamic_symbols()
            .filter(|s| s.kind() == object::SymbolKind::Text && s.size() > 0)
            .filter_map(|s| {
                let name = s.name().ok()?;
                Some((
                    s.address(),
                    s.address() + s.size(),
                    Arc::new(Symbol::named(name)),
                ))
            })
            .collect();
        // Aliases (`clock_gettime` and `__vdso_clock_gettime`) share an
        // address: keep the public name, the shorter one.
        symbols.sort_by_key(|s| (s.0, s.2.function.len()));
        symbols.dedup_by_key(|s| s.0);
        Some(Vdso {
            symbols,
            base,
            image,
        })
    }

    /// The function at a virtual address of the image.
    pub fn name(&self, address: u64) -> Option<Arc<Symbol>> {
        let i = self
            .symbols
            .partition_point(|s| s.0 <= address)
            .checked_sub(1)?;
        let (_, end, name) = &self.symbols[i];
        (address < *end).then(|| name.clone())
    }

    /// Its CFI, for the leaf step.
    pub fn cfi(&self) -> Option<FileCfi> {
        cfi::from_image(&self.image)
    }

    pub fn functions(&self) -> usize {
        self.symbols.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_our_own_vdso() {
        let vdso = Vdso::read_own().expect("x86-64 Linux maps a vDSO");
        assert!(
            vdso.functions() >= 3,
            "clock_gettime, gettimeofday, time, …"
        );
        let (start, _, _) = vdso
            .symbols
            .iter()
            .find(|s| s.2.function.contains("clock_gettime"))
            .expect("clock_gettime in the vDSO")
            .clone();
        assert_eq!(
            vdso.name(start).map(|s| s.function.to_string()).as_deref(),
            Some("clock_gettime")
        );
        assert_eq!(
            vdso.name(start + 1)
                .map(|s| s.function.to_string())
                .as_deref(),
            Some("clock_gettime")
        );
        assert!(vdso.name(u64::MAX).is_none());
        assert!(vdso.cfi().is_some(), "the vDSO carries .eh_frame");
        assert!(Vdso::parse(b"not an elf".to_vec()).is_none());
    }
}
