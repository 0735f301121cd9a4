//! Kernel frames named from `/proc/kallsyms` (sorted addresses, binary
//! search). The kernel shows the addresses only to readers it trusts
//! (`kptr_restrict`, CAP_SYSLOG); when they are hidden, kernel frames stay
//! unnamed and the agent says so once at start.

/// Text symbols sorted by address.
pub struct KernelSymbols {
    addrs: Vec<u64>,
    names: Vec<Box<str>>,
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
        KernelSymbols {
            addrs: symbols.iter().map(|&(a, _)| a).collect(),
            names: symbols.into_iter().map(|(_, n)| n.into()).collect(),
        }
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
        Some(&self.names[i])
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
