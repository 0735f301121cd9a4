use std::path::Path;

use super::*;
use crate::record::USER_END_ROOT;
use crate::unwind::Cut;

/// Processes whose jobs are always waited for, with work budgets no wait
/// exhausts (a busy test machine must not turn a checked return address
/// into an unchecked one).
pub(crate) fn processes() -> Processes {
    let mut procs = Processes::new(
        Path::new("/proc"),
        64 << 20,
        (1 << 20, 1 << 20),
        crate::jobs::Pool::new(1),
    );
    let forever = std::time::Duration::from_secs(60);
    procs.ctx.waiting = crate::jobs::Waiting::new(forever, 1.0, forever);
    procs.ctx.identity_waiting = crate::jobs::Waiting::new(forever, 1.0, forever);
    procs.ctx.work_budget = (1.0, forever);
    procs
}

#[test]
fn resolves_our_own_stack_to_our_build_id() {
    let mut procs = processes();
    let pid = std::process::id();
    // A real return address of ours: the one this function returns to
    // is after a call; take one from our own frame-pointer chain.
    let ret = our_return_address();
    let leaf = resolves_our_own_stack_to_our_build_id as *const () as u64 + 1;
    let mut out = Vec::new();
    let stack = UserStack {
        chain: &[leaf, ret],
        end: USER_END_ROOT,
        bp: 0,
        window: &[],
        snapshot: None,
    };
    let (info, cut) = procs.resolve(pid, "test", &stack, &mut out);
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let ours = crate::files::Binary::parse(&exe[..]).unwrap().build_id;
    assert_eq!(cut, None);
    assert_eq!(out.len(), 2, "{out:?}");
    assert_eq!(out[0].mapping.build_id, ours);
    assert!(out[0].mapping.path.ends_with(&info.executable_name));
    assert_eq!(info.pid, pid);
    assert!((out[0].mapping.start..out[0].mapping.limit).contains(&out[0].address));
    // The leaf, after `push %rbp` of a function with frame pointers, is in its
    // prologue: %rsp-based CFA, but the window is empty.
    assert_eq!(procs.ctx.unwind.out_of_window, 1);

    // The same caller recovered from the window by CFI: inserted after
    // the leaf.
    out.clear();
    let leaf_entry = leaf - 1; // first instruction: return address at %rsp
    let stack = UserStack {
        chain: &[leaf_entry],
        end: USER_END_ROOT,
        bp: 0,
        window: &ret.to_le_bytes(),
        snapshot: None,
    };
    let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
    assert_eq!((cut, out.len()), (None, 2), "{out:?}");
    assert_eq!(procs.ctx.unwind.callers_recovered, 1);

    // A return address in no mapping ends the stack, as does one that
    // is not after a call (the start of a function).
    for (bad, why) in [(8, Cut::OutsideCode), (leaf_entry + 1, Cut::NotAfterCall)] {
        out.clear();
        let stack = UserStack {
            chain: &[leaf, bad, ret, ret],
            end: USER_END_ROOT,
            bp: 0,
            window: &[],
            snapshot: None,
        };
        let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
        assert_eq!((cut, out.len()), (Some(why), 1), "{out:?}");
    }
    // A leaf in no mapping stays, as an unknown frame.
    out.clear();
    let stack = UserStack {
        chain: &[8],
        end: USER_END_ROOT,
        bp: 0,
        window: &[],
        snapshot: None,
    };
    procs.resolve(pid, "test", &stack, &mut out);
    assert_eq!(
        (out[0].mapping.path.as_str(), out[0].address),
        ("[unknown]", 8)
    );
    // A chain the BPF program stopped (frame pointer not increasing).
    out.clear();
    let stack = UserStack {
        chain: &[leaf, ret],
        end: crate::record::USER_END_NOT_INCREASING,
        bp: 0,
        window: &[],
        snapshot: None,
    };
    let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
    assert_eq!((cut, out.len()), (Some(Cut::NotIncreasing), 2));
    out.clear();
    let stack = UserStack {
        end: crate::record::USER_END_UNREADABLE,
        ..stack
    };
    let (_, cut) = procs.resolve(pid, "test", &stack, &mut out);
    assert_eq!((cut, out.len()), (Some(Cut::Unreadable), 2));
    assert_eq!(procs.ctx.unwind.cut_total(), 4);
}

/// The return address of this call: in the caller, after a call.
#[inline(never)]
fn our_return_address() -> u64 {
    let ret: u64;
    // SAFETY: reads our own frame record (frame pointers are on).
    unsafe { std::arch::asm!("mov {}, [rbp + 8]", out(reg) ret) };
    ret
}

#[test]
fn the_probe_scan_makes_no_entry_for_kernel_threads() {
    let mut procs = processes();
    // pid 2 is kthreadd: no executable, no maps.
    assert!(std::fs::read_link("/proc/2/exe").is_err());
    assert_eq!(procs.mapped_files(2), None);
    assert_eq!(procs.len(), 0);
    let ours = procs.mapped_files(std::process::id()).expect("our maps");
    assert!(ours.iter().any(|m| m.is_file()));
    assert_eq!(procs.len(), 1);
}

/// A process named provisionally (its identity read still queued when it
/// was sampled) takes its identity when the read answers, whether or not
/// it is sampled again: what a batch going out asks for first.
#[test]
fn an_identity_answered_after_the_last_sample_is_taken_without_another() {
    let mut procs = processes();
    // The identity lane's worker busy: the identity read waits in its
    // queue.
    let (release, blocked) = std::sync::mpsc::channel::<()>();
    let blocker = procs.ctx.pool.submit_in_order(
        crate::jobs::Lane::Identity,
        false,
        crate::jobs::About { pid: 0, dev: 0 },
        move || {
            let _ = blocked.recv();
        },
    );
    procs.ctx.identity_waiting = crate::jobs::Waiting::new(Duration::ZERO, 0.0, Duration::ZERO);
    let asked = Instant::now();
    let (provisional, _) = procs.resolve(std::process::id(), "test", &no_stack(), &mut Vec::new());
    assert!(procs.identity_under_way(asked));
    // A read asked for before `since` is not waited for again.
    assert!(!procs.identity_under_way(Instant::now() + Duration::from_secs(1)));
    assert!(procs.take_identified().is_empty());
    release.send(()).unwrap();
    assert!(blocker.wait(Duration::from_secs(30)).is_some());
    let deadline = Instant::now() + Duration::from_secs(30);
    let identified = loop {
        let identified = procs.take_identified();
        if !identified.is_empty() || Instant::now() > deadline {
            break identified;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(identified.len(), 1, "the identity read never answered");
    assert!(Arc::ptr_eq(&identified[0].0, &provisional));
    assert_eq!(identified[0].1.pid, std::process::id());
    assert!(!procs.identity_under_way(asked));
}

/// A child that sleeps under a service name of its own.
fn named_child(service: &str) -> std::process::Child {
    std::process::Command::new("sleep")
        .arg("30")
        .env("OTEL_SERVICE_NAME", service)
        .spawn()
        .unwrap()
}

/// Waits until `pid` has exec'd `sleep` with its environment (its `exe`
/// link is set before the new image's environment is: a read between the
/// two finds none).
fn wait_for_exec(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(std::fs::read_link(format!("/proc/{pid}/exe"))
        .is_ok_and(|p| p.to_string_lossy().ends_with("/sleep"))
        && std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|e| e.windows(17).any(|w| w == b"OTEL_SERVICE_NAME")))
    {
        assert!(Instant::now() < deadline, "{pid} never ran sleep");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn no_stack() -> UserStack<'static> {
    UserStack {
        chain: &[],
        end: USER_END_ROOT,
        bp: 0,
        window: &[],
        snapshot: None,
    }
}

/// Records of a process read after its exit record (the sampler behind
/// its ring buffer) name it as it was, not by its executable.
#[test]
fn a_record_read_after_its_process_exited_keeps_its_service() {
    let mut procs = processes();
    let mut child = named_child("gone-svc");
    let pid = child.id();
    wait_for_exec(pid);
    let (info, _) = procs.resolve(pid, "sleep", &no_stack(), &mut Vec::new());
    assert_eq!(info.service_name, "gone-svc");
    child.kill().unwrap();
    child.wait().unwrap();
    procs.exit(pid);
    let (late, _) = procs.resolve(pid, "sleep", &no_stack(), &mut Vec::new());
    assert_eq!(late.service_name, "gone-svc");
    // Without the exit record's identity: its executable's name.
    procs.forget(pid);
    procs.ctx.gone.clear();
    let (unknown, _) = procs.resolve(pid, "sleep", &no_stack(), &mut Vec::new());
    assert_eq!(unknown.service_name, "sleep");
}

/// An entry read ahead of the exec record (on a BPF walk's wakeup) is of
/// the new image: the record keeps it; an entry read in record order goes.
#[test]
fn an_exec_record_keeps_an_entry_read_ahead_of_it() {
    let mut procs = processes();
    let mut child = named_child("exec-svc");
    let pid = child.id();
    wait_for_exec(pid);
    procs.unwind_now(pid);
    assert!(procs.by_pid[&pid].read_ahead);
    procs.exec(pid);
    assert!(procs.by_pid.contains_key(&pid), "read ahead: kept");
    assert_eq!(procs.by_pid[&pid].info.service_name, "exec-svc");
    // The next exec record is of a later image.
    procs.exec(pid);
    assert!(!procs.by_pid.contains_key(&pid));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_process_unsure_of_its_context_slot_looks_again_less_often_as_it_waits() {
    let t = Instant::now();
    let ms = Duration::from_millis;
    assert_eq!(super::unsure_next(t, t), t + super::UNSURE_RECHECK);
    assert_eq!(super::unsure_next(t, t + ms(100)), t + ms(125));
    assert_eq!(
        super::unsure_next(t, t + ms(4000)),
        t + ms(4000) + super::UNSURE_RECHECK_MAX
    );
}

/// Maps `path` executable into this process; its address.
fn map_exec(path: &Path) -> u64 {
    let file = std::fs::File::open(path).unwrap();
    let len = file.metadata().unwrap().len() as usize;
    // SAFETY: a fresh private read-only mapping of a file we opened; it is
    // never unmapped (the test process ends soon) and never dereferenced.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&file),
            0,
        )
    };
    assert_ne!(at, libc::MAP_FAILED);
    at as u64
}

/// A process read before all its libraries were mapped (read at its first
/// sample, during its loading) reads its mappings again at its first miss
/// after MAPS_FIRST_MISS_INTERVAL, not MAPS_MISS_INTERVAL: until then its
/// unwind ranges lack those libraries and every walk through them is cut
/// (a CI run's cfi.rs saw 12 of 190 stacks cut so). Later misses wait
/// MAPS_MISS_INTERVAL. Time is moved by setting back when the mappings
/// were read.
#[test]
fn the_first_miss_after_the_first_read_reads_the_mappings_again_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (dir.path().join("first.so"), dir.path().join("second.so"));
    for copy in [&first, &second] {
        std::fs::copy("/lib/x86_64-linux-gnu/libc.so.6", copy).unwrap();
    }
    let mut procs = processes();
    let pid = std::process::id();
    procs.resolve(pid, "test", &no_stack(), &mut Vec::new());
    let has = |procs: &Processes, path: &Path| {
        let path = path.to_str().unwrap();
        procs.by_pid[&pid].maps.iter().any(|m| m.path == path)
    };
    let miss_after = |procs: &mut Processes, at: u64, ago: Duration| {
        let p = procs.by_pid.get_mut(&pid).unwrap();
        p.maps_read = Instant::now().checked_sub(ago).unwrap();
        let stack = UserStack {
            chain: &[at + 0x40],
            ..no_stack()
        };
        procs.resolve(pid, "test", &stack, &mut Vec::new());
    };
    let at = map_exec(&first);
    assert!(!has(&procs, &first));
    miss_after(&mut procs, at, MAPS_FIRST_MISS_INTERVAL * 2);
    assert!(
        has(&procs, &first),
        "the first miss reads the mappings again"
    );
    assert!(procs.by_pid[&pid].maps_reread);

    let at = map_exec(&second);
    miss_after(&mut procs, at, MAPS_FIRST_MISS_INTERVAL * 2);
    assert!(
        !has(&procs, &second),
        "a later miss waits MAPS_MISS_INTERVAL"
    );
    miss_after(&mut procs, at, MAPS_MISS_INTERVAL * 2);
    assert!(has(&procs, &second));
}
