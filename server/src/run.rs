//! Starting the server: storage, state, background tasks and listeners.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Semaphore;

use crate::app::{self, AppState};
use crate::auth::Auth;
use crate::config::{Config, LogFormat};
use crate::federation::Federation;
use crate::profiles::store::ProfileStore;
use crate::store::blobs::ObjectBlobStore;
use crate::store::meta::SqlMetadata;
use crate::store::SymbolStore;
use crate::{ingest, limits, listen, metrics, profiles, query, store, symbolize, zerocopy};

/// Logs to stderr, as text or JSON; verbosity from RUST_LOG (default info).
pub fn init_tracing(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub async fn run(config: Config) -> anyhow::Result<()> {
    std::fs::create_dir_all(&config.data_dir)
        .with_context(|| format!("creating data directory {}", config.data_dir.display()))?;
    let spool_dir = config.data_dir.join("spool");
    let cleared = store::spool::clear_spool_dir(&spool_dir)
        .with_context(|| format!("clearing spool directory {}", spool_dir.display()))?;
    if cleared > 0 {
        tracing::info!(cleared, "removed unfinished uploads left by an earlier run");
    }

    let meta = SqlMetadata::open(&config.database_url())
        .await
        .context("opening the metadata database")?;
    let blobs =
        ObjectBlobStore::from_url(&config.storage_url()).context("opening the blob store")?;
    tracing::info!(database = meta_backend(&meta), objects = %blobs_description(&blobs), "storage ready");
    let store = Arc::new(
        SymbolStore::new(
            Arc::new(meta),
            Arc::new(blobs),
            spool_dir,
            Duration::from_millis(config.lookup_cache_ms),
        )
        .with_max_decompressed_bytes(config.max_decompressed_bytes),
    );

    let auth = Auth::new(
        config.read_tokens.clone(),
        config.upload_tokens.clone(),
        config.admin_tokens.clone(),
        config.agent_tokens.clone(),
        config.tokens_file.clone(),
        crate::auth::Trust {
            loopback_writes: config.loopback_trust,
        },
    )
    .map_err(anyhow::Error::msg)?;
    check_public_reads(&config, &auth)?;
    if !auth.uploads_need_token() {
        tracing::warn!("no upload token configured (SYMTRACE_UPLOAD_TOKENS): uploads are accepted from direct loopback clients only");
    }
    tracing::info!(auth = %auth.describe());

    let concurrency = limits::Concurrency::new(
        config.max_concurrent_queries,
        config.max_concurrent_symbolize,
        config.max_concurrent_exports,
        config.max_concurrent_fetches,
    );
    let upstreams = config.upstreams();
    let federation = if upstreams.is_empty() {
        None
    } else {
        tracing::info!(
            ?upstreams,
            hop_limit = config.hop_limit,
            "federating misses"
        );
        Some(Arc::new(Federation::new(
            upstreams,
            store.clone(),
            Duration::from_secs(config.upstream_timeout_secs),
            Duration::from_secs(config.upstream_negative_ttl_secs),
            config.hop_limit,
            config.max_upload_bytes,
            concurrency.federation.clone(),
        )?))
    };

    store::gc::spawn(store.clone(), config.gc_interval(), config.gc_grace());

    let symbolizer = symbolize::SymbolizeService::new(
        store.clone(),
        federation.clone(),
        config.symbol_cache_bytes,
        config.max_concurrent_index_builds,
    )
    .context("starting the symbol index builders")?;
    let profiles = Arc::new(
        ProfileStore::new(store.clone(), config.max_label_values)
            .with_ingest_parts(config.ingest_layout == crate::config::IngestLayout::Series),
    );
    let state = Arc::new(AppState {
        upload_slots: Semaphore::new(config.max_concurrent_uploads.max(1)),
        quotas: crate::quota::Quotas::new(
            config.claims_per_minute,
            config.agent_upload_bytes_per_hour,
        ),
        metrics: metrics::recorder()?,
        config: config.clone(),
        symbolizer: symbolizer.clone(),
        profiles: profiles.clone(),
        engine: query::Engine::new(
            store.clone(),
            symbolizer.clone(),
            config.segment_cache_bytes,
            query::QueryLimits {
                max_bytes: config.query_max_bytes,
                timeout: Duration::from_secs(config.query_timeout_secs),
            },
            symtrace_service::cpu::CpuPool::per_cpu("query")
                .context("starting the query's CPU pool")?,
        ),
        concurrency,
        ingest: ingest::Ingest::new(
            profiles.clone(),
            ingest::normalize::Limits {
                max_stack_depth: config.max_stack_depth,
                max_elements: config.max_export_elements,
                max_label_value_bytes: config.max_label_value_bytes,
                max_series: config.max_export_series,
                max_text_bytes: config.max_export_text_bytes,
            },
            config.max_export_bytes,
        )?,
        store,
        auth,
        federation,
    });
    profiles::compact::spawn(
        state.profiles.clone(),
        compaction_settings(&config),
        (config.compaction_interval_secs > 0)
            .then(|| Duration::from_secs(config.compaction_interval_secs)),
        Duration::from_secs(config.retention_interval_secs.max(1)),
    );
    if config.tokens_file.is_some() {
        spawn_token_reloads(state.clone());
    }
    zerocopy::raise_fd_limit();
    let listener = tokio::net::TcpListener::bind(config.http_addr)
        .await
        .with_context(|| format!("binding {}", config.http_addr))?;
    let addr = listener.local_addr()?;
    tracing::info!(%addr, "symtrace-server listening on http://{addr}");
    let grpc_listener = tokio::net::TcpListener::bind(config.grpc_addr)
        .await
        .with_context(|| format!("binding {}", config.grpc_addr))?;
    let grpc_addr = grpc_listener.local_addr()?;
    tracing::info!(%grpc_addr, "OTLP gRPC listening on {grpc_addr}");
    if let Some(path) = &config.ready_file {
        write_ready_file(path, addr, grpc_addr)
            .with_context(|| format!("writing the ready file {}", path.display()))?;
    }
    let keepalive = Duration::from_secs(config.header_timeout_secs.max(1));
    let grpc = tonic::transport::Server::builder()
        .max_concurrent_streams(Some(config.grpc_max_streams.max(1)))
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(keepalive))
        .timeout(Duration::from_secs(config.query_timeout_secs.max(1)))
        .add_service(ingest::grpc::ProfilesGrpc::new(state.clone()))
        .serve_with_incoming_shutdown(
            listen::capped_incoming(grpc_listener, config.max_connections),
            shutdown_signal(),
        );
    let grpc = tokio::spawn(grpc);
    let http_limits = listen::HttpLimits {
        max_connections: config.max_connections,
        header_timeout: Duration::from_secs(config.header_timeout_secs.max(1)),
        body_idle_timeout: Duration::from_secs(config.body_idle_timeout_secs.max(1)),
        write_timeout: Duration::from_secs(config.response_write_timeout_secs.max(1)),
    };
    listen::serve(listener, app::router(state), http_limits, shutdown_signal()).await?;
    grpc.await?.context("OTLP gRPC server")?;
    if let Some(path) = &config.ready_file {
        // Its addresses are no longer served (after a crash the file stays:
        // its `pid` tells a reader whether the writer still runs).
        let _ = std::fs::remove_file(path);
    }
    tracing::info!("shut down");
    Ok(())
}

/// The bound addresses as JSON, written to a temporary file and renamed
/// over `path`: a reader sees the whole file or none.
fn write_ready_file(
    path: &std::path::Path,
    http: std::net::SocketAddr,
    grpc: std::net::SocketAddr,
) -> std::io::Result<()> {
    let body = serde_json::json!({
        "http": http.to_string(),
        "grpc": grpc.to_string(),
        "pid": std::process::id(),
    });
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, body.to_string())?;
    std::fs::rename(&tmp, path)
}

fn meta_backend(meta: &SqlMetadata) -> &'static str {
    use crate::store::meta::MetadataStore;
    meta.backend()
}

fn blobs_description(blobs: &ObjectBlobStore) -> String {
    use crate::store::blobs::BlobStore;
    blobs.describe()
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
    tracing::info!("shutting down: finishing requests in flight");
}

/// Reads the tokens file again on every SIGHUP.
fn spawn_token_reloads(state: Arc<AppState>) {
    tokio::spawn(async move {
        use tokio::signal::unix::{signal, SignalKind};
        let Ok(mut hup) = signal(SignalKind::hangup()) else {
            tracing::error!("cannot listen for SIGHUP: the tokens file is not reloaded");
            return;
        };
        while hup.recv().await.is_some() {
            match state.auth.reload() {
                Ok(n) => {
                    tracing::info!(tokens = n, auth = %state.auth.describe(), "tokens file reloaded")
                }
                Err(e) => {
                    tracing::error!("tokens file not reloaded, the tokens in force stay: {e}")
                }
            }
        }
    });
}

/// A server reachable from other hosts serves reads to anyone only when
/// told to: an open debuginfod is a legitimate deployment, an accident is
/// not.
fn check_public_reads(config: &Config, auth: &Auth) -> anyhow::Result<()> {
    if auth.reads_need_token() || config.http_addr.ip().is_loopback() {
        return Ok(());
    }
    if config.public_reads {
        tracing::warn!(
            addr = %config.http_addr,
            "reads are public (SYMTRACE_PUBLIC_READS): anyone who can reach this address lists and fetches every artifact and source, and reads every tenant's profiles"
        );
        return Ok(());
    }
    anyhow::bail!(
        "refusing to serve reads without tokens on {}: configure read tokens (SYMTRACE_READ_TOKENS or SYMTRACE_TOKENS_FILE), or set SYMTRACE_PUBLIC_READS=true for a public symbol server",
        config.http_addr
    )
}

/// What compaction and retention do, from the flags.
fn compaction_settings(config: &Config) -> profiles::compact::Settings {
    profiles::compact::Settings {
        window_ns: (config.compaction_window_secs.max(1) as i64).saturating_mul(1_000_000_000),
        delay_ns: (config.compaction_delay_secs as i64).saturating_mul(1_000_000_000),
        retention_ns: (config.profile_retention_hours > 0)
            .then(|| (config.profile_retention_hours as i64).saturating_mul(3_600_000_000_000)),
        export_key_ttl_ms: profiles::compact::EXPORT_KEY_TTL_MS,
        job_bytes: i64::try_from(config.compaction_job_bytes.max(1)).unwrap_or(i64::MAX),
    }
}
