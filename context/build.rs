//! Our examples, tests and benches are executables that publish thread
//! contexts: export the TLS slot to `.dynsym`, where readers find it (an
//! application does the same in its own build; see docs/trace-context.md).
fn main() {
    for kind in ["examples", "benches"] {
        println!("cargo:rustc-link-arg-{kind}=-Wl,--export-dynamic-symbol=otel_thread_ctx_v1");
    }
}
