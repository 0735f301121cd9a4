//! The Kubernetes manifests under `deploy/kubernetes/` validate, strictly,
//! against the Kubernetes API schemas (PyPI's kubernetes-validate; no
//! cluster needed), and the server's manifest only sets real server flags;
//! `docker-compose.yml` passes `docker-compose config` (no container engine
//! needed), keeps the agent unprivileged and sets only real flags.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;
use symtrace_testkit as kit;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Another binary of this workspace (`cargo test --workspace` builds them
/// all). Missing is a skip, and a failure under `CI=true`.
fn sibling_bin(name: &str) -> Option<PathBuf> {
    let bin = kit::target_dir().join(name);
    kit::require(
        bin.exists(),
        &format!("{name} built (cargo test --workspace builds it)"),
    )
    .then_some(bin)
}

/// YAML as JSON, through PyYAML in the test venv (kubernetes-validate's
/// dependency).
fn yaml_to_json(python: &Path, yaml: &[u8]) -> Value {
    let mut child = Command::new(python)
        .args([
            "-c",
            "import json, sys, yaml; json.dump(yaml.safe_load(sys.stdin), sys.stdout)",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    child.stdin.take().unwrap().write_all(yaml).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn manifests() -> Vec<PathBuf> {
    let dir = repo().join("deploy/kubernetes");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 3, "{files:?}");
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
        "job/symtrace-upload",
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
    let help = kit::help_of(&kit::server_bin());
    let manifest = std::fs::read_to_string(repo().join("deploy/kubernetes/server.yaml")).unwrap();
    let vars = kit::words_with_prefix(&manifest, "SYMTRACE_");
    assert!(vars.len() >= 5, "{vars:?}");
    for var in vars {
        assert!(kit::is_env_flag(&help, var), "{var} is not a server flag");
    }
}

#[test]
fn the_uploader_job_sets_only_real_uploader_flags() {
    let Some(python) = kit::python() else {
        return;
    };
    let Some(upload) = sibling_bin("symtrace-upload") else {
        return;
    };
    let help = kit::help_of(&upload);
    let job = std::fs::read(repo().join("deploy/kubernetes/uploader-job.yaml")).unwrap();
    let job = yaml_to_json(&python, &job);
    assert_eq!(job["kind"], "Job");
    let containers = job["spec"]["template"]["spec"]["containers"]
        .as_array()
        .unwrap();
    let mut names = Vec::new();
    for c in containers {
        for e in c["env"].as_array().into_iter().flatten() {
            names.push(e["name"].as_str().unwrap().to_owned());
        }
    }
    assert!(
        names.iter().any(|n| n == "SYMTRACE_SERVER") && names.iter().any(|n| n == "SYMTRACE_TOKEN"),
        "{names:?}"
    );
    for name in &names {
        assert!(
            kit::is_env_flag(&help, name),
            "{name} is not an uploader flag"
        );
    }
}

/// `docker-compose -f FILE config` (validates and prints the normalized
/// file; no container engine is involved).
fn compose_config(file: &Path) -> std::process::Output {
    // The tokens come from .env; these stand in for it.
    Command::new("docker-compose")
        .arg("-f")
        .arg(file)
        .arg("config")
        .env("DEMO_TOKEN", "test-upload-token")
        .env("DEMO_READ_TOKEN", "test-read-token")
        .env("DEMO_AGENT_TOKEN", "test-agent-token")
        .output()
        .expect("docker-compose (scripts/test-services.sh installs it)")
}

/// Keys of a map or the strings of a list (`depends_on`, `cap_add` and
/// `environment` have both syntaxes; `K=V` strings give `K`).
fn names_in(v: &Value) -> Vec<String> {
    match v {
        Value::Null => Vec::new(),
        Value::Object(map) => map.keys().cloned().collect(),
        Value::Array(list) => list
            .iter()
            .map(|e| {
                let s = e.as_str().unwrap_or_else(|| panic!("{e}"));
                s.split('=').next().unwrap().to_owned()
            })
            .collect(),
        other => panic!("neither a map nor a list: {other}"),
    }
}

/// Capability names as Docker reads them (`CAP_BPF` and `bpf` are `BPF`).
fn caps(v: &Value) -> Vec<String> {
    let mut caps: Vec<String> = names_in(v)
        .into_iter()
        .map(|c| {
            let c = c.to_ascii_uppercase();
            c.strip_prefix("CAP_").unwrap_or(&c).to_owned()
        })
        .collect();
    caps.sort();
    caps
}

#[test]
fn compose_file_validates_and_keeps_the_agent_unprivileged() {
    if !kit::have("docker-compose") {
        return;
    }
    let Some(python) = kit::python() else {
        return;
    };
    let (Some(agent_bin), Some(upload_bin)) = (
        sibling_bin("symtrace-agent"),
        sibling_bin("symtrace-upload"),
    ) else {
        return;
    };
    let file = repo().join("docker-compose.yml");
    let out = compose_config(&file);
    assert!(
        out.status.success(),
        "docker-compose config failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = yaml_to_json(&python, &out.stdout);
    let services = &config["services"];
    for name in [
        "postgres",
        "minio",
        "minio-bucket",
        "symtrace-server",
        "symtrace-agent",
        "example-service",
        "publish-symbols",
    ] {
        assert!(services[name].is_object(), "no service {name}: {services}");
    }

    // The agent: the host's processes, exactly the three capabilities it
    // checks for (SYSLOG allowed, to name kernel frames), never privileged.
    let agent = &services["symtrace-agent"];
    assert_eq!(agent["pid"], "host");
    assert_eq!(caps(&agent["cap_drop"]), ["ALL"]);
    let mut added = caps(&agent["cap_add"]);
    added.retain(|c| c != "SYSLOG");
    assert_eq!(added, ["BPF", "PERFMON", "SYS_PTRACE"]);
    assert!(
        agent["privileged"].is_null() || agent["privileged"] == Value::Bool(false),
        "privileged: {}",
        agent["privileged"]
    );
    assert_eq!(agent["read_only"], Value::Bool(true));
    // BTF for CO-RE, mounted read-only (short or long volume syntax).
    let btf_ro = agent["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| match v {
            Value::String(s) => s.starts_with("/sys/kernel/btf:/sys/kernel/btf:ro"),
            v => v["target"] == "/sys/kernel/btf" && v["read_only"] == Value::Bool(true),
        });
    assert!(btf_ro, "no read-only /sys/kernel/btf: {}", agent["volumes"]);

    // The agent holds an agent token (no reads, publishes as an agent's)
    // the server knows as one, is watched through /healthz, and has the
    // memory its bounds promise.
    let env_of = |service: &str, var: &str| -> Value {
        let env = &services[service]["environment"];
        match env {
            Value::Object(m) => m.get(var).cloned().unwrap_or(Value::Null),
            _ => env
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str()?.strip_prefix(&format!("{var}=")))
                .map(|v| Value::String(v.to_owned()))
                .next()
                .unwrap_or(Value::Null),
        }
    };
    assert_eq!(
        env_of("symtrace-agent", "SYMTRACE_AGENT_TOKEN"),
        "test-agent-token"
    );
    assert_eq!(
        env_of("symtrace-server", "SYMTRACE_AGENT_TOKENS"),
        "test-agent-token"
    );
    let health = agent["healthcheck"]["test"].to_string();
    assert!(health.contains("/healthz"), "{health}");
    assert!(
        env_of("symtrace-agent", "SYMTRACE_AGENT_HEALTH_ADDR")
            .as_str()
            .is_some_and(|a| a.ends_with(":8003")),
        "{}",
        agent["environment"]
    );
    assert!(!agent["mem_limit"].is_null(), "{agent}");

    // The server waits for its database and bucket.
    let server = &services["symtrace-server"];
    let depends = names_in(&server["depends_on"]);
    for dep in ["postgres", "minio"] {
        assert!(depends.iter().any(|d| d == dep), "{depends:?}");
        if server["depends_on"].is_object() {
            assert_eq!(server["depends_on"][dep]["condition"], "service_healthy");
        }
    }

    // Every SYMTRACE_* variable is a flag of the binary it configures.
    for (service, bin, at_least) in [
        ("symtrace-server", kit::server_bin(), 5),
        ("symtrace-agent", agent_bin, 2),
        ("publish-symbols", upload_bin, 1),
    ] {
        let help = kit::help_of(&bin);
        let vars: Vec<String> = names_in(&services[service]["environment"])
            .into_iter()
            .filter(|v| v.starts_with("SYMTRACE_"))
            .collect();
        assert!(vars.len() >= at_least, "{service}: {vars:?}");
        for var in &vars {
            assert!(
                kit::is_env_flag(&help, var),
                "{service} sets {var}, not a flag of {}",
                bin.display()
            );
        }
    }

    // The check can fail: a misspelt top-level key, and `pid` of the wrong
    // type, are refused.
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(&file).unwrap();
    // No token defaults: without .env the file does not even resolve.
    let out = Command::new("docker-compose")
        .current_dir(dir.path())
        .arg("-f")
        .arg(&file)
        .arg("config")
        .env_remove("DEMO_TOKEN")
        .env_remove("DEMO_READ_TOKEN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "compose resolved without tokens");
    assert!(stderr.contains("DEMO_TOKEN"), "{stderr}");
    for (from, to, complaint) in [
        ("\nvolumes:\n", "\nvolumez:\n", "volumez"),
        (
            "    pid: host\n",
            "    pid: [host]\n",
            "pid contains an invalid type",
        ),
    ] {
        assert!(text.contains(from), "{from:?} not in the compose file");
        let bad = dir.path().join("docker-compose.yml");
        std::fs::write(&bad, text.replacen(from, to, 1)).unwrap();
        let out = compose_config(&bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{to:?} passed");
        assert!(stderr.contains(complaint), "{to:?}: {stderr}");
    }
}
