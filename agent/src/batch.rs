//! One export interval's samples, built into an OTLP profiles v1.11 request:
//! one resource per process (service, pid, executable, container, host), one
//! `samples/count` profile per resource with period `cpu/nanoseconds`, every
//! sample with its timestamps. Native frames are left unsymbolized (an
//! address and a mapping carrying `process.executable.build_id.gnu`); kernel
//! frames are named. Samples with the same stack, thread and trace link share one
//! `Sample` with one timestamp per occurrence.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use symtrace_proto::collector::ExportProfilesServiceRequest;
use symtrace_proto::common::{any_value::Value, AnyValue, InstrumentationScope, KeyValue};
use symtrace_proto::profiles::{
    Function, KeyValueAndUnit, Line, Link, Location, Mapping, Profile, ProfilesDictionary,
    ResourceProfiles, Sample, ScopeProfiles, Stack, ValueType,
};
use symtrace_proto::resource::Resource;

use crate::procs::{self, ProcessInfo, UserFrame};
use crate::record::TraceCtx;
use crate::unwind::Cut;

/// Index tables with 0 as the required zero value.
struct Table<K> {
    index: HashMap<K, i32>,
    len: i32,
}

impl<K: Hash + Eq> Table<K> {
    fn new() -> Self {
        Self {
            index: HashMap::new(),
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

struct ProcessSamples {
    info: Arc<ProcessInfo>,
    /// (stack, attributes, link) → timestamps.
    samples: HashMap<(i32, Vec<i32>, i32), Vec<u64>>,
}

pub struct Batch {
    dict: ProfilesDictionary,
    strings: Table<String>,
    mappings: Table<Arc<procs::Mapping>>,
    locations: Table<(i32, u64)>,
    functions: Table<i32>,
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
            processes: HashMap::new(),
            kernel_mapping: 0,
            native: 0,
            kernel: 0,
            cut_marker: 0,
            samples: 0,
            start_ns,
            period_ns: (1_000_000_000 / frequency_hz.max(1)) as i64,
            host_name: host_name.to_owned(),
            scratch: Vec::new(),
        };
        batch.native = batch.attribute("profile.frame.type", "native");
        batch.kernel = batch.attribute("profile.frame.type", "kernel");
        batch.kernel_mapping = batch.mapping(&Arc::new(procs::Mapping {
            path: "[kernel.kallsyms]".to_owned(),
            build_id: None,
            start: 0,
            limit: u64::MAX,
            file_offset: 0,
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

    fn mapping(&mut self, m: &Arc<procs::Mapping>) -> i32 {
        let (i, new) = self.mappings.intern(m.clone());
        if new {
            let attribute_indices = match &m.build_id {
                Some(id) => vec![self.attribute("process.executable.build_id.gnu", id)],
                None => vec![],
            };
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
        let (i, new) = self.locations.intern((mapping, frame.address));
        if new {
            // Named by the agent (the vDSO): sent as a line, as the kernel's.
            let lines = match &frame.name {
                Some(name) => vec![self.line(name)],
                None => vec![],
            };
            self.dict.location_table.push(Location {
                mapping_index: mapping,
                address: frame.address,
                lines,
                attribute_indices: vec![self.native],
            });
        }
        i
    }

    fn line(&mut self, name: &str) -> Line {
        let name = self.string(name);
        let (f, new) = self.functions.intern(name);
        if new {
            self.dict.function_table.push(Function {
                name_strindex: name,
                system_name_strindex: name,
                ..Default::default()
            });
        }
        Line {
            function_index: f,
            ..Default::default()
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
        let (i, new) = self.locations.intern((self.kernel_mapping, address));
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

    /// Adds one sample. The stack is kernel frames (leaf first) then user
    /// frames, as one leaf-first location list.
    pub fn add(&mut self, s: &Observed<'_>) {
        let mut stack = std::mem::take(&mut self.scratch);
        stack.clear();
        for &(address, name) in s.kernel {
            stack.push(self.kernel_location(address, name));
        }
        for frame in s.user {
            stack.push(self.native_location(frame));
        }
        if s.cut.is_some() {
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
        let mut attributes = vec![self.attribute("thread.name", s.thread_name)];
        let link = match s.trace.ids() {
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
                for (key, value) in s.trace.attributes() {
                    let name = match s.process.attribute_keys.get(key as usize) {
                        Some(name) if !name.is_empty() => name.clone(),
                        _ => format!("thread.context.attribute.{key}"),
                    };
                    attributes.push(self.attribute(&name, &value));
                }
                i
            }
            None => 0,
        };
        self.processes
            .entry(Arc::as_ptr(s.process) as usize)
            .or_insert_with(|| ProcessSamples {
                info: s.process.clone(),
                samples: HashMap::new(),
            })
            .samples
            .entry((stack_index, attributes, link))
            .or_default()
            .push(s.unix_ns);
        self.samples += 1;
    }

    /// The export request of everything added, `None` when nothing was.
    pub fn finish(mut self, end_ns: u64) -> Option<ExportProfilesServiceRequest> {
        if self.samples == 0 {
            return None;
        }
        let sample_type = ValueType {
            type_strindex: self.string("samples"),
            unit_strindex: self.string("count"),
        };
        let period_type = ValueType {
            type_strindex: self.string("cpu"),
            unit_strindex: self.string("nanoseconds"),
        };
        let mut processes: Vec<ProcessSamples> = self.processes.into_values().collect();
        processes.sort_unstable_by_key(|p| p.info.pid);
        let resource_profiles = processes
            .into_iter()
            .map(|p| {
                let mut samples: Vec<Sample> = p
                    .samples
                    .into_iter()
                    .map(
                        |((stack_index, attribute_indices, link_index), mut timestamps)| {
                            timestamps.sort_unstable();
                            Sample {
                                stack_index,
                                attribute_indices,
                                link_index,
                                values: vec![],
                                timestamps_unix_nano: timestamps,
                            }
                        },
                    )
                    .collect();
                samples.sort_unstable_by(|a, b| {
                    (a.stack_index, &a.attribute_indices, a.link_index).cmp(&(
                        b.stack_index,
                        &b.attribute_indices,
                        b.link_index,
                    ))
                });
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
                        profiles: vec![Profile {
                            sample_type: Some(sample_type),
                            period_type: Some(period_type),
                            period: self.period_ns,
                            time_unix_nano: self.start_ns,
                            duration_nano: end_ns.saturating_sub(self.start_ns),
                            samples,
                            ..Default::default()
                        }],
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
mod tests {
    use super::*;

    fn process(pid: u32) -> Arc<ProcessInfo> {
        Arc::new(ProcessInfo {
            pid,
            service_name: "checkout".into(),
            executable_name: "checkout".into(),
            executable_path: Some("/usr/bin/checkout".into()),
            container_id: None,
            resource: vec![("deployment.environment".into(), "prod".into())],
            attribute_keys: vec!["http.route".into()],
        })
    }

    #[test]
    fn aggregates_samples_and_keeps_frames_raw() {
        let p = process(7);
        let exe = Arc::new(procs::Mapping {
            path: "/usr/bin/checkout".into(),
            build_id: Some("abcd".into()),
            start: 0x1000,
            limit: 0x9000,
            file_offset: 0x1000,
        });
        let frame = |address| UserFrame {
            mapping: exe.clone(),
            address,
            name: None,
        };
        let user = [frame(0x1234), frame(0x2345)];
        let kernel = [
            (0xffff_ffff_8100_0010, Some("do_syscall_64")),
            (0xffff_ffff_8100_0020, None),
        ];
        let mut trace = TraceCtx::default();
        let mut batch = Batch::new(1_000, 97, "node-1");
        for (t, kernel) in [(10, &kernel[..]), (20, &kernel[..]), (30, &[][..])] {
            batch.add(&Observed {
                process: &p,
                thread_name: "worker",
                unix_ns: t,
                user: &user,
                cut: None,
                kernel,
                trace: &trace,
            });
        }
        trace.valid = 1;
        trace.trace_id = [0xab; 16];
        trace.span_id = [0xcd; 8];
        trace.attrs[..7].copy_from_slice(b"\x00\x05/cart");
        trace.attrs_size = 7;
        batch.add(&Observed {
            process: &p,
            thread_name: "worker",
            unix_ns: 40,
            user: &user,
            cut: None,
            kernel: &[],
            trace: &trace,
        });
        assert_eq!(batch.samples(), 4);
        let req = batch.finish(2_000).unwrap();
        let d = req.dictionary.as_ref().unwrap();
        let str_of = |i: i32| d.string_table[i as usize].as_str();
        assert_eq!(req.resource_profiles.len(), 1);
        let rp = &req.resource_profiles[0];
        let attrs: Vec<_> = rp
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| kv.key.as_str())
            .collect();
        assert!(attrs.contains(&"service.name") && attrs.contains(&"host.name"));
        let profile = &rp.scope_profiles[0].profiles[0];
        assert_eq!(profile.period, 1_000_000_000 / 97);
        assert_eq!(
            str_of(profile.sample_type.unwrap().type_strindex),
            "samples"
        );
        assert_eq!(
            str_of(profile.period_type.unwrap().unit_strindex),
            "nanoseconds"
        );
        assert_eq!(profile.duration_nano, 1_000);
        // Same stack + thread + no link: one Sample with two timestamps.
        let timestamps: Vec<_> = profile
            .samples
            .iter()
            .map(|s| s.timestamps_unix_nano.clone())
            .collect();
        assert!(timestamps.contains(&vec![10, 20]));
        assert_eq!(profile.samples.len(), 3);
        let linked = profile.samples.iter().find(|s| s.link_index != 0).unwrap();
        assert_eq!(
            d.link_table[linked.link_index as usize].trace_id,
            vec![0xab; 16]
        );
        let route = &d.attribute_table[linked.attribute_indices[1] as usize];
        assert_eq!(str_of(route.key_strindex), "http.route");
        assert!(attrs.contains(&"deployment.environment"));
        // Kernel frame named, user frames raw with the build-ID on the mapping.
        let with_kernel = profile
            .samples
            .iter()
            .find(|s| s.timestamps_unix_nano == [10, 20])
            .unwrap();
        let stack = &d.stack_table[with_kernel.stack_index as usize].location_indices;
        assert_eq!(stack.len(), 4);
        let leaf = &d.location_table[stack[0] as usize];
        let f = &d.function_table[leaf.lines[0].function_index as usize];
        assert_eq!(str_of(f.name_strindex), "do_syscall_64");
        assert!(d.location_table[stack[1] as usize].lines.is_empty());
        let native = &d.location_table[stack[2] as usize];
        assert_eq!(native.address, 0x1234);
        assert!(native.lines.is_empty());
        let mapping = &d.mapping_table[native.mapping_index as usize];
        assert_eq!(str_of(mapping.filename_strindex), "/usr/bin/checkout");
        let kernel_mapping = &d.mapping_table[leaf.mapping_index as usize];
        assert_eq!(
            str_of(kernel_mapping.filename_strindex),
            "[kernel.kallsyms]"
        );
        let build_id = &d.attribute_table[mapping.attribute_indices[0] as usize];
        assert_eq!(
            str_of(build_id.key_strindex),
            "process.executable.build_id.gnu"
        );
        assert_eq!(
            (mapping.memory_start, mapping.memory_limit),
            (0x1000, 0x9000)
        );
        assert!(Batch::new(0, 19, "h").finish(1).is_none());
    }

    #[test]
    fn names_vdso_frames_and_marks_cut_stacks() {
        let p = process(8);
        let vdso = Arc::new(procs::Mapping {
            path: "[vdso]".into(),
            build_id: None,
            start: 0,
            limit: 0x2000,
            file_offset: 0,
        });
        let user = [UserFrame {
            mapping: vdso,
            address: 0x9a0,
            name: Some(Arc::from("clock_gettime")),
        }];
        let mut batch = Batch::new(1_000, 97, "node-1");
        for cut in [None, Some(Cut::NotAfterCall), Some(Cut::OutsideCode)] {
            batch.add(&Observed {
                process: &p,
                thread_name: "worker",
                unix_ns: 10,
                user: &user,
                cut,
                kernel: &[],
                trace: &TraceCtx::default(),
            });
        }
        let req = batch.finish(2_000).unwrap();
        let d = req.dictionary.as_ref().unwrap();
        let str_of = |i: i32| d.string_table[i as usize].as_str();
        let name = |l: &Location| {
            str_of(d.function_table[l.lines[0].function_index as usize].name_strindex)
        };
        let samples = &req.resource_profiles[0].scope_profiles[0].profiles[0].samples;
        // Every cause gives the same marker: two stacks, not three.
        assert_eq!(samples.len(), 2);
        let cut = samples
            .iter()
            .map(|s| &d.stack_table[s.stack_index as usize].location_indices)
            .find(|s| s.len() == 2)
            .unwrap();
        assert_eq!(
            samples
                .iter()
                .map(|s| s.timestamps_unix_nano.len())
                .sum::<usize>(),
            3
        );
        let leaf = &d.location_table[cut[0] as usize];
        assert_eq!(name(leaf), "clock_gettime");
        let marker = &d.location_table[cut[1] as usize];
        assert_eq!(name(marker), Cut::MARKER);
        assert_eq!(marker.mapping_index, 0);
        let kind = &d.attribute_table[marker.attribute_indices[0] as usize];
        assert_eq!(str_of(kind.key_strindex), "profile.frame.type");
        assert!(
            matches!(&kind.value, Some(AnyValue { value: Some(Value::StringValue(v)) }) if v == "truncated")
        );
        // The location table's indices stay dense.
        assert!(d.location_table.len() == 3, "zero, vdso frame, marker");
    }
}
