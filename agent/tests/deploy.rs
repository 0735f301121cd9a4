//! The DaemonSet keeps the least-privilege promise: the agent's three
//! capabilities, everything else dropped, never privileged.

use symtrace_testkit as kit;

fn daemonset() -> String {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/kubernetes/agent-daemonset.yaml"
    );
    std::fs::read_to_string(path).unwrap()
}

/// The YAML without comments.
fn settings() -> Vec<String> {
    daemonset()
        .lines()
        .map(|l| l.split('#').next().unwrap().trim_end().to_owned())
        .filter(|l| !l.trim().is_empty())
        .collect()
}

#[test]
fn the_daemonset_grants_exactly_the_checked_capabilities() {
    let lines = settings();
    let has = |s: &str| lines.iter().any(|l| l.trim() == s);
    assert!(has("add: [BPF, PERFMON, SYS_PTRACE]"), "{lines:#?}");
    assert!(has("drop: [ALL]"));
    assert!(has("privileged: false"));
    assert!(!lines.iter().any(|l| l.contains("privileged: true")));
    assert!(!lines.iter().any(|l| l.contains("SYS_ADMIN")));
    assert!(has("allowPrivilegeEscalation: false"));
    assert!(has("readOnlyRootFilesystem: true"));
    assert!(has("hostPID: true"));
    assert!(has(
        "- {name: bpffs, mountPath: /sys/fs/bpf, readOnly: true}"
    ));
    assert!(has(
        "- {name: btf, mountPath: /sys/kernel/btf, readOnly: true}"
    ));
}

#[test]
fn the_daemonset_probes_the_agents_health_and_bounds_its_memory() {
    let lines = settings();
    let has = |s: &str| lines.iter().any(|l| l.trim() == s);
    assert!(has("value: 0.0.0.0:8003"), "{lines:#?}");
    assert!(has("- {name: health, containerPort: 8003}"), "{lines:#?}");
    assert!(has("httpGet: {path: /healthz, port: health}"), "{lines:#?}");
    // The default bounds' sum (docs/agent.md) fits the limit.
    assert!(has("limits: {cpu: 200m, memory: 384Mi}"), "{lines:#?}");
}

#[test]
fn the_daemonset_names_the_flags_the_agent_has() {
    // Every SYMTRACE_AGENT_* variable it sets is one the agent reads.
    let help = kit::help_of(std::path::Path::new(env!("CARGO_BIN_EXE_symtrace-agent")));
    let text = daemonset();
    let vars = kit::words_with_prefix(&text, "SYMTRACE_AGENT_");
    assert!(vars.len() >= 3, "{vars:?}");
    for var in vars {
        assert!(
            kit::is_env_flag(&help, var),
            "{var} is not an agent flag:\n{help}"
        );
    }
}
