//! Test workload for the agent (Rust, built with frame pointers like every
//! build of ours): two threads, each burning a given amount of its own CPU
//! time (CLOCK_THREAD_CPUTIME_ID, not wall time) in a function of its own,
//! `alpha_work` and `beta_work`; prints the thread CPU times it measured.
//!
//! `cargo run -p symtrace-agent --example cpu_split -- 1.2 0.6`

use std::time::Duration;

#[path = "support/burn.rs"]
mod support;
use support::burn;

#[inline(never)]
fn alpha_work(budget: Duration) -> Duration {
    burn(budget)
}

#[inline(never)]
fn beta_work(budget: Duration) -> Duration {
    burn(budget)
}

fn main() {
    let args: Vec<f64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().expect("CPU seconds"))
        .collect();
    let [alpha, beta] = args[..] else {
        eprintln!("usage: cpu_split ALPHA_CPU_SECONDS BETA_CPU_SECONDS");
        std::process::exit(2);
    };
    let a = std::thread::spawn(move || alpha_work(Duration::from_secs_f64(alpha)));
    let b = std::thread::spawn(move || beta_work(Duration::from_secs_f64(beta)));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    println!(
        "alpha_work {:.6}\nbeta_work {:.6}",
        a.as_secs_f64(),
        b.as_secs_f64()
    );
}
