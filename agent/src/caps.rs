//! The capabilities the agent needs, checked before anything is loaded, so a
//! missing one is named instead of surfacing as an EPERM from deep inside a
//! BPF or perf syscall. Nothing here asks for `privileged` or CAP_SYS_ADMIN.

/// A capability the agent needs, and why.
pub struct Needed {
    pub name: &'static str,
    pub bit: u32,
    pub why: &'static str,
}

pub const NEEDED: [Needed; 3] = [
    Needed {
        name: "CAP_BPF",
        bit: 39,
        why: "to load the BPF sampler and create its maps",
    },
    Needed {
        name: "CAP_PERFMON",
        bit: 38,
        why: "to open a CPU-clock perf event on every CPU and read kernel stacks",
    },
    Needed {
        name: "CAP_SYS_PTRACE",
        bit: 19,
        why: "to read other processes' /proc/PID/maps, environ and executables",
    },
];

/// The effective capability set of this process (`CapEff` of
/// `/proc/self/status`).
pub fn effective() -> std::io::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    parse_cap_eff(&status).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "no CapEff line in /proc/self/status",
        )
    })
}

fn parse_cap_eff(status: &str) -> Option<u64> {
    let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
    u64::from_str_radix(hex.trim(), 16).ok()
}

/// The needed capabilities missing from `effective`.
pub fn missing(effective: u64) -> Vec<&'static Needed> {
    NEEDED
        .iter()
        .filter(|n| effective & (1 << n.bit) == 0)
        .collect()
}

/// An error naming every missing capability and how to grant it.
pub fn check() -> anyhow::Result<()> {
    let missing = missing(effective()?);
    if missing.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = missing
        .iter()
        .map(|n| format!("{} ({})", n.name, n.why))
        .collect();
    let names: Vec<&str> = missing.iter().map(|n| n.name).collect();
    anyhow::bail!(
        "missing capabilit{}: {}. Grant exactly these (Kubernetes: \
         securityContext.capabilities.add: [BPF, PERFMON, SYS_PTRACE], see \
         deploy/kubernetes/agent-daemonset.yaml; docker: --cap-add {}); the agent \
         needs neither privileged mode nor CAP_SYS_ADMIN",
        if missing.len() == 1 { "y" } else { "ies" },
        list.join(", "),
        names
            .iter()
            .map(|n| n.trim_start_matches("CAP_"))
            .collect::<Vec<_>>()
            .join(" --cap-add "),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_cap_eff_and_names_what_is_missing() {
        let status = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t000000c000080000\n";
        let eff = parse_cap_eff(status).unwrap();
        assert!(missing(eff).is_empty());
        let without_perfmon = eff & !(1 << 38);
        let names: Vec<_> = missing(without_perfmon).iter().map(|n| n.name).collect();
        assert_eq!(names, ["CAP_PERFMON"]);
        let names: Vec<_> = missing(0).iter().map(|n| n.name).collect();
        assert_eq!(names, ["CAP_BPF", "CAP_PERFMON", "CAP_SYS_PTRACE"]);
        assert!(parse_cap_eff("Name:\tx\n").is_none());
    }
}
