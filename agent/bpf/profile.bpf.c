// SPDX-License-Identifier: GPL-2.0
/* symtrace-agent's sampler: on every CPU-clock tick of every CPU, record the
 * running thread (pid, tid, comm, time), its user registers, the top of its
 * user stack, its user stack (frame pointers, walked here and checked) and
 * kernel stack into a ring buffer; tell userspace about exec and exit so it
 * can drop cached mappings. GPL: bpf_get_stack and probe reads of user
 * memory are GPL-only. */
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

#define USER_ADDRESS_LIMIT (1ULL << 47) /* x86-64 user space: below 128 TiB */

/* The user registers of the sampled thread: the interrupted ones when the
 * tick came in user mode, else those saved at kernel entry (a syscall, a
 * fault). Returns 0 when there are none (a kernel thread), -1 when they are
 * not reachable on this kernel (bpf_task_pt_regs needs 5.15). */
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, __u64 *ip, __u64 *sp,
				     __u64 *bp)
{
	if (ctx->regs.ip < USER_ADDRESS_LIMIT) {
		*ip = ctx->regs.ip;
		*sp = ctx->regs.sp;
		*bp = ctx->regs.bp;
		return 1;
	}
	if (!bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		return -1;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	*ip = BPF_CORE_READ(regs, ip);
	*sp = BPF_CORE_READ(regs, sp);
	*bp = BPF_CORE_READ(regs, bp);
	return *ip && *ip < USER_ADDRESS_LIMIT;
}

/* The user stack by frame pointers, as the kernel's perf_callchain_user
 * walks it, but checked: each frame pointer must be 8-aligned and above the
 * previous one, so a garbage %rbp (code built without frame pointers) ends
 * the walk instead of adding frames. Also copies USER_STACK_WINDOW bytes
 * from %rsp, for userspace's .eh_frame step out of the leaf. */
static __always_inline void user_stack(struct bpf_perf_event_data *ctx, struct cpu_sample *s)
{
	__u64 ip = 0, sp = 0, fp = 0;
	int have = user_regs(ctx, &ip, &sp, &fp);
	if (have < 0) {
		long n = bpf_get_stack(ctx, s->user, sizeof(s->user), BPF_F_USER_STACK);
		s->user_frames = n > 0 ? n / 8 : 0;
		s->user_end = USER_END_HELPER;
		return;
	}
	if (!have) {
		s->user_end = USER_END_NO_USER;
		return;
	}
	s->user_sp = sp;
	s->user_bp = fp;
	if (!bpf_probe_read_user(s->window, USER_STACK_WINDOW, (void *)sp))
		s->window_bytes = USER_STACK_WINDOW;
	else if (!bpf_probe_read_user(s->window, 64, (void *)sp))
		s->window_bytes = 64; /* near the top of the stack mapping */
	s->user[0] = ip;
	__u32 n = 1;
	__u32 end = USER_END_DEPTH;
	for (int i = 1; i < USER_STACK_DEPTH; i++) {
		__u64 frame[2]; /* the saved %rbp, the return address */
		if (!fp) {
			end = USER_END_ROOT;
			break;
		}
		if ((fp & 7) || fp >= USER_ADDRESS_LIMIT ||
		    bpf_probe_read_user(frame, sizeof(frame), (void *)fp)) {
			end = USER_END_UNREADABLE;
			break;
		}
		if (!frame[1]) {
			end = USER_END_ROOT;
			break;
		}
		s->user[i] = frame[1];
		n = i + 1;
		if (frame[0] && frame[0] <= fp) {
			end = USER_END_NOT_INCREASING;
			break;
		}
		fp = frame[0];
	}
	s->user_frames = n;
	s->user_end = end;
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
	s->user_frames = 0;
	s->window_bytes = 0;
	s->user_sp = 0;
	s->user_bp = 0;
	user_stack(ctx, s);
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
