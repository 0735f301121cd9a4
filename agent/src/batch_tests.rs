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

/// The executable both tests sample: /usr/bin/checkout, build-ID abcd.
fn checkout_exe() -> Arc<process::Mapping> {
    Arc::new(process::Mapping {
        path: "/usr/bin/checkout".into(),
        build_id: Some("abcd".into()),
        htlhash: false,
        content_sha256: None,
        start: 0x1000,
        limit: 0x9000,
        file_offset: 0x1000,
        file: (0, 0),
    })
}

#[test]
fn aggregates_samples_and_keeps_frames_raw() {
    let p = process(7);
    let exe = checkout_exe();
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
        batch.add(
            &Observed {
                process: &p,
                thread_name: "worker",
                unix_ns: t,
                user: &user,
                cut: None,
                kernel,
                trace: &trace,
            },
            None,
        );
    }
    trace.valid = 1;
    trace.trace_id = [0xab; 16];
    trace.span_id = [0xcd; 8];
    trace.attrs[..7].copy_from_slice(b"\x00\x05/cart");
    trace.attrs_size = 7;
    batch.add(
        &Observed {
            process: &p,
            thread_name: "worker",
            unix_ns: 40,
            user: &user,
            cut: None,
            kernel: &[],
            trace: &trace,
        },
        None,
    );
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
    let vdso = Arc::new(process::Mapping {
        path: "[vdso]".into(),
        build_id: None,
        htlhash: false,
        content_sha256: None,
        start: 0,
        limit: 0x2000,
        file_offset: 0,
        file: (0, 0),
    });
    let user = [UserFrame {
        mapping: vdso,
        address: 0x9a0,
        name: Some(Arc::new(crate::jit::Symbol::named("clock_gettime"))),
    }];
    let mut batch = Batch::new(1_000, 97, "node-1");
    for cut in [None, Some(Cut::NotAfterCall), Some(Cut::OutsideCode)] {
        batch.add(
            &Observed {
                process: &p,
                thread_name: "worker",
                unix_ns: 10,
                user: &user,
                cut,
                kernel: &[],
                trace: &TraceCtx::default(),
            },
            None,
        );
    }
    let req = batch.finish(2_000).unwrap();
    let d = req.dictionary.as_ref().unwrap();
    let str_of = |i: i32| d.string_table[i as usize].as_str();
    let name =
        |l: &Location| str_of(d.function_table[l.lines[0].function_index as usize].name_strindex);
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

/// JIT frames go with their function, file, line and column, their
/// `profile.frame.type` and tier; one address that held two functions in
/// one batch (code freed and reused) is two locations.
#[test]
fn jit_frames_carry_their_names_types_and_tiers() {
    use crate::jit::{FrameKind, Symbol};
    let p = process(9);
    let anon = Arc::new(process::Mapping {
        path: String::new(),
        build_id: None,
        htlhash: false,
        content_sha256: None,
        start: 0x7f00_0000_0000,
        limit: 0x7f00_0010_0000,
        file_offset: 0,
        file: (0, 0),
    });
    let js = |function: &str, line| {
        Arc::new(Symbol {
            function: function.into(),
            system_name: Some(format!("JS:*{function} /srv/app.js:{line}:3").into()),
            file: Some(Arc::from("/srv/app.js")),
            line,
            column: 3,
            kind: FrameKind::V8js,
            tier: Some("turbofan"),
        })
    };
    let mut batch = Batch::new(1_000, 97, "node-1");
    for symbol in [js("innerLoop", 7), js("reused", 40)] {
        let user = [UserFrame {
            mapping: anon.clone(),
            address: 0x7f00_0000_1234,
            name: Some(symbol),
        }];
        batch.add(
            &Observed {
                process: &p,
                thread_name: "main",
                unix_ns: 10,
                user: &user,
                cut: None,
                kernel: &[],
                trace: &TraceCtx::default(),
            },
            None,
        );
    }
    let req = batch.finish(2_000).unwrap();
    let d = req.dictionary.as_ref().unwrap();
    let str_of = |i: i32| d.string_table[i as usize].as_str();
    let attr = |i: i32| {
        let a = &d.attribute_table[i as usize];
        let value = match &a.value {
            Some(AnyValue {
                value: Some(Value::StringValue(v)),
            }) => v.as_str(),
            _ => "",
        };
        (str_of(a.key_strindex), value)
    };
    assert_eq!(d.location_table.len(), 3, "zero and one per function");
    let l = &d.location_table[1];
    assert_eq!(l.address, 0x7f00_0000_1234);
    let f = &d.function_table[l.lines[0].function_index as usize];
    assert_eq!(str_of(f.name_strindex), "innerLoop");
    assert_eq!(
        str_of(f.system_name_strindex),
        "JS:*innerLoop /srv/app.js:7:3"
    );
    assert_eq!(str_of(f.filename_strindex), "/srv/app.js");
    assert_eq!((l.lines[0].line, l.lines[0].column), (7, 3));
    let attrs: Vec<(&str, &str)> = l.attribute_indices.iter().map(|&i| attr(i)).collect();
    assert_eq!(
        attrs,
        vec![
            ("profile.frame.type", "v8js"),
            ("symtrace.jit.tier", "turbofan")
        ]
    );
    let other = &d.location_table[2];
    let f = &d.function_table[other.lines[0].function_index as usize];
    assert_eq!(
        (str_of(f.name_strindex), other.lines[0].line),
        ("reused", 40)
    );
}

#[test]
fn waits_are_their_own_off_cpu_profile_beside_the_cpu_samples() {
    let p = process(7);
    let exe = checkout_exe();
    let user = [UserFrame {
        mapping: exe,
        address: 0x1234,
        name: None,
    }];
    let kernel = [(0xffff_ffff_8100_0010, Some("futex_wait"))];
    let trace = TraceCtx::default();
    let mut batch = Batch::new(1_000, 97, "node-1");
    let observed = |t| Observed {
        process: &p,
        thread_name: "worker",
        unix_ns: t,
        user: &user,
        cut: None,
        kernel: &kernel,
        trace: &trace,
    };
    batch.add(&observed(20), Some(30_000_000));
    batch.add(&observed(10), Some(10_000_000));
    batch.add(&observed(15), None);
    assert_eq!(batch.samples(), 3);
    let request = batch.finish(2_000).unwrap();
    let dict = request.dictionary.as_ref().unwrap();
    let name = |i: i32| dict.string_table[i as usize].as_str();
    let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
    assert_eq!(profiles.len(), 2);
    let (cpu, off) = (&profiles[0], &profiles[1]);
    let st = cpu.sample_type.unwrap();
    assert_eq!(
        (name(st.type_strindex), name(st.unit_strindex)),
        ("samples", "count")
    );
    assert_eq!(cpu.samples[0].timestamps_unix_nano, vec![15]);
    let st = off.sample_type.unwrap();
    assert_eq!(
        (name(st.type_strindex), name(st.unit_strindex)),
        ("off_cpu", "nanoseconds")
    );
    assert!(off.period_type.is_none());
    // One sample (same stack, thread, link), its waits in time order.
    assert_eq!(off.samples.len(), 1);
    assert_eq!(off.samples[0].timestamps_unix_nano, vec![10, 20]);
    assert_eq!(off.samples[0].values, vec![10_000_000, 30_000_000]);
    assert_eq!(off.samples[0].stack_index, cpu.samples[0].stack_index);
}

#[test]
fn memory_events_are_four_profiles_added_up_per_key() {
    use crate::batch::Memory;
    let p = process(7);
    let exe = checkout_exe();
    let user = [UserFrame {
        mapping: exe,
        address: 0x1234,
        name: None,
    }];
    let mut trace = TraceCtx::default();
    let mut batch = Batch::new(1_000, 97, "node-1");
    let stack = Arc::new(crate::memory::Stack {
        process: p.clone(),
        user: user.to_vec(),
        cut: None,
    });
    let site = |trace: &TraceCtx| {
        Arc::new(crate::memory::Site {
            stack: stack.clone(),
            thread_name: "worker".into(),
            trace: *trace,
        })
    };
    let add = |batch: &mut Batch, t: u64, site: &Arc<crate::memory::Site>, m: Memory| {
        batch.add_site(site, t, m)
    };
    let alloc = |bytes, objects| Memory::Alloc { bytes, objects };
    let plain = site(&trace);
    add(&mut batch, 20, &plain, alloc(524_288, 8192));
    // Another site of the same stack, thread and span: the same sample.
    add(&mut batch, 10, &site(&trace), alloc(524_288, 8192));
    trace.valid = 1;
    trace.trace_id = [1; 16];
    trace.span_id = [2; 8];
    let in_span = site(&trace);
    add(&mut batch, 15, &in_span, alloc(1 << 20, 1));
    add(
        &mut batch,
        30,
        &in_span,
        Memory::InUse {
            bytes: 1 << 20,
            objects: 1,
        },
    );
    assert_eq!(batch.samples(), 4);
    let request = batch.finish(2_000).unwrap();
    let dict = request.dictionary.as_ref().unwrap();
    let name = |i: i32| dict.string_table[i as usize].as_str();
    let profiles = &request.resource_profiles[0].scope_profiles[0].profiles;
    let types: Vec<(&str, &str)> = profiles
        .iter()
        .map(|p| {
            let st = p.sample_type.unwrap();
            (name(st.type_strindex), name(st.unit_strindex))
        })
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_space", "bytes"),
            ("alloc_objects", "count"),
            ("inuse_space", "bytes"),
            ("inuse_objects", "count")
        ]
    );
    // Allocated: one value per (stack, thread, span) over the interval, at
    // its latest allocation's time; the span's its own.
    let space = &profiles[0].samples;
    assert_eq!(space.len(), 2);
    let plain = space.iter().find(|s| s.link_index == 0).unwrap();
    assert_eq!(
        (plain.values.clone(), plain.timestamps_unix_nano.clone()),
        (vec![1 << 20], vec![20])
    );
    let in_span = space.iter().find(|s| s.link_index != 0).unwrap();
    assert_eq!(in_span.values, vec![1 << 20]);
    let objects = &profiles[1].samples;
    assert_eq!(objects.iter().map(|s| s.values[0]).sum::<i64>(), 16_385);
    assert_eq!(profiles[2].samples[0].values, vec![1 << 20]);
    assert_eq!(profiles[2].samples[0].timestamps_unix_nano, vec![30]);
    assert_eq!(profiles[3].samples[0].values, vec![1]);
    assert!(profiles.iter().all(|p| p.period_type.is_none()));
}

/// One sample of `process` at `unix_ns` on the stack `user`.
fn add_one(batch: &mut Batch, process: &Arc<ProcessInfo>, unix_ns: u64, user: &[UserFrame]) {
    batch.add(
        &Observed {
            process,
            thread_name: "main",
            unix_ns,
            user,
            cut: None,
            kernel: &[],
            trace: &TraceCtx::default(),
        },
        None,
    );
}

/// The value of `key` among a mapping's attributes.
fn mapping_attribute(
    d: &symtrace_proto::profiles::ProfilesDictionary,
    m: &Mapping,
    key: &str,
) -> Option<String> {
    m.attribute_indices.iter().find_map(|&i| {
        let kv = &d.attribute_table[i as usize];
        (d.string_table[kv.key_strindex as usize] == key).then(|| match &kv.value {
            Some(AnyValue {
                value: Some(Value::StringValue(s)),
            }) => s.clone(),
            other => panic!("{other:?}"),
        })
    })
}

#[test]
fn hashes_known_later_go_to_the_mappings_of_that_very_file() {
    // Two files at one path with one build-ID (a genuine library and a
    // forged one in another container), both sampled before their hashes
    // were known; memory that is no file beside them.
    let file = |inode| {
        Arc::new(process::Mapping {
            file: (8, inode),
            ..Arc::unwrap_or_clone(checkout_exe())
        })
    };
    let (genuine, forged) = (file(100), file(200));
    let anon = Arc::new(process::Mapping {
        path: "[anon]".into(),
        ..Arc::unwrap_or_clone(checkout_exe())
    });
    let p = process(7);
    let mut batch = Batch::new(0, 97, "h");
    for (t, m) in [(1, &genuine), (2, &forged), (3, &anon)] {
        let frame = UserFrame {
            mapping: m.clone(),
            address: 0x1234,
            name: None,
        };
        add_one(&mut batch, &p, t, &[frame]);
    }
    // Held while a file's hash is under way, by that file's identity;
    // never for what is no file.
    let mut asked = Vec::new();
    assert!(batch.awaits_contents(|file| {
        asked.push(file);
        file == (8, 200)
    }));
    assert!(!asked.contains(&(0, 0)), "{asked:?}");
    assert!(!batch.awaits_contents(|file| file == (8, 300)));
    let mut asked = Vec::new();
    batch.settle_contents(|file| {
        asked.push(file);
        (file == (8, 100)).then(|| "ab".repeat(32))
    });
    asked.sort_unstable();
    // Asked by file identity, and only for files.
    assert_eq!(asked, [(8, 100), (8, 200)]);
    let req = batch.finish(10).unwrap();
    let d = req.dictionary.as_ref().unwrap();
    let profile = &req.resource_profiles[0].scope_profiles[0].profiles[0];
    let content_at = |t: u64| {
        let s = profile
            .samples
            .iter()
            .find(|s| s.timestamps_unix_nano == [t])
            .unwrap();
        let stack = &d.stack_table[s.stack_index as usize].location_indices;
        let location = &d.location_table[stack[0] as usize];
        let m = &d.mapping_table[location.mapping_index as usize];
        mapping_attribute(d, m, symtrace_proto::FILE_SHA256)
    };
    assert_eq!(content_at(1), Some("ab".repeat(32)));
    assert_eq!(content_at(2), None, "the forged file's mapping");
    assert_eq!(content_at(3), None);
}

#[test]
fn samples_under_a_provisional_identity_go_to_the_known_one() {
    let provisional = Arc::new(ProcessInfo {
        pid: 7,
        service_name: "unknown_service:checkout".into(),
        executable_name: "checkout".into(),
        ..Default::default()
    });
    let known = process(7);
    let exe = checkout_exe();
    let frame = |address| UserFrame {
        mapping: exe.clone(),
        address,
        name: None,
    };
    let mut batch = Batch::new(0, 97, "h");
    add_one(&mut batch, &provisional, 1, &[frame(0x1234)]);
    add_one(&mut batch, &provisional, 2, &[frame(0x2345)]);
    // Known already too (a sample taken after the answer came).
    add_one(&mut batch, &known, 3, &[frame(0x1234)]);
    batch.identify(&provisional, &known);
    // Nothing under an identity no sample has.
    batch.identify(&process(8), &process(9));
    assert_eq!(batch.samples(), 3);
    let req = batch.finish(10).unwrap();
    assert_eq!(req.resource_profiles.len(), 1, "one process, one resource");
    let rp = &req.resource_profiles[0];
    let service = rp
        .resource
        .as_ref()
        .unwrap()
        .attributes
        .iter()
        .find(|kv| kv.key == "service.name")
        .unwrap();
    assert_eq!(
        service.value.as_ref().unwrap().value,
        Some(Value::StringValue("checkout".into()))
    );
    let profile = &rp.scope_profiles[0].profiles[0];
    let mut times: Vec<u64> = profile
        .samples
        .iter()
        .flat_map(|s| s.timestamps_unix_nano.clone())
        .collect();
    times.sort_unstable();
    assert_eq!(times, [1, 2, 3], "merged with the known identity's samples");
    let at_1234 = profile
        .samples
        .iter()
        .filter(|s| s.timestamps_unix_nano.len() == 2)
        .count();
    assert_eq!(at_1234, 1, "one stack, one sample of two timestamps");
}
