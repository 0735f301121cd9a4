//! Kernel frames named from `/proc/kallsyms` (sorted addresses, binary
//! search). The kernel shows the addresses only to readers it trusts
//! (`kptr_restrict`, CAP_SYSLOG); when they are hidden, kernel frames stay
//! unnamed and the agent says so once at start.

/// Text symbols sorted by address, their names in one string (a kernel
/// has ~120,000: one allocation each cost 7 MB, one string 4 MB).
pub struct KernelSymbols {
    addrs: Vec<u64>,
    /// Every name, one after the other.
    names: String,
    /// Where each name ends in `names` (it starts where the one before
    /// ends).
    ends: Vec<u32>,
}

impl KernelSymbols {
    pub fn read() -> std::io::Result<KernelSymbols> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/kallsyms")?))
    }

    pub fn parse(text: &str) -> KernelSymbols {
        let mut symbols: Vec<(u64, &str)> = text
            .lines()
            .filter_map(|line| {
                let mut f = line.split_ascii_whitespace();
                let addr = u64::from_str_radix(f.next()?, 16).ok()?;
                let kind = f.next()?;
                let name = f.next()?;
                (addr != 0 && matches!(kind, "t" | "T" | "w" | "W")).then_some((addr, name))
            })
            .collect();
        symbols.sort_unstable_by_key(|&(a, _)| a);
        let mut names = String::with_capacity(symbols.iter().map(|(_, n)| n.len()).sum());
        let mut ends = Vec::with_capacity(symbols.len());
        let mut addrs = Vec::with_capacity(symbols.len());
        for (addr, name) in symbols {
            // (Offsets in u32: past 4 GiB of names, the rest go unnamed.)
            let Ok(end) = u32::try_from(names.len() + name.len()) else {
                break;
            };
            names.push_str(name);
            ends.push(end);
            addrs.push(addr);
        }
        KernelSymbols { addrs, names, ends }
    }

    /// Whether the addresses were visible (else every lookup fails).
    pub fn is_empty(&self) -> bool {
        self.addrs.is_empty()
    }

    pub fn len(&self) -> usize {
        self.addrs.len()
    }

    /// The function holding `address`.
    pub fn name(&self, address: u64) -> Option<&str> {
        let i = self
            .addrs
            .partition_point(|&a| a <= address)
            .checked_sub(1)?;
        let start = match i {
            0 => 0,
            _ => self.ends[i - 1] as usize,
        };
        self.names.get(start..self.ends[i] as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_addresses_by_the_preceding_text_symbol() {
        let syms = KernelSymbols::parse(
            "ffffffff81000000 T _stext\n\
             ffffffff81000100 t do_one\n\
             ffffffff81000080 D some_data\n\
             ffffffffc0000000 t mod_fn\t[ext4]\n",
        );
        assert_eq!(syms.len(), 3);
        assert_eq!(syms.name(0xffffffff81000050), Some("_stext"));
        assert_eq!(syms.name(0xffffffff81000100), Some("do_one"));
        assert_eq!(syms.name(0xffffffffc0000010), Some("mod_fn"));
        assert_eq!(syms.name(0x1000), None);
        // Hidden addresses (kptr_restrict): all zero, nothing named.
        assert!(KernelSymbols::parse("0000000000000000 T _stext\n").is_empty());
    }
}
