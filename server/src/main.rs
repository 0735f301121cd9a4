//! symtrace-server: see `symtrace-server --help` and README.md.

use clap::Parser;
use symtrace_server::config::{Command, Config};

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
