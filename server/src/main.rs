//! symtrace-server: see `symtrace-server --help` and README.md.

use clap::Parser;
use symtrace_server::config::{Command, Config};

/// mimalloc: ingest allocates and frees several small vectors per sample
/// (prost's decoding); glibc's allocator took a quarter of ingest's CPU.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let config = Config::parse();
    if let Some(Command::Symbolize {
        build_id,
        addresses,
        server,
        token,
        json,
    }) = &config.command
    {
        return symtrace_server::symbolize_command(
            build_id,
            addresses,
            server,
            token.as_deref(),
            *json,
        )
        .await;
    }
    symtrace_server::init_tracing(config.log_format);
    symtrace_server::run(config).await
}
