//! Memory allocation profiles from the `otel_memory` probes' records: each
//! sampled allocation is an `alloc_space`/`alloc_objects` event, and the
//! ones not yet freed are kept here — their stack, thread context and
//! weight — for the `inuse_space`/`inuse_objects` snapshot taken at every
//! export. The BPF side keeps the same set (it reports a free only for an
//! allocation it tracks), so this one is bounded by its map.

use rustc_hash::FxHashMap as HashMap;
use std::sync::Arc;

use crate::procs::{ProcessInfo, UserFrame};
use crate::record::TraceCtx;
use crate::unwind::Cut;

/// Where an allocation was made: its process, thread, stack and span.
/// Allocations from the same place share one.
pub struct Site {
    pub process: Arc<ProcessInfo>,
    pub thread_name: String,
    pub user: Vec<UserFrame>,
    pub cut: Option<Cut>,
    pub trace: TraceCtx,
}

/// What identifies a site: (process identity, thread name, user return
/// addresses, trace and span).
type SiteKey = (usize, String, Vec<u64>, Option<([u8; 16], [u8; 8])>);

fn key_of(site: &Site) -> SiteKey {
    (
        Arc::as_ptr(&site.process) as usize,
        site.thread_name.clone(),
        site.user.iter().map(|f| f.address).collect(),
        site.trace.ids(),
    )
}

struct LiveAlloc {
    site: Arc<Site>,
    /// Bytes it stands for.
    weight: u64,
    /// Allocations it stands for (`weight / size`).
    objects: f64,
}

/// The live sampled allocations, by (pid, pointer).
#[derive(Default)]
pub struct Live {
    by_ptr: HashMap<(u32, u64), LiveAlloc>,
    sites: HashMap<SiteKey, Arc<Site>>,
    /// Frees of allocations not known here (recorded before the agent
    /// started reading, or whose allocation record was lost).
    pub unknown_frees: u64,
}

/// The allocations a sampled one of `size` bytes with weight `weight`
/// stands for: weight / size (at least one; an empty block counts one).
pub fn objects(size: u64, weight: u64) -> f64 {
    if size == 0 {
        return 1.0;
    }
    (weight as f64 / size as f64).max(1.0)
}

impl Live {
    /// The shared site equal to `site` (or `site`, now shared).
    pub fn site(&mut self, site: Site) -> Arc<Site> {
        self.sites
            .entry(key_of(&site))
            .or_insert_with(|| Arc::new(site))
            .clone()
    }

    /// A tracked allocation (one the BPF side will report the free of).
    pub fn alloc(&mut self, pid: u32, ptr: u64, size: u64, weight: u64, site: Arc<Site>) {
        self.by_ptr.insert(
            (pid, ptr),
            LiveAlloc {
                site,
                weight,
                objects: objects(size, weight),
            },
        );
    }

    pub fn free(&mut self, pid: u32, ptr: u64) {
        if self.by_ptr.remove(&(pid, ptr)).is_none() {
            self.unknown_frees += 1;
        }
    }

    /// A process exited or exec'd: its allocations are gone. Returns their
    /// pointers (for the BPF side's map).
    pub fn forget_process(&mut self, pid: u32) -> Vec<u64> {
        let ptrs: Vec<u64> = self
            .by_ptr
            .keys()
            .filter(|(p, _)| *p == pid)
            .map(|&(_, ptr)| ptr)
            .collect();
        for ptr in &ptrs {
            self.by_ptr.remove(&(pid, *ptr));
        }
        ptrs
    }

    pub fn len(&self) -> usize {
        self.by_ptr.len()
    }

    /// What is live, per site: (site, bytes, objects); sites no live
    /// allocation uses any more are dropped.
    pub fn snapshot(&mut self) -> Vec<(Arc<Site>, i64, i64)> {
        let mut by_site: HashMap<usize, (Arc<Site>, u64, f64)> = HashMap::default();
        for a in self.by_ptr.values() {
            let e = by_site
                .entry(Arc::as_ptr(&a.site) as usize)
                .or_insert_with(|| (a.site.clone(), 0, 0.0));
            e.1 = e.1.saturating_add(a.weight);
            e.2 += a.objects;
        }
        self.sites.retain(|_, s| Arc::strong_count(s) > 1);
        let mut out: Vec<(Arc<Site>, i64, i64)> = by_site
            .into_values()
            .map(|(site, bytes, objects)| {
                (
                    site,
                    bytes.min(i64::MAX as u64) as i64,
                    objects.round() as i64,
                )
            })
            .collect();
        out.sort_by_key(|(s, _, _)| (s.process.pid, Arc::as_ptr(s) as usize));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::procs::Mapping;

    fn site(process: &Arc<ProcessInfo>, addresses: &[u64]) -> Site {
        let mapping = Arc::new(Mapping {
            path: "/bin/x".into(),
            build_id: None,
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
        });
        Site {
            process: process.clone(),
            thread_name: "main".into(),
            user: addresses
                .iter()
                .map(|&address| UserFrame {
                    mapping: mapping.clone(),
                    address,
                    name: None,
                })
                .collect(),
            cut: None,
            trace: TraceCtx::default(),
        }
    }

    #[test]
    fn live_allocations_by_site() {
        let p = Arc::new(ProcessInfo {
            pid: 7,
            ..Default::default()
        });
        let mut live = Live::default();
        let a = live.site(site(&p, &[1, 2]));
        let b = live.site(site(&p, &[3]));
        assert!(Arc::ptr_eq(&a, &live.site(site(&p, &[1, 2]))), "shared");
        live.alloc(7, 0x10, 64, 512 << 10, a.clone());
        live.alloc(7, 0x20, 64, 512 << 10, a.clone());
        live.alloc(7, 0x30, 1 << 20, 1 << 20, b.clone());
        live.free(7, 0x20);
        live.free(7, 0x99);
        assert_eq!(live.unknown_frees, 1);
        drop((a, b));
        let snap = live.snapshot();
        assert_eq!(snap.len(), 2);
        let bytes: Vec<(i64, i64)> = snap.iter().map(|(_, b, o)| (*b, *o)).collect();
        assert!(bytes.contains(&(512 << 10, 8192)), "{bytes:?}");
        assert!(bytes.contains(&(1 << 20, 1)), "{bytes:?}");
        assert_eq!(live.forget_process(7).len(), 2);
        assert_eq!(live.len(), 0);
        drop(snap);
        assert!(live.snapshot().is_empty());
        assert!(live.sites.is_empty(), "unused sites dropped");
    }

    #[test]
    fn objects_a_sample_stands_for() {
        assert_eq!(objects(64, 512 << 10), 8192.0);
        assert_eq!(objects(0, 512 << 10), 1.0);
        assert_eq!(objects(3 << 20, 2 << 20), 1.0, "at least the one seen");
    }
}
