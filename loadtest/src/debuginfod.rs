//! The `debuginfod` scenario: a set of distinct ELF files (copies of one
//! real file, each with its own GNU build-ID written into its note), uploaded
//! through the upload API, then fetched by debuginfod clients: hits
//! (Zipf-weighted, whole bodies read and their length checked), misses
//! (build-IDs never uploaded, 404 expected) and, in `mixed`, more uploads.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use anyhow::Context;
use object::Object;
use rand::Rng;

use crate::generate::Zipf;
use crate::report::Op;
use crate::target::{classify, send_checked, status_failure, Failure, Targets};

/// Copies of one ELF file that differ in their build-ID.
pub struct ElfSet {
    base: Vec<u8>,
    id_at: usize,
    id_len: usize,
    /// Distinguishes the build-IDs of one run from another's.
    run: u64,
}

impl ElfSet {
    pub fn load(path: &Path, run: u64) -> anyhow::Result<Self> {
        let base = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let file =
            object::File::parse(&*base).with_context(|| format!("parsing {}", path.display()))?;
        let id = file
            .build_id()?
            .with_context(|| format!("{} has no GNU build-ID note", path.display()))?;
        let (id_at, id_len) = (id.as_ptr() as usize - base.as_ptr() as usize, id.len());
        Ok(Self {
            base,
            id_at,
            id_len,
            run,
        })
    }

    pub fn len(&self) -> usize {
        self.base.len()
    }

    /// Build-ID number `i` (hex): from a SplitMix64 stream of (run, i).
    pub fn id(&self, i: u64) -> String {
        self.id_bytes(i)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }

    fn id_bytes(&self, i: u64) -> Vec<u8> {
        let mut state = self.run ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut out = Vec::with_capacity(self.id_len + 8);
        while out.len() < self.id_len {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            out.extend_from_slice(&(z ^ (z >> 31)).to_le_bytes());
        }
        out.truncate(self.id_len);
        out
    }

    /// File number `i`: the base with build-ID `i`.
    pub fn file(&self, i: u64) -> Vec<u8> {
        let mut data = self.base.clone();
        data[self.id_at..self.id_at + self.id_len].copy_from_slice(&self.id_bytes(i));
        data
    }
}

/// Build-IDs at or above this index are never uploaded: the misses.
const MISS_BASE: u64 = 1 << 62;

pub struct Debuginfod {
    pub set: ElfSet,
    http: reqwest::Client,
    tenant: String,
    /// Files 0..files are uploaded before the run.
    files: u64,
    zipf: Zipf,
    /// Indices (from `files` on) of the files uploaded during the run and
    /// acknowledged.
    pub uploaded: Mutex<Vec<u64>>,
    next_upload: std::sync::atomic::AtomicU64,
}

impl Debuginfod {
    pub fn new(set: ElfSet, files: u64, tenant: &str) -> anyhow::Result<Self> {
        Ok(Self {
            set,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            tenant: tenant.to_owned(),
            zipf: Zipf::new(files.max(1) as usize),
            files: files.max(1),
            uploaded: Mutex::new(Vec::new()),
            next_upload: std::sync::atomic::AtomicU64::new(files.max(1)),
        })
    }

    /// Uploads the set (files 0..files).
    pub async fn upload_set(&self, targets: &Targets, op: &Op) -> anyhow::Result<()> {
        let mut failed = 0;
        for i in 0..self.files {
            if targets.send(op, |url| self.upload(url, i)).await.is_none() {
                failed += 1;
            }
        }
        anyhow::ensure!(failed == 0, "{failed} of {} uploads failed", self.files);
        Ok(())
    }

    async fn upload(&self, url: String, i: u64) -> Result<u64, Failure> {
        let body = self.set.file(i);
        let len = body.len() as u64;
        send_checked(
            self.http
                .put(format!(
                    "{url}/api/v1/debuginfo/{}/executable",
                    self.set.id(i)
                ))
                .header("X-Scope-OrgID", &self.tenant)
                .body(body),
        )
        .await?;
        Ok(len)
    }

    /// One request: an upload with probability `upload_ratio`, else a miss
    /// with probability `miss_ratio`, else a hit.
    pub async fn request(&self, targets: &Targets, ops: &Ops, miss_ratio: f64, upload_ratio: f64) {
        let (draw, pick, miss_id) = {
            let mut rng = rand::rng();
            (
                rng.random::<f64>(),
                self.zipf.sample(&mut rng) as u64,
                MISS_BASE + rng.random_range(0..1u64 << 40),
            )
        };
        if draw < upload_ratio {
            let i = self
                .next_upload
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if targets
                .send(&ops.upload, |url| self.upload(url, i))
                .await
                .is_some()
            {
                self.uploaded.lock().unwrap().push(i);
            }
        } else if draw < upload_ratio + miss_ratio {
            targets
                .send(&ops.miss, |url| self.fetch(url, miss_id, false))
                .await;
        } else {
            targets
                .send(&ops.hit, |url| self.fetch(url, pick, true))
                .await;
        }
    }

    /// GET /buildid/ID/executable: the whole file when `present`, else 404.
    async fn fetch(&self, url: String, i: u64, present: bool) -> Result<u64, Failure> {
        let r = self
            .http
            .get(format!("{url}/buildid/{}/executable", self.set.id(i)))
            .header("X-Scope-OrgID", &self.tenant)
            .send()
            .await
            .map_err(|e| classify(&e))?;
        match (present, r.status().as_u16()) {
            (true, 200) => {
                let body = r.bytes().await.map_err(|e| classify(&e))?;
                if body.len() != self.set.len() {
                    return Err(Failure::Answer("wrong body length".into()));
                }
                Ok(body.len() as u64)
            }
            (false, 404) => Ok(0),
            (true, 404) => Err(Failure::Answer("404 for an uploaded file".into())),
            (false, 200) => Err(Failure::Answer("200 for a file never uploaded".into())),
            _ => Err(status_failure(r.status())),
        }
    }

    /// Files acknowledged during the run that `url` does not serve whole.
    pub async fn missing_uploads(&self, url: &str) -> anyhow::Result<Vec<String>> {
        let uploaded = self.uploaded.lock().unwrap().clone();
        let mut missing = Vec::new();
        for i in (0..self.files).chain(uploaded) {
            let id = self.set.id(i);
            let r = self
                .http
                .head(format!("{url}/buildid/{id}/executable"))
                .header("X-Scope-OrgID", &self.tenant)
                .send()
                .await?;
            let size = r
                .headers()
                .get("X-DEBUGINFOD-SIZE")
                .and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
            if r.status() != 200 || size != Some(self.set.len()) {
                missing.push(id);
            }
        }
        Ok(missing)
    }
}

/// The operations of the scenario, as reported.
pub struct Ops {
    pub hit: std::sync::Arc<Op>,
    pub miss: std::sync::Arc<Op>,
    pub upload: std::sync::Arc<Op>,
}

impl Ops {
    /// The scenario's three operations, in the report's order.
    pub fn new(report: &mut crate::report::Report) -> std::sync::Arc<Self> {
        std::sync::Arc::new(Self {
            hit: report.op("debuginfod", "hit"),
            miss: report.op("debuginfod", "miss"),
            upload: report.op("debuginfod", "upload"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copies are ELF files that differ from the original only in
    /// their build-ID, each the one `id` names.
    #[test]
    fn each_copy_carries_its_own_build_id() {
        let set = ElfSet::load(Path::new("/proc/self/exe"), 7).unwrap();
        let (a, b) = (set.file(0), set.file(1));
        assert_eq!((a.len(), b.len()), (set.len(), set.len()));
        assert_ne!(set.id(0), set.id(1));
        for (i, data) in [(0, &a), (1, &b)] {
            let file = object::File::parse(&data[..]).unwrap();
            let id: String = file
                .build_id()
                .unwrap()
                .unwrap()
                .iter()
                .map(|x| format!("{x:02x}"))
                .collect();
            assert_eq!(id, set.id(i));
        }
        let differing = a.iter().zip(&b).filter(|(x, y)| x != y).count();
        assert!(differing > 0 && differing <= set.id_len, "{differing}");
        // Another run names other build-IDs; the same run the same ones.
        let other = ElfSet::load(Path::new("/proc/self/exe"), 8).unwrap();
        assert_ne!(other.id(0), set.id(0));
        assert_eq!(
            ElfSet::load(Path::new("/proc/self/exe"), 7).unwrap().id(0),
            set.id(0)
        );
    }

    #[test]
    fn a_file_that_is_not_elf_is_refused_with_its_name() {
        let path = std::env::temp_dir().join(format!("loadtest-not-elf-{}", std::process::id()));
        std::fs::write(&path, b"#!/bin/sh\necho hi\n").unwrap();
        let err = ElfSet::load(&path, 1).err().unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(
            format!("{err:#}").contains(&format!("parsing {}", path.display())),
            "{err:#}"
        );
        let err = ElfSet::load(Path::new("/nonexistent/elf"), 1)
            .err()
            .unwrap();
        assert!(
            format!("{err:#}").contains("reading /nonexistent/elf"),
            "{err:#}"
        );
    }
}
