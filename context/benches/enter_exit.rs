//! Cost to the application of publishing a span: one enter + exit (guard
//! drop), the future wrapper's per-poll cost, and the tracing layer's cost
//! on top of tracing-opentelemetry's own per enter/exit.
//!
//! `cargo bench -p symtrace-context --features tracing --bench enter_exit`

// criterion_group! generates an undocumented `pub fn benches`.
#![allow(missing_docs)]

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use symtrace_context::Ids;

fn enter_exit(c: &mut Criterion) {
    let ids = Ids::new([7; 16], [9; 8], 1);
    c.bench_function("enter+exit (guard)", |b| {
        b.iter(|| {
            let g = symtrace_context::enter(black_box(ids));
            drop(black_box(g));
        })
    });
    c.bench_function("set (no guard)", |b| {
        b.iter(|| symtrace_context::set(black_box(&ids)))
    });

    #[cfg(feature = "tracing")]
    {
        use opentelemetry::trace::TracerProvider as _;
        use tracing_subscriber::layer::SubscriberExt;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
        let tracer = provider.tracer("bench");
        let span_enter = |with_ours: bool| {
            let otel = tracing_opentelemetry::layer().with_tracer(tracer.clone());
            let registry = tracing_subscriber::registry().with(otel);
            if with_ours {
                tracing::Dispatch::new(registry.with(symtrace_context::TraceContextLayer))
            } else {
                tracing::Dispatch::new(registry)
            }
        };
        for (name, with_ours) in [
            ("tracing span enter+exit, tracing-opentelemetry only", false),
            ("tracing span enter+exit, + TraceContextLayer", true),
        ] {
            let dispatch = span_enter(with_ours);
            tracing::dispatcher::with_default(&dispatch, || {
                let span = tracing::info_span!("request");
                c.bench_function(name, |b| {
                    b.iter(|| {
                        let e = span.enter();
                        drop(black_box(e));
                    })
                });
            });
        }
    }
}

criterion_group!(benches, enter_exit);
criterion_main!(benches);
