#!/usr/bin/env python3
"""An independent OTLP profiles client for symtrace's tests.

Built only on PyPI's opentelemetry-proto (>= 1.43, the v1.10+ wire layout)
and grpcio: nothing here comes from symtrace's own code. It builds profiles
shaped like the OpenTelemetry eBPF profiler's (native frames unsymbolized,
with mappings carrying GNU build-IDs and htlhash file IDs; kernel and
interpreter frames named; `samples/count` with a `cpu/nanoseconds` period;
timestamps-only samples with thread attributes; trace links), and

  roundtrip  sends them over gRPC (gzip), OTLP/HTTP protobuf (gzip) and
             OTLP/JSON, one tenant each, then reads every tenant back from
             /api/v1/profiles/samples and checks it holds exactly what was
             sent, event for event;
  loop       exports small profiles until killed, printing the ID of each
             export the server acknowledged (the durability test);
  collector  sends profiles to an OpenTelemetry Collector (--collector-grpc,
             --collector-http: its OTLP receiver) and the same ones straight
             to symtrace (--grpc, tenant `direct`), then reads back each
             tenant the Collector exports to (--tenants) until it holds
             exactly what was sent, event for event;
  send       sends --requests seeded requests (at --now) into a Collector's
             gRPC receiver and fails unless each was acknowledged;
  expect     waits until every tenant of --tenants holds exactly what
             `send` sent with the same --now and --requests (the Collector
             crash test);
  stacks     sends the stacks a JSON spec describes (--spec FILE): native
             frames of one binary as raw addresses, kernel frames by name,
             each stack with a count of timestamped samples and an optional
             trace link (the query tests).
"""

import argparse
import base64
import gzip
import json
import random
import sys
import time
import urllib.error
import urllib.request
from collections import Counter, defaultdict

import grpc
from google.protobuf import json_format
from opentelemetry.proto.collector.profiles.v1development import (
    profiles_service_pb2 as svc,
    profiles_service_pb2_grpc as svc_grpc,
)
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.profiles.v1development import profiles_pb2 as pb


class Dictionary:
    """The request-wide tables, with index 0 the zero value of each."""

    def __init__(self):
        self.d = pb.ProfilesDictionary()
        self.strings = {}
        self.string("")
        self.d.mapping_table.add()
        self.d.location_table.add()
        self.d.function_table.add()
        self.d.link_table.add(trace_id=bytes(16), span_id=bytes(8))
        self.d.attribute_table.add()
        self.d.stack_table.add()
        self.attrs = {}

    def string(self, s):
        if s not in self.strings:
            self.strings[s] = len(self.d.string_table)
            self.d.string_table.append(s)
        return self.strings[s]

    def attr(self, key, value):
        k = (key, value)
        if k not in self.attrs:
            a = self.d.attribute_table.add(key_strindex=self.string(key))
            if isinstance(value, int):
                a.value.int_value = value
            else:
                a.value.string_value = value
            self.attrs[k] = len(self.d.attribute_table) - 1
        return self.attrs[k]


def build(seed, now_ns, processes=3, stacks_per_process=40, samples_per_process=150):
    """Returns (request, expected) where expected maps an identity to a
    Counter of (timestamp, value) events."""
    rnd = random.Random(seed)
    dic = Dictionary()
    request = svc.ExportProfilesServiceRequest()
    expected = defaultdict(Counter)
    kernel_names = ["do_syscall_64", "entry_SYSCALL_64", "__x64_sys_read", "vfs_read", "schedule"]
    py_names = [("handle_request", "app/server.py"), ("render", "app/views.py")]
    for p in range(processes):
        service = f"svc-{seed}-{p}"
        rp = request.resource_profiles.add()
        # v1.10 string references for one resource attribute.
        kv = rp.resource.attributes.add(key_strindex=dic.string("host.name"))
        kv.value.string_value_strindex = dic.string(f"host-{p}")
        rp.resource.attributes.add(key="service.name").value.string_value = service
        rp.resource.attributes.add(key="process.pid").value.int_value = 1000 + p
        sp = rp.scope_profiles.add()
        sp.scope.name = "otlp_client.py"
        prof = sp.profiles.add()
        prof.sample_type.type_strindex = dic.string("samples")
        prof.sample_type.unit_strindex = dic.string("count")
        prof.period_type.type_strindex = dic.string("cpu")
        prof.period_type.unit_strindex = dic.string("nanoseconds")
        prof.period = 52_631_578  # 19 Hz
        prof.time_unix_nano = now_ns - 10_000_000_000
        prof.duration_nano = 10_000_000_000

        # Two mappings: the executable (GNU build-ID) and a library (htlhash only).
        exe_build_id = f"{rnd.getrandbits(160):040x}"
        mappings = []
        for name, attr in [(f"/usr/bin/{service}", ("process.executable.build_id.gnu", exe_build_id)),
                           ("/usr/lib/libfoo.so", ("process.executable.build_id.htlhash", f"{rnd.getrandbits(128):032x}"))]:
            m = dic.d.mapping_table.add(memory_start=0x1000, memory_limit=0x400000, file_offset=0,
                                        filename_strindex=dic.string(name))
            m.attribute_indices.append(dic.attr(*attr))
            mappings.append((len(dic.d.mapping_table) - 1, attr[1]))

        def native():
            mi, build_id = rnd.choice(mappings)
            addr = rnd.randrange(0x1000, 0x400000)
            loc = dic.d.location_table.add(mapping_index=mi, address=addr)
            loc.attribute_indices.append(dic.attr("profile.frame.type", "native"))
            return len(dic.d.location_table) - 1, f"native {build_id} {addr:#x}"

        def named(kind, name, filename, line):
            f = dic.d.function_table.add(name_strindex=dic.string(name), system_name_strindex=dic.string(name),
                                         filename_strindex=dic.string(filename))
            loc = dic.d.location_table.add()
            loc.lines.add(function_index=len(dic.d.function_table) - 1, line=line)
            loc.attribute_indices.append(dic.attr("profile.frame.type", kind))
            return len(dic.d.location_table) - 1, f"{kind} {name}@{filename}:{line}"

        stacks = []
        for _ in range(stacks_per_process):
            frames = [native() for _ in range(rnd.randint(3, 25))]
            if rnd.random() < 0.3:
                frames = [named("kernel", n, "", 0) for n in rnd.sample(kernel_names, 2)] + frames
            if rnd.random() < 0.2:
                frames = [named("cpython", n, f, rnd.randint(1, 300)) for n, f in py_names] + frames
            st = dic.d.stack_table.add()
            st.location_indices.extend(i for i, _ in frames)
            stacks.append((len(dic.d.stack_table) - 1, tuple(desc for _, desc in frames)))

        for _ in range(samples_per_process):
            stack_index, stack_desc = rnd.choice(stacks)
            s = prof.samples.add(stack_index=stack_index)
            tid = rnd.randint(1, 4)
            s.attribute_indices.extend([dic.attr("thread.name", f"worker-{tid}"), dic.attr("thread.id", 2000 + tid)])
            link = ("", "")
            if rnd.random() < 0.2:
                trace_id, span_id = rnd.randbytes(16), rnd.randbytes(8)
                dic.d.link_table.add(trace_id=trace_id, span_id=span_id)
                s.link_index = len(dic.d.link_table) - 1
                link = (trace_id.hex(), span_id.hex())
            k = rnd.randint(1, 5)
            stamps = sorted(prof.time_unix_nano + rnd.randrange(10_000_000_000) for _ in range(k))
            s.timestamps_unix_nano.extend(stamps)
            labels = (("thread.id", str(2000 + tid)), ("thread.name", f"worker-{tid}"))
            key = (service, "samples:count:cpu:nanoseconds", labels, stack_desc, link)
            for t in stamps:
                expected[key][(t, 1)] += 1

        # An off-CPU profile of the same process: values with timestamps.
        off = sp.profiles.add()
        off.sample_type.type_strindex = dic.string("off_cpu")
        off.sample_type.unit_strindex = dic.string("nanoseconds")
        off.time_unix_nano = now_ns - 10_000_000_000
        off.duration_nano = 10_000_000_000
        for _ in range(20):
            stack_index, stack_desc = rnd.choice(stacks)
            s = off.samples.add(stack_index=stack_index)
            t = off.time_unix_nano + rnd.randrange(10_000_000_000)
            v = rnd.randint(1000, 10_000_000)
            s.timestamps_unix_nano.append(t)
            s.values.append(v)
            expected[(service, "off_cpu:nanoseconds::", (), stack_desc, ("", ""))][(t, v)] += 1
    request.dictionary.CopyFrom(dic.d)
    return request, expected


def canonical_from_server(dump):
    got = defaultdict(Counter)
    for s in dump["samples"]:
        frames = []
        for f in s["stack"]:
            if f["lines"]:
                frames.append(f"{f['type']} " + ";".join(f"{l['function']}@{l['file']}:{l['line']}" for l in f["lines"]))
            else:
                frames.append(f"{f['type']} {f['mapping']['build_id']} {f['address']}")
        labels = tuple(sorted(s["labels"].items()))
        key = (s["service"], s["profile_type"], labels, tuple(frames), (s.get("trace_id", ""), s.get("span_id", "")))
        values = s["values"] or [1] * len(s["timestamps"])
        for t, v in zip(s["timestamps"], values):
            got[key][(int(t), v)] += 1
    return got


def to_otlp_json(request):
    """OTLP/JSON: protobuf JSON, except trace and span IDs are hex."""
    doc = json.loads(json_format.MessageToJson(request))
    for link in doc.get("dictionary", {}).get("linkTable", []):
        for k in ("traceId", "spanId"):
            if k in link:
                link[k] = base64.b64decode(link[k]).hex()
    return json.dumps(doc).encode()


def http_post(url, body, content_type, tenant, gzip_it, token=None):
    headers = {"Content-Type": content_type, "X-Scope-OrgID": tenant}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    if gzip_it:
        body = gzip.compress(body)
        headers["Content-Encoding"] = "gzip"
    req = urllib.request.Request(url, data=body, headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        return r.status, r.headers.get("Content-Type"), r.read()


def send(transport, request, args, tenant, token=None):
    if transport == "grpc":
        metadata = [("x-scope-orgid", tenant)]
        if token:
            metadata.append(("authorization", f"Bearer {token}"))
        with grpc.insecure_channel(args.grpc) as channel:
            stub = svc_grpc.ProfilesServiceStub(channel)
            response = stub.Export(request, metadata=metadata,
                                   compression=grpc.Compression.Gzip, timeout=30)
        return response.partial_success.rejected_profiles, response.partial_success.error_message
    url = args.http.rstrip("/") + "/v1development/profiles"
    if transport == "http-protobuf":
        status, ctype, body = http_post(url, request.SerializeToString(), "application/x-protobuf", tenant, True, token)
        assert status == 200 and ctype == "application/x-protobuf", (status, ctype)
        response = svc.ExportProfilesServiceResponse.FromString(body)
        return response.partial_success.rejected_profiles, response.partial_success.error_message
    status, ctype, body = http_post(url, to_otlp_json(request), "application/json", tenant, False, token)
    assert status == 200 and ctype == "application/json", (status, ctype)
    response = json_format.Parse(body, svc.ExportProfilesServiceResponse())
    return response.partial_success.rejected_profiles, response.partial_success.error_message


def dump(args, tenant, query=""):
    req = urllib.request.Request(args.http.rstrip("/") + "/api/v1/profiles/samples" + query,
                                 headers={"X-Scope-OrgID": tenant})
    with urllib.request.urlopen(req, timeout=60) as r:
        return json.loads(r.read())


def roundtrip(args):
    now = time.time_ns()
    failures = 0
    for i, transport in enumerate(["grpc", "http-protobuf", "http-json"]):
        tenant = f"{args.tenant_prefix}{transport}"
        request, expected = build(seed=100 + i, now_ns=now)
        rejected, message = send(transport, request, args, tenant)
        if rejected:
            print(f"{transport}: server rejected {rejected}: {message}")
            failures += 1
            continue
        got = canonical_from_server(dump(args, tenant))
        events = sum(sum(c.values()) for c in expected.values())
        if got != expected:
            failures += 1
            missing = [k for k in expected if got.get(k) != expected[k]]
            extra = [k for k in got if k not in expected]
            print(f"{transport}: MISMATCH: {len(missing)} identities differ, {len(extra)} unexpected")
            for k in (missing + extra)[:3]:
                print("  sent", dict(expected.get(k, {})), "\n  got ", dict(got.get(k, {})), "\n  key ", k)
            continue
        # A trace's samples, found through the trace index.
        traces = sorted({k[4][0] for k in expected if k[4][0]})
        for trace_id in traces[:5]:
            want = {k: v for k, v in expected.items() if k[4][0] == trace_id}
            got = canonical_from_server(dump(args, tenant, f"?trace_id={trace_id}"))
            if got != want:
                failures += 1
                print(f"{transport}: trace {trace_id}: sent {len(want)} identities, got {len(got)}")
        print(f"{transport}: ok: {len(expected)} sample identities, {events} events, "
              f"{len(traces)} traces, tenant {tenant}")
    return 1 if failures else 0


def collector(args):
    """Through a Collector: one request into its gRPC receiver, another
    into its OTLP/HTTP one; both straight to symtrace too (tenant
    `direct`). Every tenant the Collector exports to must end up holding
    exactly what `direct` holds."""
    now = time.time_ns()
    sent = defaultdict(Counter)
    via = argparse.Namespace(**vars(args))
    via.grpc, via.http = args.collector_grpc, args.collector_http
    for i, transport in enumerate(["grpc", "http-protobuf"]):
        request, expected = build(seed=300 + i, now_ns=now)
        for k, v in expected.items():
            sent[k].update(v)
        rejected, message = send("grpc", request, args, "direct")
        if rejected:
            print(f"direct: server rejected {rejected}: {message}")
            return 1
        rejected, message = send(transport, request, via, "ignored-by-the-collector")
        if rejected:
            print(f"collector {transport}: rejected {rejected}: {message}")
            return 1
    events = sum(sum(c.values()) for c in sent.values())
    direct = canonical_from_server(dump(args, "direct"))
    if direct != sent:
        print(f"direct: MISMATCH ({len(direct)} identities, {len(sent)} sent)")
        return 1
    return wait_for_tenants(args, sent, f"{events} events, as sent directly")


def wait_for_tenants(args, sent, what):
    """Waits (--timeout) until every tenant of --tenants holds exactly
    `sent`; prints `TENANT: ok` or what differs, per tenant."""
    failures = 0
    for tenant in args.tenants.split(","):
        deadline = time.time() + args.timeout
        while True:
            try:
                got = canonical_from_server(dump(args, tenant))
            except (urllib.error.URLError, ConnectionError):  # the server is starting
                got = None
            if got == sent or time.time() > deadline:
                break
            time.sleep(0.2)
        if got != sent:
            failures += 1
            got = got or {}
            missing = [k for k in sent if got.get(k) != sent[k]]
            extra = [k for k in got if k not in sent]
            print(f"{tenant}: MISMATCH: {len(missing)} of {len(sent)} identities differ, "
                  f"{len(extra)} unexpected")
            for k in (missing + extra)[:3]:
                print("  sent", dict(sent.get(k, {})), "\n  got ", dict(got.get(k, {})), "\n  key ", k)
            continue
        print(f"{tenant}: ok: {len(sent)} sample identities, {what}")
    return 1 if failures else 0


def crash_requests(args):
    """The requests of `send` and `expect` (seeded, at --now)."""
    return [build(seed=500 + i, now_ns=args.now) for i in range(args.requests)]


def send_only(args):
    """Sends --requests requests into the Collector's gRPC receiver
    (--collector-grpc); fails unless it acknowledged each."""
    via = argparse.Namespace(**vars(args))
    via.grpc = args.collector_grpc
    for i, (request, _) in enumerate(crash_requests(args)):
        rejected, message = send("grpc", request, via, "ignored-by-the-collector")
        if rejected:
            print(f"request {i}: rejected {rejected}: {message}")
            return 1
    print(f"acknowledged {args.requests} requests", flush=True)
    return 0


def expect(args):
    """Waits until every tenant of --tenants holds exactly what `send`
    sent with the same --now and --requests."""
    sent = defaultdict(Counter)
    for _, expected in crash_requests(args):
        for k, v in expected.items():
            sent[k].update(v)
    events = sum(sum(c.values()) for c in sent.values())
    return wait_for_tenants(args, sent, f"{events} events, as sent")


def loop(args):
    """Exports until killed; prints `acked <export-id> <events>` per
    acknowledged export, flushing each line."""
    n = 0
    while True:
        n += 1
        request, expected = build(seed=10_000 + n, now_ns=time.time_ns(), processes=1,
                                  stacks_per_process=5, samples_per_process=10)
        # The export ID travels as a resource attribute of every profile.
        for rp in request.resource_profiles:
            rp.resource.attributes.add(key="export.id").value.string_value = str(n)
        events = sum(sum(c.values()) for c in expected.values())
        try:
            rejected, _ = send(args.transport, request, args, args.tenant_prefix + "loop")
        except Exception as e:  # server down: not acknowledged
            print(f"failed {n} {type(e).__name__}", flush=True)
            time.sleep(0.05)
            continue
        if rejected == 0:
            print(f"acked {n} {events}", flush=True)


def stacks(args):
    """Spec: {"service", "token"?: a bearer token, "binary": {"path", "build_id", "id_kind"?: "gnu"
    (default), "htlhash" or "go", "content_sha256"?: the file's SHA-256
    (symtrace.file.sha256, as symtrace-agent sends it)}, "period",
    "type"?: "off_cpu" or "TYPE:UNIT" (alloc_space:bytes, inuse_space:bytes,
    ...), "resource"?: {k: v}, "stacks": [{"frames": [address, "kernel
    name" or {"name", "type", "file"?, "line"?} (a frame the sender named:
    JIT code), ...] (leaf first), "count", "value"? (with a type: per event),
    "trace_id"?, "span_id"?, "labels"?: {k: v}}]}. Events of one stack are
    spread over the profile's 10 s; "snapshots"?: N puts each stack's
    events at N fixed times (gauge snapshots) instead."""
    spec = json.load(open(args.spec))
    dic = Dictionary()
    request = svc.ExportProfilesServiceRequest()
    rp = request.resource_profiles.add()
    rp.resource.attributes.add(key="service.name").value.string_value = spec["service"]
    prof = rp.scope_profiles.add().profiles.add()
    for k, v in sorted(spec.get("resource", {}).items()):
        rp.resource.attributes.add(key=k).value.string_value = v
    kind = spec.get("type")
    valued = kind is not None
    if kind == "off_cpu":
        # The OpenTelemetry eBPF profiler's off-CPU profile: waits in ns.
        prof.sample_type.type_strindex = dic.string("off_cpu")
        prof.sample_type.unit_strindex = dic.string("nanoseconds")
    elif kind:
        name, unit = kind.split(":")
        prof.sample_type.type_strindex = dic.string(name)
        prof.sample_type.unit_strindex = dic.string(unit)
    else:
        prof.sample_type.type_strindex = dic.string("samples")
        prof.sample_type.unit_strindex = dic.string("count")
        prof.period_type.type_strindex = dic.string("cpu")
        prof.period_type.unit_strindex = dic.string("nanoseconds")
        prof.period = spec.get("period", 52_631_578)
    now = time.time_ns()
    prof.time_unix_nano = now - 10_000_000_000
    prof.duration_nano = 10_000_000_000
    binary = spec["binary"]
    m = dic.d.mapping_table.add(memory_start=0, memory_limit=1 << 40, file_offset=0,
                                filename_strindex=dic.string(binary["path"]))
    id_kind = binary.get("id_kind", "gnu")
    m.attribute_indices.append(dic.attr(f"process.executable.build_id.{id_kind}", binary["build_id"]))
    if "content_sha256" in binary:
        m.attribute_indices.append(dic.attr("symtrace.file.sha256", binary["content_sha256"]))
    mapping = len(dic.d.mapping_table) - 1
    locations = {}

    def location(frame):
        key = json.dumps(frame, sort_keys=True)
        if key in locations:
            return locations[key]
        if isinstance(frame, dict):
            dic.d.function_table.add(name_strindex=dic.string(frame["name"]),
                                     system_name_strindex=dic.string(frame["name"]),
                                     filename_strindex=dic.string(frame.get("file", "")))
            loc = dic.d.location_table.add()
            loc.lines.add(function_index=len(dic.d.function_table) - 1, line=frame.get("line", 0))
            loc.attribute_indices.append(dic.attr("profile.frame.type", frame["type"]))
        elif isinstance(frame, int):
            loc = dic.d.location_table.add(mapping_index=mapping, address=frame)
            loc.attribute_indices.append(dic.attr("profile.frame.type", "native"))
        else:
            dic.d.function_table.add(name_strindex=dic.string(frame), system_name_strindex=dic.string(frame))
            loc = dic.d.location_table.add()
            loc.lines.add(function_index=len(dic.d.function_table) - 1)
            loc.attribute_indices.append(dic.attr("profile.frame.type", "kernel"))
        locations[key] = len(dic.d.location_table) - 1
        return locations[key]

    events = 0
    for i, st in enumerate(spec["stacks"]):
        stack = dic.d.stack_table.add()
        stack.location_indices.extend(location(f) for f in st["frames"])
        sample = prof.samples.add(stack_index=len(dic.d.stack_table) - 1)
        for k, v in sorted(st.get("labels", {}).items()):
            sample.attribute_indices.append(dic.attr(k, v))
        if st.get("trace_id"):
            dic.d.link_table.add(trace_id=bytes.fromhex(st["trace_id"]), span_id=bytes.fromhex(st["span_id"]))
            sample.link_index = len(dic.d.link_table) - 1
        step = 10_000_000_000 // (st["count"] + 1)
        if spec.get("snapshots"):
            step = 10_000_000_000 // (spec["snapshots"] + 1)
            sample.timestamps_unix_nano.extend(prof.time_unix_nano + step * (j + 1) for j in range(st["count"]))
        else:
            sample.timestamps_unix_nano.extend(prof.time_unix_nano + step * (j + 1) + i for j in range(st["count"]))
        if valued:
            sample.values.extend(st["value"] for _ in range(st["count"]))
        events += st["count"]
    request.dictionary.CopyFrom(dic.d)
    rejected, message = send(args.transport, request, args, args.tenant_prefix + spec.get("tenant", "default"),
                             spec.get("token"))
    if rejected:
        print(f"rejected {rejected}: {message}")
        return 1
    print(f"sent {events} events in {len(spec['stacks'])} stacks")
    return 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=["roundtrip", "loop", "stacks", "collector", "send", "expect"])
    ap.add_argument("--now", type=int, default=0, help="send/expect modes: the profiles' time (ns)")
    ap.add_argument("--requests", type=int, default=4, help="send/expect modes: how many requests")
    ap.add_argument("--collector-grpc", help="collector mode: the Collector's OTLP gRPC receiver")
    ap.add_argument("--collector-http", help="collector mode: the Collector's OTLP/HTTP receiver (URL)")
    ap.add_argument("--tenants", default="", help="collector/expect modes: the tenants the Collector exports to")
    ap.add_argument("--timeout", type=float, default=30.0, help="collector/expect modes: seconds to wait for them")
    ap.add_argument("--spec", help="stacks mode: the JSON spec file")
    ap.add_argument("--grpc", default="127.0.0.1:4317")
    ap.add_argument("--http", default="http://127.0.0.1:8002")
    ap.add_argument("--transport", default="grpc", choices=["grpc", "http-protobuf", "http-json"])
    ap.add_argument("--tenant-prefix", default="")
    args = ap.parse_args()
    modes = {"roundtrip": roundtrip, "loop": loop, "stacks": stacks, "collector": collector,
             "send": send_only, "expect": expect}
    sys.exit(modes[args.mode](args))


if __name__ == "__main__":
    main()
