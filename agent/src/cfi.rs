//! Call-frame information (`.eh_frame`) of the files whose code samples
//! land in: what the agent needs to step out of the leaf function when the
//! frame-pointer chain cannot (a frameless leaf, or a function in its
//! prologue or epilogue).
//!
//! A file's `.eh_frame` is read once, on its first leaf sample, in a job
//! (`files::Binaries::load_cfi`: bounded per file and in total; nothing
//! stays mapped, so a file truncated underneath cannot fault the agent),
//! and turned into its compact unwind table ([`deltas`]): every address's
//! rule is then a binary search.

pub mod deltas;
pub mod inspect;

use std::collections::HashMap;

use crate::jobs::{Ticket, Waiting};

/// Where a section is in its file and in the ELF's address space.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionRef {
    pub offset: u64,
    pub size: u64,
    pub address: u64,
}

/// How to leave the function at one address, for the leaf frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafRule {
    /// The canonical frame address is `%rbp`-based: the function has set up
    /// its frame, and the frame-pointer chain is right from here.
    Framed,
    /// `%rsp`-based: a frameless function, or a prologue or epilogue. The
    /// return address is at `%rsp + ra`; the caller's `%rbp` is at
    /// `%rsp + rbp` when this function saved it, else `%rbp` still is it.
    Frameless { ra: i64, rbp: Option<i64> },
    /// The return address is undefined: the outermost frame (`_start`).
    Outermost,
    /// No CFI for this address, or a rule the agent does not evaluate (a
    /// DWARF expression, as in the PLT).
    Unknown,
}

/// One file's CFI: its unwind table.
pub struct FileCfi {
    table: deltas::Table,
}

impl FileCfi {
    /// The CFI of a file from its `.eh_frame`'s bytes and address (and
    /// `.text`'s address). `None` when there is none, or it is malformed
    /// or past [`deltas::Limits`] (its frames are walked by frame pointer
    /// only).
    pub fn new(eh_frame: (Vec<u8>, u64), text_address: u64) -> Option<FileCfi> {
        match deltas::build(
            &eh_frame.0,
            eh_frame.1,
            text_address,
            deltas::Limits::default(),
        ) {
            Ok(table) => Some(FileCfi { table }),
            Err(deltas::Error::Empty) => None,
            Err(e) => {
                tracing::debug!("no unwind table: {e}");
                None
            }
        }
    }

    /// Bytes held (the table).
    pub fn bytes(&self) -> usize {
        self.table.bytes()
    }

    /// The rule at ELF virtual address `address` (a leaf's exact `%rip`).
    pub fn rule(&self, address: u64) -> LeafRule {
        self.table.rule(address).leaf()
    }
}

/// What the cache holds, for `--stats`.
#[derive(Debug, Default, Clone, Copy)]
pub struct CacheStats {
    pub files: usize,
    pub bytes: usize,
    /// Times the cache was emptied to stay within its bound.
    pub resets: u64,
}

/// A file's CFI: read (`None`: it has none, or it was unreadable), or
/// being read.
enum Loaded {
    Ready(Option<Box<FileCfi>>),
    Loading(Ticket<Option<FileCfi>>),
}

/// The CFI of every file seen as a leaf, by (device, inode), within a total
/// byte budget; a file without `.eh_frame` (or unreadable) is kept as
/// `None` so it is not read again.
pub struct CfiCache {
    by_file: HashMap<(u64, u64), Loaded>,
    budget: usize,
    bytes: usize,
    resets: u64,
}

impl CfiCache {
    pub fn new(budget: usize) -> Self {
        Self {
            by_file: HashMap::new(),
            budget,
            bytes: 0,
            resets: 0,
        }
    }

    /// The rule at `address` of file `key`, loading its CFI with `load`
    /// the first time (a job, waited for within `waiting`; while it runs,
    /// `None`). `None` when the file has no usable CFI.
    pub fn rule(
        &mut self,
        key: (u64, u64),
        address: u64,
        waiting: &mut Waiting,
        load: impl FnOnce() -> Ticket<Option<FileCfi>>,
    ) -> Option<LeafRule> {
        let answer = match self.by_file.get(&key) {
            None => {
                let ticket = load();
                match waiting.wait(&ticket) {
                    Some(answer) => Some(answer.ok().flatten()),
                    None => {
                        self.by_file.insert(key, Loaded::Loading(ticket));
                        return None;
                    }
                }
            }
            Some(Loaded::Loading(ticket)) => Some(ticket.try_take()?.ok().flatten()),
            Some(Loaded::Ready(_)) => None,
        };
        if let Some(cfi) = answer {
            let cfi = cfi.filter(|c| c.bytes() <= self.budget);
            let size = cfi.as_ref().map_or(0, FileCfi::bytes);
            if self.bytes + size > self.budget {
                self.by_file.clear();
                self.bytes = 0;
                self.resets += 1;
            }
            self.bytes += size;
            self.by_file.insert(key, Loaded::Ready(cfi.map(Box::new)));
        }
        self.cached_rule(key, address)
    }

    /// The rule at `address` of file `key` if its CFI is in memory already
    /// (nothing is read).
    pub fn cached_rule(&self, key: (u64, u64), address: u64) -> Option<LeafRule> {
        let Some(Loaded::Ready(Some(cfi))) = self.by_file.get(&key) else {
            return None;
        };
        Some(cfi.rule(address))
    }

    pub fn forget_all(&mut self) {
        self.by_file.clear();
        self.bytes = 0;
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            files: self
                .by_file
                .values()
                .filter(|c| matches!(c, Loaded::Ready(Some(_))))
                .count(),
            bytes: self.bytes,
            resets: self.resets,
        }
    }
}

/// Reads `.eh_frame` of an ELF image in memory (the
/// vDSO; tests).
pub fn from_image(image: &[u8]) -> Option<FileCfi> {
    use object::{Object, ObjectSection};
    let file = object::File::parse(image).ok()?;
    let s = file.section_by_name(".eh_frame")?;
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    FileCfi::new((s.data().ok()?.to_vec(), s.address()), text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rules_of_our_own_code() {
        // This test binary: Rust keeps frame pointers here (the workspace
        // builds with them), so inside a function body the CFA is
        // %rbp-based, and at its first instruction %rsp-based.
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let cfi = from_image(&exe).expect("rustc emits .eh_frame");
        let file = object::File::parse(&*exe).unwrap();
        use object::{Object, ObjectSymbol};
        let sym = file
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains("rules_of_our_own_code")) && s.size() > 32)
            .expect("this test's symbol");
        assert_eq!(
            cfi.rule(sym.address()),
            LeafRule::Frameless { ra: 0, rbp: None },
            "at the first instruction the return address is at %rsp"
        );
        assert_eq!(cfi.rule(sym.address() + sym.size() / 2), LeafRule::Framed);
        assert_eq!(cfi.rule(1), LeafRule::Unknown, "no FDE there");
        assert!(cfi.bytes() > 0);
    }

    #[test]
    fn the_cache_stays_within_its_budget() {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let size = from_image(&exe).unwrap().bytes();
        let mut cache = CfiCache::new(size + size / 2);
        let mut w = Waiting::new(Duration::from_secs(10), 1.0, Duration::from_secs(10));
        let image = || Ticket::ready(from_image(&exe));
        assert!(cache.rule((1, 1), 1, &mut w, image).is_some());
        assert_eq!(cache.stats().files, 1);
        // A second file does not fit next to the first: the cache starts over.
        assert!(cache.rule((1, 2), 1, &mut w, image).is_some());
        let stats = cache.stats();
        assert_eq!((stats.files, stats.resets), (1, 1));
        assert!(stats.bytes <= size + size / 2);
        // A file larger than the whole budget is not kept; nor read twice.
        let mut small = CfiCache::new(16);
        assert_eq!(small.rule((1, 1), 1, &mut w, image), None);
        assert_eq!(small.rule((1, 1), 1, &mut w, || panic!("read again")), None);
        // No .eh_frame: None, remembered.
        assert_eq!(cache.rule((2, 2), 1, &mut w, || Ticket::ready(None)), None);
        assert_eq!(cache.rule((2, 2), 1, &mut w, || panic!("read again")), None);
        // Being read: None until the job answers, then the rule.
        let pool = crate::jobs::Pool::new(1);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let exe2 = exe.clone();
        let ticket = pool.submit(crate::jobs::About::default(), move || {
            rx.recv().unwrap();
            from_image(&exe2)
        });
        let mut once = Some(ticket);
        let mut no_wait = Waiting::new(Duration::ZERO, 0.0, Duration::ZERO);
        assert_eq!(
            cache.rule((3, 3), 1, &mut no_wait, || once.take().unwrap()),
            None
        );
        tx.send(()).unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let mut rule = None;
        while rule.is_none() && std::time::Instant::now() < deadline {
            rule = cache.rule((3, 3), 1, &mut no_wait, || panic!("read again"));
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(rule.is_some());
    }
}
