//! symtrace-agent: the eBPF CPU profiler. See `cli.rs` for what it does and
//! `docs/agent.md` for how to deploy it.

mod batch;
mod caps;
mod cfi;
mod cli;
mod collect;
mod export;
mod files;
mod health;
mod jit;
mod jobs;
mod kallsyms;
mod memory;
mod offcpu;
mod process;
mod reaper;
mod record;
mod sampler;
mod snapshot;
mod stats;
mod threadctx;
mod unwind;
mod unwind_maps;
mod upload;
mod usdt;
mod vdso;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

/// Allocations of this size or more get their own mapping, given back to
/// the kernel when freed. glibc's default threshold starts at 128 KiB and
/// rises to 32 MiB as large blocks are freed, after which the buffers of
/// a file's reading (its CFI sections, its unwind table's rows: MBs for
/// node) come from the heap or a thread's arena and stay resident after
/// use. Measured with node started beside the agent (docs/BENCHMARKS.md):
/// peak RSS 99 → 76 MB, RSS a minute later 91 → 61 MB.
const MMAP_THRESHOLD: libc::c_int = 128 << 10;

fn tune_allocator() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a parameter of malloc; called before any
    // thread is spawned.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
    }
}

fn main() -> anyhow::Result<()> {
    tune_allocator();
    let args = cli::Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    if let Some(cli::Command::UnwindTable { files, at }) = &args.command {
        return cfi::inspect::print(files, at);
    }
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
        memory_max_live_per_process: args.memory_max_live_per_process,
        off_cpu_max_process_rate: args.off_cpu_max_process_rate,
        unwind_table_bytes: args.unwind_table_bytes,
        stack_snapshots: !args.no_stack_snapshots,
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
    let health = health::Health::new(args.health_max_silence, args.health_max_undelivered.0);
    let queue = export::Queue::new(args.buffer_bytes);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?;
    if let Some(addr) = args.health_addr {
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("binding --health-addr {addr}"))?;
        tracing::info!(addr = %listener.local_addr()?, "serving /healthz and /metrics");
        runtime.spawn(health::serve(listener, health.clone()));
    }
    let stop = Arc::new(AtomicBool::new(false));
    let exporter = runtime.spawn(export::run(
        queue.clone(),
        export::Target {
            endpoint: args.server.clone(),
            tenant: args.tenant.clone(),
            token: args.token.clone(),
            timeout: args.export_timeout,
        },
        health.clone(),
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
            budgets: upload::queue::Budgets {
                files_per_minute: args.upload_max_files_per_minute,
                bytes_per_hour: args.upload_max_bytes_per_hour,
            },
        };
        tracing::info!(url = %options.url, "publishing the binaries the server lacks");
        let offers = offers.with_probe(upload::Probe::new(
            options.clone(),
            runtime.handle().clone(),
        ));
        let (health, stopping, offers2) = (health.clone(), stop.clone(), offers.clone());
        runtime.spawn(async move {
            let _watch = health::Watch {
                health,
                what: "uploader",
                stopping,
            };
            upload::run(rx, options, offers2).await;
        });
        let stats = offers.stats();
        (offers, stats)
    });
    let upload_stats = uploads.as_ref().map(|(_, stats)| stats.clone());
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
        pool: jobs::Pool::new(2),
        health: health.clone(),
        memory_probe_files: args.memory_probe_files.clone(),
        fault: collect::Fault::from_env(),
    };
    let collecting = {
        let stop = stop.clone();
        let watch = health::Watch {
            health: health.clone(),
            what: "sampler",
            stopping: stop.clone(),
        };
        std::thread::Builder::new()
            .name("sampler".into())
            .spawn(move || {
                let _watch = watch;
                collector.run(&stop)
            })?
    };
    let died = runtime.block_on(async {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = tokio::signal::ctrl_c() => Ok(None),
            _ = term.recv() => Ok(None),
            why = health.wait_for_death() => anyhow::Ok(Some(why)),
        }
    })?;
    if let Some(why) = died {
        // A thread of the agent is gone: its work is no longer done. What
        // is buffered gets a short chance to go; the exit status says the
        // agent failed, so that its supervisor restarts it.
        stop.store(true, Ordering::Relaxed);
        queue.close();
        let _ = runtime
            .block_on(async { tokio::time::timeout(Duration::from_secs(5), exporter).await });
        anyhow::bail!("{why}");
    }
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
    if let Some(stats) = upload_stats {
        // An upload under way when the sampler stopped is counted once it
        // ends (the server may have taken it already), within a bound.
        let deadline = std::time::Instant::now() + UPLOAD_GRACE;
        if !runtime.block_on(stats.settled(deadline)) {
            tracing::warn!("gave up after {UPLOAD_GRACE:?} on a binary still being uploaded");
        }
        totals.gauges.uploads = Some(stats.snapshot());
    }
    let total = stats::line(&totals.first, &totals.last, &totals.gauges);
    println!("{}", total.replacen("stats:", "total:", 1));
    tracing::info!("stopped");
    Ok(())
}

/// How long a stopping agent waits for an upload under way.
const UPLOAD_GRACE: Duration = Duration::from_secs(10);

fn host_name() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes.
    if unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) } != 0 {
        return "unknown".to_owned();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}
