//! symtrace-upload end to end: real compilers, a real symtrace-server, and
//! elfutils' debuginfod-find and gdb as the consumers.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use symtrace_testkit::*;

mod bad_input;
mod dwz;
mod framepointers;
mod languages;
mod source_roots;
mod split;

const UPLOAD: &str = env!("CARGO_BIN_EXE_symtrace-upload");

/// Runs the uploader against `server` with `--json`; returns (exit code, summary, stderr).
/// It runs in the temporary directory, as a CI job runs in its checkout: the
/// fixtures' build trees (and so their compilation directories, the source
/// roots) are under it.
pub fn upload(server_url: &str, args: &[&str], paths: &[&Path]) -> (i32, Value, String) {
    upload_in(&std::env::temp_dir(), server_url, args, paths)
}

/// [`upload`] run in `cwd`.
pub fn upload_in(
    cwd: &Path,
    server_url: &str,
    args: &[&str],
    paths: &[&Path],
) -> (i32, Value, String) {
    let out: Output = Command::new(UPLOAD)
        .current_dir(cwd)
        .arg("--server")
        .arg(server_url)
        .arg("--json")
        .args(args)
        .args(paths)
        .env_remove("SYMTRACE_TOKEN")
        .env_remove("SYMTRACE_SERVER")
        .output()
        .expect("run symtrace-upload");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let summary = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), summary, stderr)
}

/// Compiles with `compiler` in `dir`, returning the output path.
pub fn compile(dir: &Path, compiler: &str, args: &[&str], out: &str) -> PathBuf {
    let path = dir.join(out);
    run(Command::new(compiler)
        .current_dir(dir)
        .args(args)
        .arg("-o")
        .arg(&path));
    path
}

pub fn has_section(file: &Path, name: &str) -> bool {
    let out = run(Command::new("readelf").arg("-SW").arg(file));
    String::from_utf8_lossy(&out.stdout).contains(&format!(" {name} "))
}

pub fn tools(list: &[&str]) -> bool {
    list.iter().all(|t| have(t))
}
