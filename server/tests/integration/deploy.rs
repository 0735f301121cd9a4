//! The Kubernetes manifests under `deploy/kubernetes/` validate, strictly,
//! against the Kubernetes API schemas (PyPI's kubernetes-validate; no
//! cluster needed), and the server's manifest only sets real server flags.

use std::path::{Path, PathBuf};
use std::process::Command;

use symtrace_testkit as kit;

fn manifests() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 2, "{files:?}");
    files
}

/// `kubernetes-validate --strict` for Kubernetes 1.31 on `files`.
fn validate(python: &Path, files: &[PathBuf]) -> std::process::Output {
    let validator = python.with_file_name("kubernetes-validate");
    Command::new(validator)
        .args(["--strict", "--kubernetes-version", "1.31.0"])
        .args(files)
        .output()
        .expect("kubernetes-validate (scripts/test-services.sh installs it)")
}

#[test]
fn kubernetes_manifests_validate_against_the_api_schemas() {
    let Some(python) = kit::python() else {
        return;
    };
    let files = manifests();
    let out = validate(&python, &files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    for kind in [
        "deployment/symtrace-server",
        "service/symtrace-server",
        "daemonset/symtrace-agent",
    ] {
        assert!(
            text.contains(&format!("passed for resource {kind}")),
            "{kind} not checked:\n{text}"
        );
    }
    // The check can fail: a misspelt field is refused.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.yaml");
    let server =
        std::fs::read_to_string(files.iter().find(|f| f.ends_with("server.yaml")).unwrap())
            .unwrap();
    std::fs::write(&bad, server.replacen("  replicas: 2", "  replica: 2", 1)).unwrap();
    let out = validate(&python, &[bad]);
    assert!(!out.status.success(), "a misspelt field passed");
    assert!(String::from_utf8_lossy(&out.stdout).contains("'replica' was unexpected"));
}

#[test]
fn the_server_manifest_sets_only_real_server_flags() {
    let help = kit::run(Command::new(kit::server_bin()).arg("--help"));
    let help = String::from_utf8_lossy(&help.stdout).into_owned();
    let manifest = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes/server.yaml"),
    )
    .unwrap();
    let vars: Vec<&str> = manifest
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("SYMTRACE_"))
        .collect();
    assert!(vars.len() >= 5, "{vars:?}");
    for var in vars {
        assert!(
            help.contains(&format!("env: {var}=")) || help.contains(&format!("env: {var}]")),
            "{var} is not a server flag"
        );
    }
}
