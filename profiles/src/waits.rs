//! What an off-CPU stack waited on, from its kernel frames: a lock, a
//! sleep, I/O, a poll, a pipe, a socket — read from the first kernel
//! function below the scheduler that names one.

/// A kind of wait and the kernel functions (by name prefix) that say so.
const KINDS: &[(&str, &[&str])] = &[
    ("lock (futex)", &["futex_", "__futex_", "do_futex"]),
    (
        "sleep",
        &[
            "do_nanosleep",
            "hrtimer_nanosleep",
            "common_nsleep",
            "__x64_sys_nanosleep",
            "__x64_sys_clock_nanosleep",
        ],
    ),
    (
        "poll / epoll",
        &[
            "ep_poll",
            "do_epoll_wait",
            "do_poll",
            "do_select",
            "do_sys_poll",
            "poll_schedule_timeout",
            "core_sys_select",
        ],
    ),
    (
        "pipe",
        &["pipe_read", "anon_pipe_read", "pipe_write", "pipe_wait"],
    ),
    (
        "socket",
        &[
            "sk_wait_data",
            "tcp_recvmsg",
            "tcp_sendmsg",
            "sk_stream_wait",
            "unix_stream_read",
            "unix_stream_data_wait",
            "inet_csk_accept",
            "unix_dgram_recvmsg",
            "__skb_wait_for_more_packets",
        ],
    ),
    (
        "disk I/O",
        &[
            "io_schedule",
            "folio_wait",
            "__folio_lock",
            "wait_on_page",
            "__lock_page",
            "blk_",
            "ext4_",
            "xfs_",
            "jbd2_",
            "filemap_",
            "iomap_",
            "io_uring",
        ],
    ),
    ("child process", &["do_wait", "kernel_wait4"]),
    (
        "signal",
        &["do_sigtimedwait", "__x64_sys_pause", "sigsuspend"],
    ),
    (
        "lock (kernel)",
        &["mutex_lock", "__mutex_lock", "rwsem_", "down_"],
    ),
];

/// The scheduler's own functions, above which the wait's cause is.
fn is_scheduler(name: &str) -> bool {
    name.starts_with("schedule")
        || name.starts_with("__schedule")
        || name.starts_with("preempt_schedule")
        || name == "finish_task_switch"
        || name.starts_with("finish_task_switch.")
}

/// What a stack (kernel function names, leaf first) waited on: the first
/// function that names a kind of wait; else the first function below the
/// scheduler, as named; None without kernel frames.
pub fn classify<'a>(kernel_leaf_first: impl IntoIterator<Item = &'a str>) -> Option<String> {
    let mut first_below = None;
    for name in kernel_leaf_first {
        if let Some((kind, _)) = KINDS
            .iter()
            .find(|(_, prefixes)| prefixes.iter().any(|p| name.starts_with(p)))
        {
            return Some((*kind).to_owned());
        }
        if first_below.is_none() && !is_scheduler(name) && !name.is_empty() {
            first_below = Some(name.to_owned());
        }
    }
    first_below
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn names_what_common_stacks_wait_on() {
        let stack = |s: &str| classify(s.split(';').collect::<Vec<_>>());
        assert_eq!(
            stack("__schedule;schedule;do_nanosleep;hrtimer_nanosleep;common_nsleep;__x64_sys_clock_nanosleep").as_deref(),
            Some("sleep")
        );
        assert_eq!(
            stack("__schedule;schedule;anon_pipe_read;vfs_read;ksys_read").as_deref(),
            Some("pipe")
        );
        assert_eq!(
            stack("__schedule;schedule;futex_wait_queue;__futex_wait;futex_wait").as_deref(),
            Some("lock (futex)")
        );
        assert_eq!(
            stack("__schedule;schedule;schedule_hrtimeout_range;ep_poll;do_epoll_wait").as_deref(),
            Some("poll / epoll")
        );
        assert_eq!(
            stack("__schedule;schedule;io_schedule;folio_wait_bit_common;filemap_get_pages")
                .as_deref(),
            Some("disk I/O")
        );
        // Unknown: the first function below the scheduler, as named.
        assert_eq!(
            stack("__schedule;schedule;some_driver_wait;ioctl").as_deref(),
            Some("some_driver_wait")
        );
        assert_eq!(classify(Vec::<&str>::new()), None);
    }
}
