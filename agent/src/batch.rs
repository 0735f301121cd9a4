//! One export interval's samples, built into an OTLP profiles v1.11 request:
//! one resource per process (service, pid, executable, container, host), and
//! in it a `samples/count` profile with period `cpu/nanoseconds` (every
//! sample with its timestamps) and, when the process waited, an
//! `off_cpu/nanoseconds` profile (each wait a timestamp and a value, the
//! OpenTelemetry eBPF profiler's off-CPU type), and, when its allocations
//! are sampled, `alloc_space/bytes` and `alloc_objects/count` (the sampled
//! allocations of the interval added up per stack, thread and span: one
//! value, at the latest one's time) and `inuse_space/bytes` and
//! `inuse_objects/count` (one snapshot: every value at the same time),
//! sharing one dictionary.
//! Native frames are left unsymbolized (an address and a mapping carrying
//! `process.executable.build_id.gnu`); kernel frames, the vDSO's and JIT
//! code's (perf maps, jitdump: with file, line and `profile.frame.type`
//! `v8js`, `jvm`, …) are named. Samples with
//! the same stack, thread and trace link share one `Sample` with one
//! timestamp per occurrence.

use rustc_hash::FxHashMap as HashMap;
use std::hash::Hash;
use std::sync::Arc;

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value::Value, AnyValue, InstrumentationScope, KeyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use symtrace_proto::resource::Resource;

use crate::jit::{FrameKind, Symbol};
use crate::memory::{self, Site};
use crate::process::{self, ProcessInfo, UserFrame};
use crate::record::TraceCtx;
use crate::unwind::Cut;

/// The location attribute naming a JIT frame's tier (V8: `ignition`,
/// `sparkplug`, `maglev`, `turbofan`).
const JIT_TIER: &str = "symtrace.jit.tier";

/// Index tables with 0 as the required zero value.
struct Table<K> {
    index: HashMap<K, i32>,
    len: i32,
}

impl<K: Hash + Eq> Table<K> {
    fn new() -> Self {
        Self {
            index: HashMap::default(),
            len: 1,
        }
    }

    /// The index of `key`, and whether it is new (the caller then pushes
    /// the value to the dictionary).
    fn intern(&mut self, key: K) -> (i32, bool) {
        let mut new = false;
        let len = &mut self.len;
        let i = *self.index.entry(key).or_insert_with(|| {
            new = true;
            *len += 1;
            *len - 1
        });
        (i, new)
    }
}

/// A sample as the sampler hands it over.
pub struct Observed<'a> {
    pub process: &'a Arc<ProcessInfo>,
    pub thread_name: &'a str,
    pub unix_ns: u64,
    pub user: &'a [UserFrame],
    /// Why the user stack was cut after `user` (a marker frame ends it).
    pub cut: Option<Cut>,
    /// Kernel frames, leaf first: (address, name if known).
    pub kernel: &'a [(u64, Option<&'a str>)],
    pub trace: &'a TraceCtx,
}

/// A sample's identity: (stack, attributes, link).
type SampleKey = (i32, Vec<i32>, i32);

/// A memory profile's event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// A sampled allocation: the bytes and allocations it stands for.
    Alloc { bytes: i64, objects: i64 },
    /// What is live from one site at a snapshot.
    InUse { bytes: i64, objects: i64 },
}

#[derive(Default)]
struct ProcessSamples {
    info: Arc<ProcessInfo>,
    /// On-CPU: timestamps.
    samples: HashMap<SampleKey, Vec<u64>>,
    /// Off-CPU: (time the wait began, nanoseconds it stands for).
    waits: HashMap<SampleKey, Vec<(u64, i64)>>,
    /// Allocations, added up per key over the interval: (latest time,
    /// bytes, objects).
    allocs: HashMap<SampleKey, (u64, i64, i64)>,
    /// In use at a snapshot: (time, bytes, objects).
    inuse: HashMap<SampleKey, (u64, i64, i64)>,
}

pub struct Batch {
    dict: ProfilesDictionary,
    strings: Table<String>,
    mappings: Table<Arc<process::Mapping>>,
    /// (mapping, address, function, line): generated code at one address
    /// may be another function later in the batch.
    locations: Table<(i32, u64, i32, i64)>,
    /// (name, system name, file).
    functions: Table<(i32, i32, i32)>,
    attributes: Table<(i32, String)>,
    stacks: Table<Vec<i32>>,
    links: Table<([u8; 16], [u8; 8])>,
    /// By process identity (the `Arc`'s address; the value holds the `Arc`):
    /// a pid that exec'd is a new process.
    processes: HashMap<usize, ProcessSamples>,
    kernel_mapping: i32,
    native: i32,
    kernel: i32,
    /// The marker location ending a cut stack (made on first use).
    cut_marker: i32,
    samples: usize,
    start_ns: u64,
    period_ns: i64,
    host_name: String,
    scratch: Vec<i32>,
    /// Allocation stacks' indices, made once per batch (the `Arc` held, so
    /// its address is not another stack's while it is cached).
    stack_keys: HashMap<usize, (Arc<memory::Stack>, i32)>,
}

impl Batch {
    pub fn new(start_ns: u64, frequency_hz: u64, host_name: &str) -> Self {
        let mut batch = Self {
            dict: ProfilesDictionary::with_zero_values(),
            strings: Table::new(),
            mappings: Table::new(),
            locations: Table::new(),
            functions: Table::new(),
            attributes: Table::new(),
            stacks: Table::new(),
            links: Table::new(),
            processes: HashMap::default(),
            kernel_mapping: 0,
            native: 0,
            kernel: 0,
            cut_marker: 0,
            samples: 0,
            start_ns,
            period_ns: (1_000_000_000 / frequency_hz.max(1)) as i64,
            host_name: host_name.to_owned(),
            scratch: Vec::new(),
            stack_keys: HashMap::default(),
        };
        batch.native = batch.attribute("profile.frame.type", "native");
        batch.kernel = batch.attribute("profile.frame.type", "kernel");
        batch.kernel_mapping = batch.mapping(&Arc::new(process::Mapping {
            path: "[kernel.kallsyms]".to_owned(),
            build_id: None,
            htlhash: false,
            content_sha256: None,
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
            file: (0, 0),
        }));
        batch
    }

    pub fn samples(&self) -> usize {
        self.samples
    }

    fn string(&mut self, s: &str) -> i32 {
        if s.is_empty() {
            return 0;
        }
        let (i, new) = self.strings.intern(s.to_owned());
        if new {
            self.dict.string_table.push(s.to_owned());
        }
        i
    }

    fn attribute(&mut self, key: &str, value: &str) -> i32 {
        let key = self.string(key);
        let (i, new) = self.attributes.intern((key, value.to_owned()));
        if new {
            self.dict.attribute_table.push(KeyValueAndUnit {
                key_strindex: key,
                value: Some(string_value(value)),
                unit_strindex: 0,
            });
        }
        i
    }

    fn mapping(&mut self, m: &Arc<process::Mapping>) -> i32 {
        let (i, new) = self.mappings.intern(m.clone());
        if new {
            let mut attribute_indices = match &m.build_id {
                Some(id) if m.htlhash => {
                    vec![self.attribute("process.executable.build_id.htlhash", id)]
                }
                Some(id) => vec![self.attribute("process.executable.build_id.gnu", id)],
                None => vec![],
            };
            if let Some(sha) = &m.content_sha256 {
                attribute_indices.push(self.attribute(symtrace_proto::FILE_SHA256, sha));
            }
            let filename_strindex = self.string(&m.path);
            self.dict.mapping_table.push(Mapping {
                memory_start: m.start,
                memory_limit: m.limit,
                file_offset: m.file_offset,
                filename_strindex,
                attribute_indices,
            });
        }
        i
    }

    fn native_location(&mut self, frame: &UserFrame) -> i32 {
        let mapping = self.mapping(&frame.mapping);
        // Named by the agent (the vDSO, JIT code): sent with its lines, as
        // the kernel's frames are.
        let line = frame.name.as_deref().map(|s| self.symbol_line(s));
        let (function, number) = line.as_ref().map_or((0, 0), |l| (l.function_index, l.line));
        let (i, new) = self
            .locations
            .intern((mapping, frame.address, function, number));
        if new {
            let mut attribute_indices = vec![self.native];
            if let Some(s) = frame.name.as_deref() {
                if s.kind != FrameKind::Native {
                    attribute_indices[0] = self.attribute("profile.frame.type", s.kind.as_str());
                }
                if let Some(tier) = s.tier {
                    attribute_indices.push(self.attribute(JIT_TIER, tier));
                }
            }
            self.dict.location_table.push(Location {
                mapping_index: mapping,
                address: frame.address,
                lines: line.into_iter().collect(),
                attribute_indices,
            });
        }
        i
    }

    fn line(&mut self, name: &str) -> Line {
        self.symbol_line(&Symbol::named(name))
    }

    /// A named frame's line, its function interned.
    fn symbol_line(&mut self, s: &Symbol) -> Line {
        let name = self.string(&s.function);
        let system_name = match &s.system_name {
            Some(n) => self.string(n),
            None => name,
        };
        let file = s.file.as_deref().map_or(0, |f| self.string(f));
        let (f, new) = self.functions.intern((name, system_name, file));
        if new {
            self.dict.function_table.push(Function {
                name_strindex: name,
                system_name_strindex: system_name,
                filename_strindex: file,
                ..Default::default()
            });
        }
        Line {
            function_index: f,
            line: i64::from(s.line),
            column: i64::from(s.column),
        }
    }

    /// The frame ending a stack the agent cut (`profile.frame.type`
    /// `truncated`, as the server marks the stacks it cuts).
    fn cut_location(&mut self) -> i32 {
        if self.cut_marker == 0 {
            let line = self.line(Cut::MARKER);
            let kind = self.attribute("profile.frame.type", "truncated");
            self.dict.location_table.push(Location {
                mapping_index: 0,
                address: 0,
                lines: vec![line],
                attribute_indices: vec![kind],
            });
            self.locations.len += 1;
            self.cut_marker = self.locations.len - 1;
        }
        self.cut_marker
    }

    fn kernel_location(&mut self, address: u64, name: Option<&str>) -> i32 {
        let (i, new) = self.locations.intern((self.kernel_mapping, address, 0, 0));
        if new {
            let lines = match name {
                Some(name) => vec![self.line(name)],
                None => vec![],
            };
            self.dict.location_table.push(Location {
                mapping_index: self.kernel_mapping,
                address,
                lines,
                attribute_indices: vec![self.kernel],
            });
        }
        i
    }

    /// Adds one sample: on-CPU, or (`off_cpu_ns`) a wait of that many
    /// nanoseconds. The stack is kernel frames (leaf first) then user
    /// frames, as one leaf-first location list.
    pub fn add(&mut self, s: &Observed<'_>, off_cpu_ns: Option<i64>) {
        let key = self.key(s);
        let process = self.process(s.process);
        match off_cpu_ns {
            None => process.samples.entry(key).or_default().push(s.unix_ns),
            Some(ns) => process.waits.entry(key).or_default().push((s.unix_ns, ns)),
        }
        self.samples += 1;
    }

    /// Adds a memory event of an allocation site (its stack interned once
    /// per batch).
    pub fn add_site(&mut self, site: &Site, unix_ns: u64, memory: Memory) {
        let id = Arc::as_ptr(&site.stack) as usize;
        let stack_index = match self.stack_keys.get(&id) {
            Some(&(_, i)) => i,
            None => {
                let i = self.stack_index(&[], &site.stack.user, site.stack.cut);
                self.stack_keys.insert(id, (site.stack.clone(), i));
                i
            }
        };
        let (attributes, link) = self.labels(&site.stack.process, &site.thread_name, &site.trace);
        let key = (stack_index, attributes, link);
        self.add_memory_keyed(&site.stack.process, key, unix_ns, memory);
    }

    /// Adds a memory event: a sampled allocation, or a site's live bytes
    /// at a snapshot (added up when the same key comes twice).
    fn add_memory_keyed(
        &mut self,
        info: &Arc<ProcessInfo>,
        key: SampleKey,
        unix_ns: u64,
        memory: Memory,
    ) {
        let process = self.process(info);
        match memory {
            Memory::Alloc { bytes, objects } => {
                let e = process.allocs.entry(key).or_insert((unix_ns, 0, 0));
                e.0 = e.0.max(unix_ns);
                e.1 = e.1.saturating_add(bytes);
                e.2 = e.2.saturating_add(objects);
            }
            Memory::InUse { bytes, objects } => {
                let e = process.inuse.entry(key).or_insert((unix_ns, 0, 0));
                e.1 = e.1.saturating_add(bytes);
                e.2 = e.2.saturating_add(objects);
            }
        }
        self.samples += 1;
    }

    /// A process's identity became known (`old` was a provisional one):
    /// its samples so far go under `new` — merged with any it has already.
    pub fn identify(&mut self, old: &Arc<ProcessInfo>, new: &Arc<ProcessInfo>) {
        let Some(mut samples) = self.processes.remove(&(Arc::as_ptr(old) as usize)) else {
            return;
        };
        samples.info = new.clone();
        match self.processes.entry(Arc::as_ptr(new) as usize) {
            std::collections::hash_map::Entry::Vacant(v) => {
                v.insert(samples);
            }
            std::collections::hash_map::Entry::Occupied(mut o) => {
                let into = o.get_mut();
                for (k, mut v) in samples.samples {
                    into.samples.entry(k).or_default().append(&mut v);
                }
                for (k, mut v) in samples.waits {
                    into.waits.entry(k).or_default().append(&mut v);
                }
                for (k, (t, b, n)) in samples.allocs {
                    let e = into.allocs.entry(k).or_insert((t, 0, 0));
                    *e = (e.0.max(t), e.1.saturating_add(b), e.2.saturating_add(n));
                }
                for (k, v) in samples.inuse {
                    into.inuse.entry(k).or_insert(v);
                }
            }
        }
    }

    /// Whether a file mapping of the batch is still without its content
    /// hash while `under_way` says it is being computed.
    pub fn awaits_contents(&self, mut under_way: impl FnMut((u64, u64)) -> bool) -> bool {
        self.mappings
            .index
            .keys()
            .any(|m| m.content_sha256.is_none() && m.file != (0, 0) && under_way(m.file))
    }

    /// Gives the file mappings sampled before their file's content hash
    /// was known the hash `content_of` knows now (by the file's device and
    /// inode, never by path or build-ID: another file may have those), so
    /// those samples too are named by what an agent published of it.
    /// Returns how many file mappings go without.
    pub fn settle_contents(
        &mut self,
        mut content_of: impl FnMut((u64, u64)) -> Option<String>,
    ) -> usize {
        let unsettled: Vec<(i32, (u64, u64))> = self
            .mappings
            .index
            .iter()
            .filter(|(m, _)| m.content_sha256.is_none() && m.file != (0, 0))
            .map(|(m, &i)| (i, m.file))
            .collect();
        let mut without = 0;
        for (i, file) in unsettled {
            match content_of(file) {
                Some(sha) => {
                    let attribute = self.attribute(symtrace_proto::FILE_SHA256, &sha);
                    if let Some(m) = self.dict.mapping_table.get_mut(i as usize) {
                        m.attribute_indices.push(attribute);
                    }
                }
                None => without += 1,
            }
        }
        without
    }

    fn process(&mut self, info: &Arc<ProcessInfo>) -> &mut ProcessSamples {
        self.processes
            .entry(Arc::as_ptr(info) as usize)
            .or_insert_with(|| ProcessSamples {
                info: info.clone(),
                ..Default::default()
            })
    }

    /// A sample's identity: its stack, attributes and link, interned.
    fn key(&mut self, s: &Observed<'_>) -> SampleKey {
        let stack_index = self.stack_index(s.kernel, s.user, s.cut);
        let (attributes, link) = self.labels(s.process, s.thread_name, s.trace);
        (stack_index, attributes, link)
    }

    /// The stack (kernel frames leaf first, then user frames), interned.
    fn stack_index(
        &mut self,
        kernel: &[(u64, Option<&str>)],
        user: &[UserFrame],
        cut: Option<Cut>,
    ) -> i32 {
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        for &(address, name) in kernel {
            stack.push(self.kernel_location(address, name));
        }
        for frame in user {
            stack.push(self.native_location(frame));
        }
        if cut.is_some() {
            stack.push(self.cut_location());
        }
        let stack_index = match self.stacks.index.get(&stack) {
            Some(&i) => i,
            None => {
                let (i, _) = self.stacks.intern(stack.clone());
                self.dict.stack_table.push(Stack {
                    location_indices: stack.clone(),
                });
                i
            }
        };
        self.scratch = stack;
        stack_index
    }

    /// A sample's attributes (thread name, the thread context's) and link.
    fn labels(
        &mut self,
        process: &ProcessInfo,
        thread_name: &str,
        trace: &TraceCtx,
    ) -> (Vec<i32>, i32) {
        let mut attributes = vec![self.attribute("thread.name", thread_name)];
        let link = match trace.ids() {
            Some((trace_id, span_id)) => {
                let (i, new) = self.links.intern((trace_id, span_id));
                if new {
                    self.dict.link_table.push(Link {
                        trace_id: trace_id.to_vec(),
                        span_id: span_id.to_vec(),
                    });
                }
                // The thread context's attributes, named by the process
                // context's key map.
                for (key, value) in trace.attributes() {
                    let name = match process.attribute_keys.get(key as usize) {
                        Some(name) if !name.is_empty() => name.clone(),
                        _ => format!("thread.context.attribute.{key}"),
                    };
                    attributes.push(self.attribute(&name, &value));
                }
                i
            }
            None => 0,
        };
        (attributes, link)
    }

    /// The export request of everything added, `None` when nothing was.
    pub fn finish(mut self, end_ns: u64) -> Option<ExportProfilesServiceRequest> {
        if self.samples == 0 {
            return None;
        }
        let mut value_type = |ty: &str, unit: &str| ValueType {
            type_strindex: self.string(ty),
            unit_strindex: self.string(unit),
        };
        let on_cpu = (
            value_type("samples", "count"),
            value_type("cpu", "nanoseconds"),
        );
        let off_cpu = value_type("off_cpu", "nanoseconds");
        let memory = [
            value_type("alloc_space", "bytes"),
            value_type("alloc_objects", "count"),
            value_type("inuse_space", "bytes"),
            value_type("inuse_objects", "count"),
        ];
        let (start_ns, period_ns) = (self.start_ns, self.period_ns);
        let duration_nano = end_ns.saturating_sub(start_ns);
        let mut processes: Vec<ProcessSamples> = self.processes.into_values().collect();
        processes.sort_unstable_by_key(|p| p.info.pid);
        let resource_profiles = processes
            .into_iter()
            .map(|p| {
                let mut profiles = Vec::new();
                if !p.samples.is_empty() {
                    let samples = p.samples.into_iter().map(|(key, mut timestamps)| {
                        timestamps.sort_unstable();
                        sample(key, timestamps, vec![])
                    });
                    profiles.push(Profile {
                        sample_type: Some(on_cpu.0),
                        period_type: Some(on_cpu.1),
                        period: period_ns,
                        time_unix_nano: start_ns,
                        duration_nano,
                        samples: sorted(samples),
                        ..Default::default()
                    });
                }
                if !p.waits.is_empty() {
                    let samples = p.waits.into_iter().map(|(key, mut waits)| {
                        waits.sort_unstable();
                        let (timestamps, values) = waits.into_iter().unzip();
                        sample(key, timestamps, values)
                    });
                    profiles.push(Profile {
                        sample_type: Some(off_cpu),
                        time_unix_nano: start_ns,
                        duration_nano,
                        samples: sorted(samples),
                        ..Default::default()
                    });
                }
                // Memory: one value per key, at one time: the latest
                // allocation's (allocated), the snapshot's (in use).
                for (events, types) in [(p.allocs, &memory[..2]), (p.inuse, &memory[2..])] {
                    if events.is_empty() {
                        continue;
                    }
                    let mut space = Vec::with_capacity(events.len());
                    let mut objects = Vec::with_capacity(events.len());
                    for (key, (t, bytes, n)) in events {
                        space.push(sample(key.clone(), vec![t], vec![bytes]));
                        objects.push(sample(key, vec![t], vec![n]));
                    }
                    for (&ty, samples) in types.iter().zip([space, objects]) {
                        profiles.push(Profile {
                            sample_type: Some(ty),
                            time_unix_nano: start_ns,
                            duration_nano,
                            samples: sorted(samples.into_iter()),
                            ..Default::default()
                        });
                    }
                }
                ResourceProfiles {
                    resource: Some(Resource {
                        attributes: resource_attributes(&p.info, &self.host_name),
                        ..Default::default()
                    }),
                    scope_profiles: vec![ScopeProfiles {
                        scope: Some(InstrumentationScope {
                            name: "symtrace-agent".to_owned(),
                            version: env!("CARGO_PKG_VERSION").to_owned(),
                            ..Default::default()
                        }),
                        profiles,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        Some(ExportProfilesServiceRequest {
            resource_profiles,
            dictionary: Some(self.dict),
        })
    }
}

fn sample(
    (stack_index, attribute_indices, link_index): SampleKey,
    timestamps_unix_nano: Vec<u64>,
    values: Vec<i64>,
) -> Sample {
    Sample {
        stack_index,
        attribute_indices,
        link_index,
        values,
        timestamps_unix_nano,
    }
}

/// Samples in a stable order (by identity).
fn sorted(samples: impl Iterator<Item = Sample>) -> Vec<Sample> {
    let mut samples: Vec<Sample> = samples.collect();
    samples.sort_unstable_by(|a, b| {
        (a.stack_index, &a.attribute_indices, a.link_index).cmp(&(
            b.stack_index,
            &b.attribute_indices,
            b.link_index,
        ))
    });
    samples
}

fn string_value(s: &str) -> AnyValue {
    AnyValue {
        value: Some(Value::StringValue(s.to_owned())),
    }
}

fn kv(key: &str, value: Value) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        ..Default::default()
    }
}

fn resource_attributes(p: &ProcessInfo, host_name: &str) -> Vec<KeyValue> {
    let mut attributes = vec![
        kv("service.name", Value::StringValue(p.service_name.clone())),
        kv("process.pid", Value::IntValue(p.pid.into())),
        kv(
            "process.executable.name",
            Value::StringValue(p.executable_name.clone()),
        ),
        kv("host.name", Value::StringValue(host_name.to_owned())),
    ];
    if let Some(path) = &p.executable_path {
        attributes.push(kv(
            "process.executable.path",
            Value::StringValue(path.clone()),
        ));
    }
    if let Some(id) = &p.container_id {
        attributes.push(kv("container.id", Value::StringValue(id.clone())));
    }
    for (k, v) in &p.resource {
        attributes.push(kv(k, Value::StringValue(v.clone())));
    }
    attributes
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;
