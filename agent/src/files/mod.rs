//! The files processes map, and what the agent knows of each: read once per
//! file (device + inode) through the sampled process's view of it —
//! `/proc/PID/map_files/…`, else `/proc/PID/root/PATH` resolved inside the
//! process's root ([`open`]) — so files inside containers work, with
//! `pread`, never a mapping, so a file truncated underneath cannot fault the
//! agent, and in a job ([`crate::jobs`]): a file that makes its parser panic
//! is skipped, and one whose filesystem does not answer (FUSE) stalls a
//! worker, never the sampler thread; its device is not read again.
//!
//! - [`elf`]: the facts of one file (build-ID, segments, CFI, trace-context
//!   slot, loader hook, memory probes);
//! - [`hash`]: its content hash;
//! - [`open`]: opening what a process names, safely.

pub mod elf;
pub mod hash;
pub mod open;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use elf::Binary;
pub use open::Skip;

use crate::cfi::tables::NoTable;
use crate::cfi::FileCfi;
use crate::jobs::{About, JobError, Lane, Pool, Ticket, Waiting};
use crate::process::maps::MapEntry;

/// A file's identity in the maps: (device, inode).
pub type FileKey = (u64, u64);

/// Files kept before the least recently used are forgotten.
const MAX_FILES: usize = 16384;
/// Every file is read again this often (an inode may be another file by
/// now: inodes are reused after deletion).
const FORGET_ALL: Duration = Duration::from_secs(3600);
/// Files held open from their read until their first sample (so that a
/// short-lived process's file can still be published), at most; the
/// oldest are closed beyond.
const MAX_HELD: usize = 128;

/// Sampled files waiting for their content hash before they are offered
/// for publishing, at most (more are offered at their next sample).
const MAX_AWAITING_HASH: usize = 1024;
/// How long an export waits for one file's content hash being computed
/// (a mapping whose hash is not there goes without it in that batch).
const EXPORT_HASH_WAIT: Duration = Duration::from_millis(20);
/// Files up to this size are hashed ahead of larger ones.
const SMALL_HASH_BYTES: u64 = 16 << 20;

/// What reading a file gives: its facts, and the file itself (to hash it,
/// and to publish it if it may be).
type Read = Result<(Binary, open::Opened), Skip>;

enum State {
    Ready(Arc<Binary>),
    Failed,
    Reading(Ticket<Read>),
}

/// Where a file's content hash is.
enum Hashing {
    /// Known, not wanted (a file without symbols: no agent publishes it,
    /// so its hash would name nothing), or given up.
    Settled,
    /// Wanted, from the first sample of its code.
    Wanted,
    /// Being computed (in the background lane).
    Computing(Ticket<Content>),
}

/// What a hash job found of a file's content.
enum Content {
    /// Its SHA-256.
    Hashed(String),
    /// Not hashed: the server holds a CI or upstream file of its ID.
    Vouched,
    /// Neither (too large, changed, gone).
    Unknown,
}

struct Entry {
    state: State,
    hashing: Hashing,
    /// The `age` pass it was last looked up in.
    used: u64,
}

/// The files read, by (device, inode); a file that could not be read is
/// kept as failed too, so it is not retried for every sample.
pub struct Binaries {
    proc_root: PathBuf,
    by_file: HashMap<FileKey, Entry>,
    pool: Pool,
    /// Devices a job hung on: their files are not read any more.
    slow_devices: HashSet<u64>,
    pass: u64,
    forgot_all: Instant,
    /// Files held open for publishing, oldest first.
    held: std::collections::VecDeque<(FileKey, open::Opened)>,
    /// Sampled files whose offer waits for their content hash (computed
    /// in the background): offered when it is there, sampled again or not.
    awaiting_hash: Vec<(u32, MapEntry)>,
    /// Files not read, by `Skip::index`.
    pub skipped: [u64; Skip::ALL.len()],
    /// Where sampled files go to be published (`--no-upload-binaries`:
    /// nowhere).
    pub offers: Option<crate::upload::Offers>,
    /// What the content hashes cost.
    pub hashed: Arc<hash::HashCounters>,
}

impl Binaries {
    pub fn new(proc_root: &Path, pool: Pool) -> Self {
        Binaries {
            proc_root: proc_root.to_owned(),
            by_file: HashMap::new(),
            pool,
            slow_devices: HashSet::new(),
            pass: 0,
            forgot_all: Instant::now(),
            held: std::collections::VecDeque::new(),
            awaiting_hash: Vec::new(),
            skipped: [0; Skip::ALL.len()],
            offers: None,
            hashed: Arc::default(),
        }
    }

    /// The facts of the file of mapping `map` of process `pid`: read now
    /// (waiting for the job within `waiting`) unless known; `None` when it
    /// cannot be read, or is still being read (asked again later), or
    /// when `allowed` is false (its process is over its budget: it is not
    /// read for it now).
    pub fn get(
        &mut self,
        pid: u32,
        map: &MapEntry,
        waiting: &mut Waiting,
        allowed: bool,
    ) -> Option<Arc<Binary>> {
        if !map.is_file() {
            return None;
        }
        let key = (map.dev, map.inode);
        if let Some(entry) = self.by_file.get_mut(&key) {
            entry.used = self.pass;
            if let Some(b) = with_hash(entry) {
                return Some(b.clone());
            }
            let answer = match &entry.state {
                State::Reading(ticket) => ticket.try_take()?,
                _ => return None, // failed
            };
            let (state, hashing) = self.settle(answer, map);
            let found = match &state {
                State::Ready(b) => Some(b.clone()),
                _ => None,
            };
            if let Some(entry) = self.by_file.get_mut(&key) {
                entry.state = state;
                entry.hashing = hashing;
            }
            return found;
        }
        if self.slow_devices.contains(&map.dev) {
            self.fail(key, Skip::Hung);
            return None;
        }
        if !allowed {
            self.skipped[Skip::OverBudget.index()] += 1;
            return None;
        }
        let (root, m) = (self.proc_root.clone(), map.clone());
        let ticket = self
            .pool
            .submit(About { pid, dev: map.dev }, move || read(&root, pid, &m));
        let (state, hashing) = match waiting.wait(&ticket) {
            Some(answer) => self.settle(answer, map),
            None => (State::Reading(ticket), Hashing::Settled),
        };
        let found = match &state {
            State::Ready(b) => Some(b.clone()),
            _ => None,
        };
        self.by_file.insert(
            key,
            Entry {
                state,
                hashing,
                used: self.pass,
            },
        );
        found
    }

    /// The content hash of file `key` (device, inode) if it is known by
    /// now, waited for within `waiting` if it is being computed, at most
    /// [`EXPORT_HASH_WAIT`] (the sampler thread waits at an export, and
    /// link-map changes wait with it).
    pub fn content_of(&mut self, key: (u64, u64), waiting: &mut Waiting) -> Option<String> {
        let entry = self.by_file.get_mut(&key)?;
        if let Hashing::Computing(ticket) = &entry.hashing {
            if let Some(answer) = waiting.wait_at_most(ticket, EXPORT_HASH_WAIT) {
                apply_hash(entry, answer);
            }
        }
        with_hash(entry)?.content_sha256.clone()
    }

    /// Whether the content hash of file `key` is being computed (its
    /// mappings are better held than sent without it).
    pub fn hash_under_way(&self, key: (u64, u64)) -> bool {
        self.by_file
            .get(&key)
            .is_some_and(|e| matches!(&e.hashing, Hashing::Computing(t) if !t.is_done()))
    }

    /// Whether the content hash of the file of `map` is wanted and not
    /// known yet (a mapping made now would go without it).
    pub fn hash_pending(&self, map: &MapEntry) -> bool {
        self.by_file
            .get(&(map.dev, map.inode))
            .is_some_and(|e| !matches!(e.hashing, Hashing::Settled))
    }

    /// Starts computing the content hash of the file of `map`, sampled in
    /// process `pid`, if it is wanted and not under way (never waiting for
    /// it). Files are hashed when their code is first
    /// sampled, not when read: of all the files the running processes map,
    /// only those are hashed, and in the order they are met.
    pub fn start_hash(&mut self, pid: u32, map: &MapEntry) {
        let key = (map.dev, map.inode);
        let Some(entry) = self.by_file.get(&key) else {
            return;
        };
        let (Hashing::Wanted, State::Ready(binary)) = (&entry.hashing, &entry.state) else {
            return;
        };
        let size = binary.size;
        // A large file is asked about first (in the job, never here):
        // whether the server holds CI's file of its ID, which names its
        // frames without a hash. A small one is hashed at once: its hash
        // costs less than the wait, during which its mappings are sent
        // without a hash (the export waits for one only briefly).
        let small = size <= SMALL_HASH_BYTES;
        let probe = if small {
            None
        } else {
            self.offers.as_ref().and_then(|o| o.probe())
        };
        let id = binary.build_id.clone().map(|id| (id, false));
        let id = id.or_else(|| binary.htlhash.clone().map(|h| (h, true)));
        let symbols = binary.symbols;
        // The file held open for publishing if it is (the process may be
        // gone), else opened anew through the process.
        let held = self
            .held
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, o)| o.file.try_clone().ok());
        let (root, m) = (self.proc_root.clone(), map.clone());
        let counters = self.hashed.clone();
        // A small file's hash goes ahead of the large ones queued (a
        // library's hash never waits for a 300 MB binary's).
        let about = About { pid, dev: map.dev };
        let ticket = self
            .pool
            .submit_in_order(Lane::Background, small, about, move || {
                if let (Some(probe), Some((id, htlhash))) = (probe, &id) {
                    if probe.vouched(id, *htlhash, symbols) {
                        counters.count_vouched(size);
                        tracing::debug!(path = %m.path, id, "not hashed: CI's file of its ID is stored");
                        return Content::Vouched;
                    }
                }
                let file = match held {
                    Some(file) => file,
                    None => {
                        let Ok(opened) = open::open_mapped(&root, pid, &m) else {
                            return Content::Unknown;
                        };
                        if opened.size != size {
                            return Content::Unknown; // another file by now
                        }
                        opened.file
                    }
                };
                let started = Instant::now();
                let sha = counters.content_sha256(&file, size);
                tracing::debug!(
                    path = %m.path,
                    bytes = size,
                    elapsed_us = started.elapsed().as_micros() as u64,
                    computed = sha.is_some(),
                    "content hash"
                );
                sha.map_or(Content::Unknown, Content::Hashed)
            });
        // Not waited for: the sampler thread goes on (a link-map change, a
        // new process's first samples must not wait behind a 100 MB hash);
        // the hash is taken when it is there, at the latest when the batch
        // is exported (`content_hash`).
        if let Some(entry) = self.by_file.get_mut(&key) {
            entry.hashing = Hashing::Computing(ticket);
        }
    }

    /// Waits until every file being read is read (or given up), at most
    /// until `deadline`: what the agent does once at start, before it
    /// samples, so the processes running then are known from their first
    /// sample.
    pub fn wait_reading(&self, deadline: Instant) {
        for entry in self.by_file.values() {
            if let State::Reading(ticket) = &entry.state {
                ticket.wait_ready(deadline);
            }
        }
    }

    /// Whether the file of `map` was read or given up (not unknown, not
    /// being read).
    pub fn settled(&self, map: &MapEntry) -> bool {
        self.by_file
            .get(&(map.dev, map.inode))
            .is_some_and(|e| !matches!(e.state, State::Reading(_)))
    }

    /// The cache's state for a finished read, and whether its content
    /// hash is wanted (its file held open for publishing if it may be
    /// published).
    fn settle(&mut self, answer: Result<Read, JobError>, map: &MapEntry) -> (State, Hashing) {
        let why = match answer {
            Ok(Ok((binary, opened))) => {
                // Hashed when an agent may publish it (it has symbols): the
                // hash of a file none would publish names nothing.
                let publishable = binary.symbols != symtrace_elf::Quality::None;
                let hashing = if publishable {
                    Hashing::Wanted
                } else {
                    Hashing::Settled
                };
                if self.offers.is_some() && publishable {
                    if self.held.len() >= MAX_HELD {
                        self.held.pop_front();
                    }
                    self.held.push_back(((map.dev, map.inode), opened));
                }
                return (State::Ready(Arc::new(binary)), hashing);
            }
            Ok(Err(why)) => why,
            Err(JobError::Panicked(_)) => Skip::Panicked,
            Err(JobError::Hung) => {
                self.slow_devices.insert(map.dev);
                Skip::Hung
            }
            Err(JobError::Refused) => Skip::OverBudget,
        };
        tracing::debug!(path = %map.path, ?why, "mapped file not read");
        self.skipped[why.index()] += 1;
        (State::Failed, Hashing::Settled)
    }

    fn fail(&mut self, key: FileKey, why: Skip) {
        self.skipped[why.index()] += 1;
        self.by_file.insert(
            key,
            Entry {
                state: State::Failed,
                hashing: Hashing::Settled,
                used: self.pass,
            },
        );
    }

    /// A job about device `dev` hung: its files are not read any more.
    pub fn device_hung(&mut self, dev: u64) {
        if dev != 0 && self.slow_devices.insert(dev) {
            tracing::warn!(
                dev = format!("{}:{}", dev >> 32, dev & 0xffff_ffff),
                "a file of this device did not answer: its files are not read any more"
            );
        }
    }

    /// Files known (read, failed or being read).
    pub fn len(&self) -> usize {
        self.by_file.len()
    }

    /// Offers the file of `map`, whose code process `pid` was sampled in,
    /// for publishing — once per file (see `upload::Offers::wants`). Opened
    /// in a job, which hands it to the uploader's queue; nothing waits.
    pub fn offer_sampled(&mut self, pid: u32, map: &MapEntry) {
        let Some(offers) = &self.offers else { return };
        let Some(Entry {
            state: State::Ready(binary),
            ..
        }) = self.by_file.get(&(map.dev, map.inode))
        else {
            return;
        };
        let Some(id) = binary.build_id.clone().or_else(|| binary.htlhash.clone()) else {
            return;
        };
        if binary.vouched {
            return; // CI's file of its ID names its frames
        }
        if self.hash_pending(map) {
            // Offered once its hash is known (`offer_hashed`).
            let key = (map.dev, map.inode);
            if self.awaiting_hash.len() < MAX_AWAITING_HASH
                && !self
                    .awaiting_hash
                    .iter()
                    .any(|(_, m)| (m.dev, m.inode) == key)
            {
                self.awaiting_hash.push((pid, map.clone()));
            }
            return;
        }
        if !offers.wants(map, binary) {
            return;
        }
        let key = (map.dev, map.inode);
        let offer = |file, map| crate::upload::Offer {
            file,
            map,
            id: id.clone(),
            htlhash: binary.build_id.is_none(),
            symbols: binary.symbols,
            content_sha256: binary.content_sha256.clone(),
            uid: binary.uid,
            attempts: 0,
        };
        // Held open since it was read: offered as it is, no open needed.
        if let Some(at) = self.held.iter().position(|(k, _)| *k == key) {
            let (_, file) = self.held.remove(at).expect("found");
            offers.offer(offer(file, map.clone()));
            return;
        }
        let (offers, root, map) = (offers.clone(), self.proc_root.clone(), map.clone());
        let binary = binary.clone();
        // Not waited for: the answer is the offer itself.
        let _ = self.pool.submit(About { pid, dev: map.dev }, move || {
            match open::open_mapped(&root, pid, &map) {
                Ok(file) if file.size == binary.size => offers.offer(crate::upload::Offer {
                    file,
                    map,
                    id,
                    htlhash: binary.build_id.is_none(),
                    symbols: binary.symbols,
                    content_sha256: binary.content_sha256.clone(),
                    uid: binary.uid,
                    attempts: 0,
                }),
                // Gone, or another file by now: the next process
                // sampled in it offers it again.
                _ => offers.not_offered(&map),
            }
        });
    }

    /// Offers the sampled files whose content hash came since they were
    /// sampled (nothing waits: a hash still computing is looked at again
    /// at the next call).
    pub fn offer_hashed(&mut self) {
        if self.awaiting_hash.is_empty() {
            return;
        }
        let awaiting = std::mem::take(&mut self.awaiting_hash);
        for (pid, map) in awaiting {
            let key = (map.dev, map.inode);
            let Some(entry) = self.by_file.get_mut(&key) else {
                continue; // forgotten: sampled again, it is offered again
            };
            let _ = with_hash(entry);
            if matches!(entry.hashing, Hashing::Settled) {
                self.offer_sampled(pid, &map);
            } else {
                self.awaiting_hash.push((pid, map));
            }
        }
    }

    /// Runs at every flush: past [`MAX_FILES`], the files not looked up
    /// since the pass before go; every [`FORGET_ALL`], all do.
    pub fn age(&mut self) {
        self.pass += 1;
        if self.forgot_all.elapsed() >= FORGET_ALL {
            self.forgot_all = Instant::now();
            self.by_file.clear();
            self.held.clear();
            return;
        }
        if self.by_file.len() > MAX_FILES {
            let recent = self.pass.saturating_sub(2);
            self.by_file.retain(|_, e| e.used >= recent);
        }
    }

    /// The call-frame information of the file of `map` (its sections read
    /// in a job within `waiting`); `None` while it is read (the ticket is
    /// returned to be asked again) or when there is none.
    pub fn load_cfi(
        &self,
        pid: u32,
        map: &MapEntry,
        binary: &Arc<Binary>,
    ) -> Ticket<Option<FileCfi>> {
        let (root, map, binary) = (self.proc_root.clone(), map.clone(), binary.clone());
        self.pool.submit(About { pid, dev: map.dev }, move || {
            read_cfi(&root, pid, &map, &binary)
        })
    }
}

impl Binaries {
    /// Builds the unwind table of `map`'s file (a job: the file's
    /// `.eh_frame` and `.debug_frame` read within the same bounds as the
    /// leaf step's).
    pub fn build_unwind_table(
        &self,
        pid: u32,
        map: &MapEntry,
        binary: &Arc<Binary>,
    ) -> Ticket<Result<crate::cfi::tables::Built, NoTable>> {
        let (root, map, binary) = (self.proc_root.clone(), map.clone(), binary.clone());
        self.pool.submit(About { pid, dev: map.dev }, move || {
            let started = crate::jobs::thread_cpu();
            let sections = read_frames(&root, pid, &map, &binary)?;
            let parts: Vec<_> = sections
                .iter()
                .map(|(kind, bytes, address)| crate::cfi::deltas::Part {
                    kind: *kind,
                    bytes,
                    address: *address,
                })
                .collect();
            let table = crate::cfi::deltas::build_parts(
                &parts,
                binary.text_address,
                crate::cfi::deltas::Limits::default(),
            )
            .map_err(|e| {
                tracing::debug!(pid, path = %map.path, "no unwind table: {e}");
                no_table(&e)
            })?;
            let framed = table.framed();
            let cpu = crate::jobs::thread_cpu().saturating_sub(started);
            Ok(crate::cfi::tables::Built { table, framed, cpu })
        })
    }
}

/// Why a table could not be built from these sections.
fn no_table(e: &crate::cfi::deltas::Error) -> NoTable {
    use crate::cfi::deltas::Error;
    match e {
        Error::Empty => NoTable::NoCfi,
        Error::TooLarge { .. } | Error::TooWide { .. } => NoTable::TooLarge,
    }
}

/// A file's `.eh_frame` and uncompressed `.debug_frame` (kind, bytes,
/// address), together within `MAX_CFI_FILE_BYTES`.
fn read_frames(
    root: &Path,
    pid: u32,
    map: &MapEntry,
    binary: &Binary,
) -> Result<Vec<(crate::cfi::deltas::Kind, Vec<u8>, u64)>, NoTable> {
    use crate::cfi::deltas::Kind;
    use std::os::unix::fs::FileExt;
    let wanted: Vec<_> = [
        (Kind::EhFrame, binary.eh_frame),
        (Kind::DebugFrame, binary.debug_frame),
    ]
    .into_iter()
    .filter_map(|(kind, s)| Some((kind, s?)))
    .collect();
    // Sizes from section headers: a hostile file's may say anything (their
    // sum may even wrap).
    let total = wanted
        .iter()
        .try_fold(0u64, |sum, (_, s)| sum.checked_add(s.size))
        .ok_or(NoTable::TooLarge)?;
    if wanted.is_empty() {
        return Err(NoTable::NoCfi);
    }
    if total > MAX_CFI_FILE_BYTES || total > binary.size {
        return Err(NoTable::TooLarge);
    }
    let opened = open::open_mapped(root, pid, map).map_err(|_| NoTable::Unreadable)?;
    let mut read = Vec::with_capacity(wanted.len());
    for (kind, s) in wanted {
        let mut bytes = vec![0; usize::try_from(s.size).map_err(|_| NoTable::TooLarge)?];
        opened
            .file
            .read_exact_at(&mut bytes, s.offset)
            .map_err(|_| NoTable::Unreadable)?;
        read.push((kind, bytes, s.address));
    }
    opened
        .unchanged()
        .then_some(read)
        .ok_or(NoTable::Unreadable)
}

/// The facts of a read file, with its content hash once computed.
fn with_hash(entry: &mut Entry) -> Option<&Arc<Binary>> {
    let done = match &entry.hashing {
        Hashing::Computing(ticket) => ticket.try_take(),
        _ => None,
    };
    if let Some(hash) = done {
        apply_hash(entry, hash);
    }
    match &entry.state {
        State::Ready(b) => Some(b),
        _ => None,
    }
}

/// A hash job's answer: the hash goes with the file's facts (none if it
/// could not be computed: the file's mappings go without).
fn apply_hash(entry: &mut Entry, hash: Result<Content, JobError>) {
    entry.hashing = Hashing::Settled;
    let State::Ready(b) = &mut entry.state else {
        return;
    };
    let (content_sha256, vouched) = match hash {
        Ok(Content::Hashed(sha)) => (Some(sha), false),
        Ok(Content::Vouched) => (None, true),
        Ok(Content::Unknown) | Err(_) => return,
    };
    let mut with = Binary::clone(b);
    with.content_sha256 = content_sha256;
    with.vouched = vouched;
    *b = Arc::new(with);
}

/// Reads the facts of a file the operator named by its path (not a
/// process's mapping), opened by the caller, within the same bounds as a
/// mapped one; the file comes back too.
pub fn read_named(file: std::fs::File) -> Result<(Binary, std::fs::File), Skip> {
    let meta = file.metadata().map_err(|_| Skip::Unreachable)?;
    if !meta.is_file() {
        return Err(Skip::NotRegular);
    }
    let mut binary = parse_bounded(&file)?;
    binary.size = meta.len();
    binary.uid = std::os::unix::fs::MetadataExt::uid(&meta);
    Ok((binary, file))
}

/// A file's key as `/proc/PID/maps` spells it: (device as `major << 32 |
/// minor`, inode).
pub fn file_key(meta: &std::fs::Metadata) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    let dev = meta.dev();
    let (major, minor) = (libc::major(dev) as u64, libc::minor(dev) as u64);
    ((major << 32) | minor, meta.ino())
}

/// The facts of an opened ELF file, parsed through a read cache within
/// [`elf::MAX_PARSE_BYTES`] (its size and owner left for the caller).
fn parse_bounded(file: &std::fs::File) -> Result<Binary, Skip> {
    let cache = object::ReadCache::new(file);
    let budget = elf::ReadBudget::new(elf::MAX_PARSE_BYTES);
    Binary::parse(elf::Bounded::new(&cache, &budget)).map_err(|_| Skip::Unparsable)
}

/// Reads the facts of a mapped file (in a job); the file comes back too.
fn read(proc_root: &Path, pid: u32, map: &MapEntry) -> Read {
    let opened = open::open_mapped(proc_root, pid, map)?;
    let mut binary = parse_bounded(&opened.file)?;
    binary.size = opened.size;
    binary.uid = opened.uid;
    if binary.build_id.is_none() {
        binary.htlhash = Some(symtrace_elf::htlhash(&mut &opened.file).map_err(|_| Skip::Changed)?);
    }
    if !opened.unchanged() {
        return Err(Skip::Changed);
    }
    Ok((binary, opened))
}

/// Bytes of CFI (`.eh_frame` + `.eh_frame_hdr`, or + `.debug_frame`)
/// read from one file at most.
const MAX_CFI_FILE_BYTES: u64 = 64 << 20;

/// Reads a file's CFI sections through the process's view of it (in a
/// job), and indexes them.
fn read_cfi(root: &Path, pid: u32, map: &MapEntry, binary: &Binary) -> Option<FileCfi> {
    use std::os::unix::fs::FileExt;
    let eh_frame = binary.eh_frame?;
    let hdr = binary.eh_frame_hdr;
    // Sizes from section headers nothing else reads: a hostile file's can
    // say anything (their sum may even wrap).
    let total = eh_frame.size.checked_add(hdr.map_or(0, |h| h.size))?;
    if total > MAX_CFI_FILE_BYTES || total > binary.size {
        tracing::debug!(pid, path = %map.path, total, "CFI too large: not read");
        return None;
    }
    let opened = open::open_mapped(root, pid, map).ok()?;
    let read = |s: crate::cfi::SectionRef| {
        let mut bytes = vec![0; usize::try_from(s.size).ok()?];
        opened.file.read_exact_at(&mut bytes, s.offset).ok()?;
        Some((bytes, s.address))
    };
    let (eh_frame, hdr) = (read(eh_frame)?, hdr.and_then(read));
    if !opened.unchanged() {
        return None;
    }
    FileCfi::new(eh_frame, hdr, binary.text_address)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cfi::SectionRef;

    /// Our own executable's facts and its first mapping.
    fn ours() -> (Binary, MapEntry) {
        let exe = std::fs::read("/proc/self/exe").unwrap();
        let mut binary = Binary::parse(&exe[..]).unwrap();
        binary.size = exe.len() as u64;
        let maps = crate::process::maps::read(Path::new("/proc"), std::process::id()).unwrap();
        let map = maps.into_iter().find(|m| m.is_file()).unwrap();
        (binary, map)
    }

    #[test]
    fn section_sizes_a_file_states_are_bounded_before_anything_is_read() {
        let (mut binary, map) = ours();
        let pid = std::process::id();
        let root = Path::new("/proc");
        let huge = |size| SectionRef {
            offset: 0,
            size,
            address: 0,
        };
        // Sizes whose sum wraps, one beyond the bound, one beyond the file:
        // refused as too large, nothing allocated for them.
        for (eh, debug) in [
            (Some(huge(0x40)), Some(huge(u64::MAX - 0x10))),
            (None, Some(huge(MAX_CFI_FILE_BYTES + 1))),
            (Some(huge(binary.size + 1)), None),
        ] {
            (binary.eh_frame, binary.debug_frame) = (eh, debug);
            let read = read_frames(root, pid, &map, &binary);
            assert_eq!(read.err(), Some(NoTable::TooLarge), "{eh:?} {debug:?}");
        }
        (binary.eh_frame, binary.debug_frame) = (None, None);
        assert_eq!(
            read_frames(root, pid, &map, &binary).err(),
            Some(NoTable::NoCfi)
        );
        // A mapping of another file than the facts say: unreadable.
        (binary.eh_frame, binary.debug_frame) = (Some(huge(64)), None);
        let gone = MapEntry {
            inode: map.inode.wrapping_add(1),
            ..map.clone()
        };
        assert_eq!(
            read_frames(root, pid, &gone, &binary).err(),
            Some(NoTable::Unreadable)
        );
    }
}
