//! Tests of `attached` (which files' probes are attached, when).

use super::*;
use crate::record::{USDT_PROBE_ALLOC, USDT_PROBE_FREE};
use crate::usdt::build_preload;

/// Attaches nothing: records what it was asked.
#[derive(Default)]
struct Recorded {
    /// (inode, offset, slot, probe)
    attached: Vec<(u64, u64, u32, u32)>,
    detached: Vec<u32>,
    /// Detached, and gone by the next look.
    gone: Vec<u32>,
    finished: bool,
}

impl Attach for Recorded {
    type Link = u32;

    fn attach(
        &mut self,
        path: &Path,
        offset: u64,
        slot: u32,
        spec: &UsdtSpec,
    ) -> anyhow::Result<u32> {
        // The path is a descriptor of the mapped file.
        assert!(path.starts_with("/proc/self/fd/"), "{}", path.display());
        let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
        self.attached.push((inode, offset, slot, spec.probe));
        Ok(slot)
    }

    fn detach(&mut self, link: u32, slot: u32) {
        assert_eq!(link, slot);
        self.detached.push(slot);
        self.gone.push(slot);
    }

    fn reaped(&mut self) -> Vec<u32> {
        std::mem::take(&mut self.gone)
    }

    fn finish(&mut self) {
        self.finished = true;
    }
}

#[test]
fn probes_are_attached_once_per_file_and_kept_until_the_file_is_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_preload(dir.path());
    let mut sleeper = std::process::Command::new("sleep")
        .arg("30")
        .env("LD_PRELOAD", &lib)
        .spawn()
        .unwrap();
    // The dynamic loader maps the library before `sleep` runs.
    let maps = format!("/proc/{}/maps", sleeper.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(&maps)
        .unwrap_or_default()
        .contains("libsymtrace_alloc_preload")
    {
        assert!(Instant::now() < deadline, "the library never mapped");
        std::thread::sleep(Duration::from_millis(10));
    }
    // Every job waited for: a busy machine must not leave the library
    // unread at the scan.
    let mut procs = crate::process::tests::processes();
    let mut probes: MemoryProbes<u32> = MemoryProbes::new(Path::new("/proc"), Vec::new());
    let mut kernel = Recorded::default();
    probes.scan(true, &mut procs, &mut kernel);
    // (Other processes of the machine may map probed files too: only
    // the library's sites are checked.)
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&lib).unwrap());
    let ours: Vec<(u64, u64, u32, u32)> = kernel
        .attached
        .iter()
        .filter(|a| a.0 == inode)
        .copied()
        .collect();
    let kinds: Vec<u32> = ours.iter().map(|a| a.3).collect();
    assert!(
        kinds.contains(&USDT_PROBE_ALLOC) && kinds.contains(&USDT_PROBE_FREE),
        "{kinds:?}"
    );
    let slots: HashSet<u32> = kernel.attached.iter().map(|a| a.2).collect();
    assert_eq!(slots.len(), kernel.attached.len(), "a cookie per site");
    let ours: Vec<u32> = ours.iter().map(|a| a.2).collect();
    assert!(probes.stats().files >= 1);
    // Looked at again (an exec, a scan): nothing attached twice.
    let n = kernel.attached.len();
    probes.exec(sleeper.id());
    probes.tick(Instant::now(), &mut procs, &mut kernel);
    probes.scan(true, &mut procs, &mut kernel);
    assert_eq!(kernel.attached.len(), n);
    // No process maps it any more: kept attached (for the next process
    // that maps it), idle.
    sleeper.kill().unwrap();
    sleeper.wait().unwrap();
    probes.scan(true, &mut procs, &mut kernel);
    assert!(
        ours.iter().all(|s| !kernel.detached.contains(s)),
        "an unmapped file stays attached"
    );
    assert!(probes.stats().idle >= 1);
    // Deleted: detached at the next full scan (not at another scan),
    // its slots free again.
    std::fs::remove_file(&lib).unwrap();
    probes.scan(false, &mut procs, &mut kernel);
    assert!(
        ours.iter().all(|s| !kernel.detached.contains(s)),
        "only a full scan detaches"
    );
    probes.scan(true, &mut procs, &mut kernel);
    assert!(
        ours.iter().all(|s| kernel.detached.contains(s)),
        "{ours:?} detached: {:?}",
        kernel.detached
    );
    // Not free while their links may still be there; free once gone.
    assert!(ours.iter().all(|s| !probes.free_slots.contains(s)));
    probes.scan(false, &mut procs, &mut kernel);
    assert!(ours.iter().all(|s| probes.free_slots.contains(s)));
    assert!(probes.detaching.is_empty());
    // At shutdown every probe goes at once, and is waited for.
    probes.detach_all(&mut kernel);
    assert!(kernel.finished);
    assert_eq!(probes.stats().sites, 0);
    assert_eq!(probes.free_slots.len(), USDT_SPECS);
    assert!(probes.by_owner.values().all(|&n| n == 0));
}

/// The inode's sites among those recorded.
fn sites_of(kernel: &Recorded, path: &Path) -> Vec<u32> {
    let inode = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(path).unwrap());
    kernel
        .attached
        .iter()
        .filter(|a| a.0 == inode)
        .map(|a| a.2)
        .collect()
}

#[test]
fn named_files_are_attached_before_any_process_maps_them_and_follow_their_path() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_preload(dir.path());
    // No process looked at (an empty process root): only the named files.
    let empty = tempfile::tempdir().unwrap();
    let no_processes = empty.path().to_owned();
    let mut procs = crate::process::tests::processes();
    // A directory named: its probe files are attached, no process needed.
    let mut probes: MemoryProbes<u32> = MemoryProbes::new(
        &no_processes,
        vec![dir.path().to_owned(), dir.path().join("missing.so")],
    );
    let mut kernel = Recorded::default();
    probes.attach_named(&mut kernel);
    let first = sites_of(&kernel, &lib);
    assert!(first.len() >= 2, "{:?}", kernel.attached);
    assert_eq!(probes.stats().files, 1);
    probes.attach_named(&mut kernel);
    assert_eq!(sites_of(&kernel, &lib), first, "attached once");

    // Mapped by none: a named file is never given up for another.
    probes.scan(true, &mut procs, &mut kernel);
    assert!(probes.stats().idle >= 1);
    probes.give_up_idle(None, usize::MAX, &mut kernel);
    assert!(first.iter().all(|s| !kernel.detached.contains(s)));

    // A new version installed under the same path (a rename over it):
    // attached at the next full scan, the old one detached.
    let new = dir.path().join("new.tmp");
    std::fs::copy(&lib, &new).unwrap();
    std::fs::rename(&new, &lib).unwrap();
    probes.scan(true, &mut procs, &mut kernel);
    let second = sites_of(&kernel, &lib);
    assert!(second.len() >= 2 && second.iter().all(|s| !first.contains(s)));
    assert!(
        first.iter().all(|s| kernel.detached.contains(s)),
        "{:?}",
        kernel.detached
    );
    assert_eq!(probes.stats().files, 1);
}

#[test]
fn an_idle_file_gives_its_slots_to_a_mapped_one() {
    let dir = tempfile::tempdir().unwrap();
    let lib = build_preload(dir.path());
    let copy = dir.path().join("copy.so");
    std::fs::copy(&lib, &copy).unwrap();
    let mut procs = crate::process::tests::processes();
    // No process looked at (an empty process root): other processes of
    // the machine that map probe files must not take the slots.
    let no_processes = dir.path().join("proc");
    std::fs::create_dir(&no_processes).unwrap();
    let mut probes: MemoryProbes<u32> = MemoryProbes::new(&no_processes, Vec::new());
    let mut kernel = Recorded::default();
    let attach = |probes: &mut MemoryProbes<u32>, kernel: &mut Recorded, path: &Path| {
        let (binary, file) = crate::files::read_named(std::fs::File::open(path).unwrap()).unwrap();
        let key = crate::files::file_key(&file.metadata().unwrap());
        let probes_of = binary.memory_probes.clone();
        probes.attach_file(key, "t", 1000, file, &probes_of, false, kernel)
    };
    assert!(attach(&mut probes, &mut kernel, &lib));
    let first = sites_of(&kernel, &lib);
    // Slots run out; the first file is idle (no process maps it).
    probes.scan(true, &mut procs, &mut kernel);
    let spare: Vec<u32> = probes.free_slots.drain(..).collect();
    assert!(!attach(&mut probes, &mut kernel, &copy), "no slot yet");
    assert!(
        first.iter().all(|s| kernel.detached.contains(s)),
        "the idle file gave its slots up"
    );
    assert!(!probes
        .without
        .contains(&crate::files::file_key(&std::fs::metadata(&copy).unwrap())));
    // Once reaped, the next look attaches the mapped one.
    probes.scan(false, &mut procs, &mut kernel);
    assert!(attach(&mut probes, &mut kernel, &copy));
    probes.free_slots.extend(spare);
}
