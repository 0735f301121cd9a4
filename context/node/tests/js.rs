//! Runs the JavaScript tests of the `@symtrace/context` package
//! (`node --test test/`) against the debug build of the addon, with the
//! OpenTelemetry packages from `$SYMTRACE_TEST_NODE_MODULES` (default
//! `/opt/symtrace-node/node_modules`). Skipped without `node` on PATH,
//! except in CI (`CI=true`), where that fails.

use std::path::PathBuf;
use std::process::Command;

#[test]
fn node_tests() {
    let package = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| package.join("../../target"));
    let addon = target.join("debug/libsymtrace_context_node.so");
    let node_modules = std::env::var("SYMTRACE_TEST_NODE_MODULES")
        .unwrap_or_else(|_| "/opt/symtrace-node/node_modules".to_owned());

    let output = match Command::new("node")
        .args(["--test", "test/"])
        .current_dir(&package)
        .env("SYMTRACE_CONTEXT_ADDON", &addon)
        .env("NODE_PATH", &node_modules)
        .output()
    {
        Ok(output) => output,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if std::env::var("CI").as_deref() == Ok("true") {
                panic!("node is not on PATH (required in CI)");
            }
            println!("skipped: node is not on PATH");
            return;
        }
        Err(e) => panic!("running node: {e}"),
    };
    assert!(
        output.status.success(),
        "node --test test/ failed ({}), addon {}:\n{}\n{}",
        output.status,
        addon.display(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
}
