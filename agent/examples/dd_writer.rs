//! Interoperability workload: publishes its thread context with Datadog's
//! `libdd-otel-thread-ctx` — an OTEP 4947 writer that is not ours — then
//! burns the given thread CPU time in `dd_work`.
//!
//! `cargo run -p symtrace-agent --example dd_writer -- TRACE_ID_HEX SPAN_ID_HEX SECONDS`

use std::time::Duration;

use libdd_otel_thread_ctx::linux::OwnedThreadContext;

#[path = "support/burn.rs"]
mod support;

#[inline(never)]
fn dd_work(budget: Duration) {
    support::burn(budget);
}

fn hex<const N: usize>(s: &str) -> [u8; N] {
    let mut out = [0; N];
    for (i, b) in out.iter_mut().enumerate() {
        *b = u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex ID");
    }
    out
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, trace, span, seconds] = &args[..] else {
        eprintln!("usage: dd_writer TRACE_ID_HEX SPAN_ID_HEX SECONDS");
        std::process::exit(2);
    };
    let previous = OwnedThreadContext::new(hex(trace), hex(span), 1, [0; 8], &[]).attach();
    assert!(previous.is_none());
    dd_work(Duration::from_secs_f64(seconds.parse().expect("seconds")));
    println!("done");
}
