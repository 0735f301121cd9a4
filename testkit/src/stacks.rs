//! Folded stacks of a service as the server answers them, and workloads
//! that report the CPU time they burned: what the agent's stack tests
//! (agent/tests/unwind.rs, cfi.rs) check against.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Server;

/// Runs a workload mode; returns the `name seconds` lines it printed.
pub fn run(bin: &std::path::Path, service: &str, args: &[&str]) -> BTreeMap<String, f64> {
    let out = crate::run(
        Command::new(bin)
            .args(args)
            .env("OTEL_SERVICE_NAME", service)
            .stdin(Stdio::null()),
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (name, secs) = l.split_once(' ')?;
            Some((name.to_owned(), secs.trim().parse().ok()?))
        })
        .collect()
}

/// The service's folded stacks once they hold the samples its CPU time is
/// due (`expected`), or most of them and the count stopped growing for
/// three of the agent's 1 s export intervals (the workload has exited), or
/// 30 s passed. Not at a fraction of `expected`: samples arrive in time
/// order, and a workload's phases run one after the other (gamma_work
/// then delta_work), so a profile read early would skew the split.
pub fn folded_stacks(server: &Server, service: &str, expected: f64) -> Vec<(Vec<String>, u64)> {
    let url = format!(
        "{}/api/v1/flamegraph?service={service}&format=folded&from=now-1h&to=now",
        server.url
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut last = (0, Instant::now());
    loop {
        let resp = crate::client().get(&url).send().unwrap();
        let text = if resp.status() == 200 {
            resp.text().unwrap()
        } else {
            String::new()
        };
        let stacks: Vec<(Vec<String>, u64)> = text
            .lines()
            .map(|l| {
                let (frames, n) = l.rsplit_once(' ').unwrap();
                (
                    frames.split(';').map(str::to_owned).collect(),
                    n.parse().unwrap(),
                )
            })
            .collect();
        let total: u64 = stacks.iter().map(|s| s.1).sum();
        if total != last.0 {
            last = (total, Instant::now());
        }
        let settled = total as f64 >= 0.6 * expected && last.1.elapsed() >= Duration::from_secs(3);
        if total as f64 >= 0.98 * expected || settled || Instant::now() > deadline {
            return stacks;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// Whether `path` (root first, `;`-separated) appears in the stack as
/// consecutive frames.
pub fn has_path(stack: &[String], path: &str) -> bool {
    let path: Vec<&str> = path.split(';').collect();
    stack
        .windows(path.len())
        .any(|w| w.iter().zip(&path).all(|(a, b)| a == b))
}

/// The samples of the stacks for which `f` holds.
pub fn samples_where(stacks: &[(Vec<String>, u64)], f: impl Fn(&[String]) -> bool) -> u64 {
    stacks.iter().filter(|(s, _)| f(s)).map(|(_, n)| n).sum()
}
