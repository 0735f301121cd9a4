//! Command-line interface.

use std::path::PathBuf;

use clap::Parser;

/// symtrace-upload: publish executables, split debug info and sources.
///
/// Finds the ELF files under PATH..., splits their debug info natively (no
/// binutils needed), collects the source files their DWARF names, asks the
/// server once which of these it lacks, and uploads only those (zstd-compressed
/// unless the server is on loopback).
/// Re-running sends nothing already published.
///
/// Exit codes: 0 everything published (or already there), 1 some file failed
/// or the frame-pointer gate failed, 2 usage or configuration error.
#[derive(Parser, Debug, Clone)]
#[command(name = "symtrace-upload", version, about, long_about)]
pub struct Args {
    /// Files or directories (walked recursively; non-ELF files are ignored).
    #[arg(required = true)]
    pub paths: Vec<PathBuf>,

    /// The symtrace server.
    #[arg(long, env = "SYMTRACE_SERVER", default_value = "http://127.0.0.1:8002")]
    pub server: String,

    /// Bearer token with the upload scope.
    #[arg(long, env = "SYMTRACE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,

    /// Also strip the DWARF from each executable in place, adding a
    /// .gnu_debuglink (like objcopy --strip-debug --add-gnu-debuglink), and
    /// upload the stripped file as the executable. A binary is replaced only
    /// once its debug info and stripped form are on the server.
    #[arg(long)]
    pub strip: bool,

    /// Do not collect and upload source files.
    #[arg(long)]
    pub no_sources: bool,

    /// OLD=NEW: a source the DWARF names under OLD is read from NEW on disk
    /// (for builds with -ffile-prefix-map/-fdebug-prefix-map). Repeatable.
    #[arg(long = "source-prefix-map", value_name = "OLD=NEW")]
    pub source_prefix_map: Vec<String>,

    /// A directory whose files may be published as sources, besides the
    /// compilation directories the DWARF names (repeatable): a source
    /// outside every root — a system header, a dependency elsewhere, or any
    /// file a `#line` directive names — is listed as skipped, never read.
    /// Symlinks are resolved first: one that leaves the roots is skipped.
    #[arg(long = "source-root", value_name = "DIR")]
    pub source_roots: Vec<PathBuf>,

    /// Check that executables' functions keep frame pointers (x86-64) and
    /// fail when more than --frame-pointer-threshold percent of their code
    /// lacks them.
    #[arg(long)]
    pub require_frame_pointers: bool,

    /// Percentage of function bytes allowed without frame pointers.
    #[arg(long, default_value_t = 5.0)]
    pub frame_pointer_threshold: f64,

    /// Show what would be uploaded, and upload nothing.
    #[arg(long)]
    pub dry_run: bool,

    /// Print a machine-readable JSON summary on stdout.
    #[arg(long)]
    pub json: bool,

    /// Compression on the wire: zstd, none, or auto (zstd unless the server
    /// is on loopback, where compressing costs more CPU than it saves).
    #[arg(long, value_enum, default_value_t = Compression::Auto)]
    pub compression: Compression,

    /// Uploads in flight at once.
    #[arg(long, default_value_t = 4)]
    pub concurrency: usize,

    /// Attempts per upload on network errors and 5xx answers.
    #[arg(long, default_value_t = 5)]
    pub retries: u32,

    /// Directory for split files (default: a temporary directory).
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Compression {
    Auto,
    Zstd,
    None,
}

impl Args {
    /// Whether uploads are zstd-compressed.
    pub fn compress(&self) -> bool {
        match self.compression {
            Compression::Zstd => true,
            Compression::None => false,
            Compression::Auto => {
                let host = self
                    .server
                    .split("://")
                    .nth(1)
                    .unwrap_or("")
                    .split('/')
                    .next()
                    .unwrap_or("");
                let host = host
                    .rsplit_once(':')
                    .map_or(host, |(h, _)| h)
                    .trim_matches(['[', ']']);
                !(host == "localhost"
                    || host
                        .parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback()))
            }
        }
    }

    /// Parsed `--source-prefix-map` pairs.
    pub fn prefix_map(&self) -> anyhow::Result<Vec<(String, String)>> {
        self.source_prefix_map
            .iter()
            .map(|m| {
                m.split_once('=')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| anyhow::anyhow!("--source-prefix-map {m:?} is not OLD=NEW"))
            })
            .collect()
    }
}
