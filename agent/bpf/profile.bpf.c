// SPDX-License-Identifier: GPL-2.0
/* symtrace-agent's sampler: on every CPU-clock tick of every CPU, record the
 * running thread (pid, tid, comm, time), its user stack (frame pointers) and
 * kernel stack into a ring buffer; tell userspace about exec and exit so it
 * can drop cached mappings. GPL: bpf_get_stack on user memory is GPL-only. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "sample.h"

char LICENSE[] SEC("license") = "GPL";

#define PF_KTHREAD 0x00200000

/* Set by the loader (EbpfLoader::override_global). */
volatile const __u32 record_kernel_threads = 0;

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 8 << 20); /* resized by the loader */
} records SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} counters SEC(".maps");

/* Per process (tgid): where `otel_thread_ctx_v1` is relative to the thread
 * pointer (set by userspace from the executable's symbol and TLS segment). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __s64);
} thread_ctx_offsets SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1; /* per-CPU: no other writer */
}

/* Copies the sampled thread's OTEP 4947 record: thread pointer (fsbase,
 * CO-RE) + offset → the TLS slot → the record. Anything unreadable leaves
 * `valid` 0: a garbage pointer costs a failed probe read, nothing more. */
static __always_inline void read_trace_ctx(struct task_struct *task, __u32 tgid,
					   struct trace_ctx *out)
{
	__s64 *offset = bpf_map_lookup_elem(&thread_ctx_offsets, &tgid);
	if (!offset)
		return;
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	__u64 record = 0;
	if (!tp || bpf_probe_read_user(&record, sizeof(record), (void *)(tp + *offset))) {
		count(COUNTER_CTX_UNREADABLE);
		return;
	}
	if (!record)
		return; /* this thread never published */
	if (bpf_probe_read_user(out, TRACE_CTX_HEADER, (void *)record)) {
		count(COUNTER_CTX_UNREADABLE);
		__builtin_memset(out, 0, TRACE_CTX_HEADER);
		return;
	}
	if (out->valid != 1) {
		out->valid = 0;
		return;
	}
	__u32 n = out->attrs_size;
	if (n > TRACE_CTX_ATTRS)
		n = TRACE_CTX_ATTRS;
	if (n && bpf_probe_read_user(out->attrs, n, (void *)(record + TRACE_CTX_HEADER)))
		out->attrs_size = 0;
	count(COUNTER_CTX_READ);
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (tid == 0)
		return 0; /* the idle task */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (!record_kernel_threads && (BPF_CORE_READ(task, flags) & PF_KTHREAD)) {
		count(COUNTER_KERNEL_THREAD);
		return 0;
	}
	struct cpu_sample *s = bpf_ringbuf_reserve(&records, sizeof(*s), 0);
	if (!s) {
		count(COUNTER_LOST);
		return 0;
	}
	s->kind = RECORD_SAMPLE;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = id >> 32;
	s->tid = tid;
	s->boot_ns = bpf_ktime_get_boot_ns();
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	__builtin_memset(&s->trace, 0, sizeof(s->trace));
	read_trace_ctx(task, s->pid, &s->trace);
	s->user_bytes = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);
	s->kernel_bytes = bpf_get_stack(ctx, s->kernel, sizeof(s->kernel), 0);
	/* Userspace drains on a timer: no wakeup per sample. */
	bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
	count(COUNTER_SAMPLES);
	return 0;
}

static __always_inline void process_event(__u32 kind)
{
	struct process_event_record *e = bpf_ringbuf_reserve(&records, sizeof(*e), 0);
	if (!e) {
		count(COUNTER_EVENTS_LOST);
		return;
	}
	e->kind = kind;
	e->pid = bpf_get_current_pid_tgid() >> 32;
	bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
}

/* raw_tracepoint, not tracepoint: tracefs may not be mounted. */
SEC("raw_tracepoint/sched_process_exec")
int on_exec(struct bpf_raw_tracepoint_args *ctx)
{
	process_event(RECORD_EXEC);
	return 0;
}

SEC("raw_tracepoint/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)id != (__u32)(id >> 32))
		return 0; /* a thread, not the process */
	process_event(RECORD_EXIT);
	return 0;
}
