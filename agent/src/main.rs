//! symtrace-agent: the eBPF CPU profiler. See `cli.rs` for what it does and
//! `docs/agent.md` for how to deploy it.

mod batch;
mod binaries;
mod caps;
mod cfi;
mod cli;
mod collect;
mod export;
mod jit;
mod kallsyms;
mod maps;
mod memory;
mod offcpu;
mod procs;
mod record;
mod resolve;
mod safefile;
mod sampler;
mod stats;
mod threadctx;
mod unwind;
mod upload;
mod usdt;
mod vdso;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;

fn main() -> anyhow::Result<()> {
    let args = cli::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    caps::check()?;
    let started = std::time::Instant::now();
    let off_cpu = sampler::OffCpu {
        probability: args.off_cpu_probability,
        span_probability: args.off_cpu_span_probability,
        max_waiting: args.off_cpu_max_waiting,
    };
    let sampler = sampler::Sampler::load(&sampler::Options {
        frequency: args.frequency,
        ring_buffer_bytes: args.ring_buffer_bytes,
        kernel_threads: args.kernel_threads,
        off_cpu,
        run_time_stats: args.stats,
        memory_max_live: (!args.no_memory).then_some(args.memory_max_live),
        memory_max_rate: args.memory_max_rate,
    })?;
    tracing::info!(
        "sampling {} CPUs at {} Hz (BPF loaded and attached in {:?}); exporting every {:?} to {}",
        sampler.cpus(),
        args.frequency,
        started.elapsed(),
        args.interval,
        args.server
    );
    let host_name = args.host_name.clone().unwrap_or_else(host_name);
    let queue = export::Queue::new(args.buffer_bytes);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    let exporter = runtime.spawn(export::run(
        queue.clone(),
        export::Target {
            endpoint: args.server.clone(),
            tenant: args.tenant.clone(),
            token: args.token.clone(),
            timeout: args.export_timeout,
        },
    ));
    let uploads = (!args.no_upload_binaries).then(|| {
        let (offers, rx) = upload::channel(args.upload_max_file_bytes);
        let options = upload::Options {
            url: args
                .upload_url
                .clone()
                .unwrap_or_else(|| upload::default_url(&args.server)),
            tenant: args.tenant.clone(),
            token: args.token.clone(),
            bytes_per_second: args.upload_bytes_per_second,
            holder: format!("{host_name}/{}", std::process::id()),
        };
        tracing::info!(url = %options.url, "publishing the binaries the server lacks");
        runtime.spawn(upload::run(rx, options, offers.clone()));
        let stats = offers.stats();
        (offers, stats)
    });
    let stop = Arc::new(AtomicBool::new(false));
    let collector = collect::Collector {
        sampler,
        queue: queue.clone(),
        interval: args.interval,
        frequency: args.frequency,
        host_name,
        print_stats: args.stats,
        cfi_cache_bytes: args.cfi_cache_bytes,
        jit_bytes: (args.jit_process_bytes, args.jit_total_bytes),
        off_cpu,
        uploads,
    };
    let collecting = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || collector.run(&stop))?
    };
    runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        anyhow::Ok(())
    })?;
    tracing::info!("stopping: sending what is buffered");
    stop.store(true, Ordering::Relaxed);
    let mut totals = collecting
        .join()
        .map_err(|_| anyhow::anyhow!("the sampler thread panicked"))??;
    let delivered =
        runtime.block_on(async { tokio::time::timeout(args.shutdown_timeout, exporter).await });
    match delivered {
        Ok(result) => result.context("export task")??,
        Err(_) => tracing::warn!(
            "gave up after {:?}: {} buffered batches not delivered",
            args.shutdown_timeout,
            queue.stats().queued_batches
        ),
    }
    totals.gauges.delivery = queue.stats();
    let total = stats::line(&totals.first, &totals.last, &totals.gauges);
    println!("{}", total.replacen("stats:", "total:", 1));
    tracing::info!("stopped");
    Ok(())
}

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
