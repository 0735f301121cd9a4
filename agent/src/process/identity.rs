//! Who a process is: its service name (OpenTelemetry process context, else
//! `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES` of its environment,
//! else its executable's name), executable, container and user. Reading
//! its environment and its process context reads the process's memory,
//! which the process controls (a page of a FUSE file the kernel must fetch
//! from a daemon that never answers): [`read`] runs in a job; until it
//! answers, [`provisional`] names the process from what the kernel alone
//! knows.

use std::io::Read;
use std::path::Path;

use crate::threadctx;

/// Who a process is: its OTLP resource.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ProcessInfo {
    pub pid: u32,
    pub service_name: String,
    pub executable_name: String,
    pub executable_path: Option<String>,
    pub container_id: Option<String>,
    /// Other resource attributes from the OpenTelemetry process context.
    pub resource: Vec<(String, String)>,
    /// Names of the thread-context attribute keys, by key index.
    pub attribute_keys: Vec<String>,
}

/// What identity a process has, and its real user.
#[derive(Debug)]
pub struct Identity {
    pub info: ProcessInfo,
    /// Its real user ID (`u32::MAX` when unknown).
    pub uid: u32,
    /// Its `OTEL_CTX` mapping was there and read.
    pub process_context_read: bool,
}

/// Bytes of `/proc/PID/environ` read at most (`ARG_MAX`-sized environments
/// are 2 MiB; the variables wanted are near the start in practice).
const MAX_ENVIRON: u64 = 1 << 20;
/// Bytes of `/proc/PID/cgroup` and `/proc/PID/status` read at most.
const MAX_SMALL: u64 = 64 << 10;

/// Reads a small procfs file, bounded.
fn read_bounded(path: &Path, max: u64) -> Option<Vec<u8>> {
    let mut out = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(max)
        .read_to_end(&mut out)
        .ok()?;
    Some(out)
}

/// The executable's path and name, from what the kernel knows (no read
/// of the process's memory or files).
fn executable(root: &Path, pid: u32, comm: &str) -> (Option<String>, String) {
    let dir = root.join(pid.to_string());
    let executable_path = executable_path(root, pid);
    let executable_name = executable_path
        .as_deref()
        .and_then(|p| p.rsplit('/').next())
        .filter(|n| !n.is_empty())
        .map(str::to_owned)
        .or_else(|| {
            read_bounded(&dir.join("comm"), 64)
                .map(|c| String::from_utf8_lossy(&c).trim_end().to_owned())
        })
        .unwrap_or_else(|| comm.to_owned());
    (executable_path, executable_name)
}

/// The path of the executable process `pid` runs (`None`: gone, or not
/// readable), without the kernel's " (deleted)" suffix.
pub fn executable_path(root: &Path, pid: u32) -> Option<String> {
    let path = std::fs::read_link(root.join(pid.to_string()).join("exe")).ok()?;
    let path = path.to_string_lossy();
    Some(path.strip_suffix(" (deleted)").unwrap_or(&path).to_owned())
}

/// A process named by its executable until [`read`] answers.
pub fn provisional(root: &Path, pid: u32, comm: &str) -> ProcessInfo {
    let (executable_path, executable_name) = executable(root, pid, comm);
    ProcessInfo {
        pid,
        service_name: executable_name.clone(),
        executable_name,
        executable_path,
        ..ProcessInfo::default()
    }
}

/// Reads who process `pid` is (`process_context`: where its `OTEL_CTX`
/// mapping starts, if it has one). Reads its memory: run in a job.
pub fn read(root: &Path, pid: u32, comm: &str, process_context: Option<u64>) -> Identity {
    let dir = root.join(pid.to_string());
    let (executable_path, executable_name) = executable(root, pid, comm);
    let context = process_context.and_then(|at| threadctx::read_process_context(root, pid, at));
    let process_context_read = context.is_some();
    let context = context.unwrap_or_default();
    let environ = read_bounded(&dir.join("environ"), MAX_ENVIRON).unwrap_or_default();
    let service_name = context
        .resource
        .iter()
        .find(|(k, v)| k == "service.name" && !v.is_empty())
        .map(|(_, v)| v.clone())
        .or_else(|| service_from_environ(&environ))
        .unwrap_or_else(|| executable_name.clone());
    let resource = context
        .resource
        .into_iter()
        .filter(|(k, _)| k != "service.name")
        .collect();
    let container_id = read_bounded(&dir.join("cgroup"), MAX_SMALL)
        .and_then(|c| container_id(&String::from_utf8_lossy(&c)));
    let uid = read_bounded(&dir.join("status"), MAX_SMALL)
        .and_then(|s| real_uid(&String::from_utf8_lossy(&s)))
        .unwrap_or(u32::MAX);
    Identity {
        info: ProcessInfo {
            pid,
            service_name,
            executable_name,
            executable_path,
            container_id,
            resource,
            attribute_keys: context.attribute_keys,
        },
        uid,
        process_context_read,
    }
}

/// The real user ID in `/proc/PID/status` text.
pub fn real_uid(status: &str) -> Option<u32> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `OTEL_SERVICE_NAME`, else `service.name` of `OTEL_RESOURCE_ATTRIBUTES`
/// (as the OpenTelemetry SDKs read them), from a NUL-separated environment.
fn service_from_environ(environ: &[u8]) -> Option<String> {
    let var = |name: &str| {
        environ.split(|&b| b == 0).find_map(|kv| {
            let kv = std::str::from_utf8(kv).ok()?;
            kv.strip_prefix(name)?.strip_prefix('=').map(str::to_owned)
        })
    };
    if let Some(name) = var("OTEL_SERVICE_NAME").filter(|n| !n.is_empty()) {
        return Some(name);
    }
    var("OTEL_RESOURCE_ATTRIBUTES")?.split(',').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k.trim() == "service.name" && !v.trim().is_empty()).then(|| v.trim().to_owned())
    })
}

/// The container ID in a `/proc/PID/cgroup`: a 64-hex path segment, bare
/// or as `docker-…`, `cri-containerd-…`, `crio-…`, `libpod-…` with `.scope`.
fn container_id(cgroup: &str) -> Option<String> {
    cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        path.rsplit('/').find_map(|segment| {
            let segment = segment.strip_suffix(".scope").unwrap_or(segment);
            let id = segment.rsplit('-').next()?;
            (id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_owned())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_name_from_the_environment() {
        let env = b"PATH=/bin\0OTEL_SERVICE_NAME=checkout\0HOME=/\0";
        assert_eq!(service_from_environ(env).as_deref(), Some("checkout"));
        let env = b"OTEL_RESOURCE_ATTRIBUTES=deployment.environment=prod, service.name=cart\0";
        assert_eq!(service_from_environ(env).as_deref(), Some("cart"));
        let env = b"OTEL_SERVICE_NAME=\0OTEL_SERVICE_NAMES=x\0";
        assert_eq!(service_from_environ(env), None);
    }

    #[test]
    fn container_ids_of_common_runtimes() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for cgroup in [
            format!("0::/system.slice/docker-{id}.scope\n"),
            format!("0::/kubepods/burstable/pod1234/{id}\n"),
            format!("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{id}.scope\n"),
            format!("12:cpu:/crio-{id}.scope\n"),
        ] {
            assert_eq!(container_id(&cgroup).as_deref(), Some(id), "{cgroup}");
        }
        assert_eq!(
            container_id("0::/user.slice/user-0.slice/session-1.scope\n"),
            None
        );
    }

    #[test]
    fn our_own_identity() {
        let me = read(Path::new("/proc"), std::process::id(), "x", None);
        // SAFETY: getuid has no preconditions.
        assert_eq!(me.uid, unsafe { libc::getuid() });
        assert!(me.info.executable_path.is_some());
        assert_eq!(real_uid("Name:\tx\nUid:\t65534\t0\t0\t0\n"), Some(65534));
        assert_eq!(real_uid("Uid:\n"), None);
    }
}
