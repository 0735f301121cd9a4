// SPDX-License-Identifier: GPL-2.0
/* symtrace-agent's sampler: on every CPU-clock tick of every CPU, record the
 * running thread (pid, tid, comm, time), its user registers, the top of its
 * user stack, its user stack (frame pointers, walked here and checked) and
 * kernel stack into a ring buffer; tell userspace about exec and exit so it
 * can drop cached mappings. Off-CPU (when the loader enables it): at a
 * sampled switch-out of a blocked thread, the same record with the switch-out
 * time, and at its next switch-in a small record with the switch-in time.
 * Memory (when userspace attaches it): at the otel_memory:alloc USDT probe
 * of a sampled allocation, the same record with the probe's arguments, the
 * allocation kept in a map of live ones; at otel_memory:free of one in the
 * map, a small record.
 * GPL: bpf_get_stack and probe reads of user memory are GPL-only. */
#include <vmlinux.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>
#include "sample.h"

char LICENSE[] SEC("license") = "GPL";

#define PF_KTHREAD 0x00200000

/* Set by the loader (EbpfLoader::override_global). */
volatile const __u32 record_kernel_threads = 0;
/* The probability that a blocked thread's switch-out is recorded, as a
 * threshold for bpf_get_prandom_u32() (p × 2^32; 0: never), for a thread
 * outside any span and for one in a span (a valid OpenTelemetry thread
 * context). Userspace scales each wait by 1/p. */
volatile const __u64 off_cpu_threshold = 0;
volatile const __u64 off_cpu_span_threshold = 0;
/* Allocation records per CPU per ALLOC_WINDOW_NS aimed at (0: no bound):
 * the probes fire at a rate the profiled process chooses (a sampling
 * interval of 1 fires on every malloc), and each record costs the agent
 * microseconds. Beyond it allocations are thinned, not cut: each is kept
 * with probability 2^-shift and its weight multiplied by 2^shift, so the
 * totals stay unbiased (a cut would favour whichever thread came first in
 * each window). */
volatile const __u32 alloc_window_max = 0;

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

/* Per process (tgid): how its threads reach `otel_thread_ctx_v1` (set by
 * userspace from the executable's symbol and TLS segment, or from the GOT
 * entry of a library's TLS relocation). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct thread_ctx_loc);
} thread_ctx_offsets SEC(".maps");

/* Per slot (tgid mod PUBLISHING_SLOTS): how many processes in
 * thread_ctx_offsets fall in it, so the scheduler program's "is this thread
 * in a span?" costs an array read (inlined) for the processes that publish
 * nothing, not a hash lookup at every switch. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, PUBLISHING_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} publishing SEC(".maps");

/* A thread whose switch-out was recorded and that has not run since: its
 * switch-out time, in the thread's own storage (no lookup by key at every
 * switch; freed with the thread). */
struct {
	__uint(type, BPF_MAP_TYPE_TASK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, __u64);
} off_cpu_start SEC(".maps");

/* The pids of processes that exec'd, with a wakeup each (when memory
 * profiling is on): the agent looks for new probe sites in the process a
 * few milliseconds later, instead of at its next poll. Also link-map
 * changes (DL_CHANGE_BIT) and walks that found no unwind ranges
 * (UNWIND_MISS_BIT). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 64 << 10);
} exec_wakeups SEC(".maps");

/* Set by the loader: write exec_wakeups. */
volatile const __u32 wake_on_exec = 0;

/* The otel_memory probe sites' argument specs, by BPF cookie. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, USDT_SPECS);
	__type(key, __u32);
	__type(value, struct usdt_spec);
} usdt_specs SEC(".maps");

/* Per CPU and weight class: the current window's start, the allocations
 * seen in it, and the thinning in force (keep one in 2^shift). Records
 * standing for ALLOC_LARGE_WEIGHT bytes or more are counted apart from
 * smaller ones: a burst of small allocations (a churn of 4 KiB blocks,
 * thousands of records) must not thin the few large ones, whose weights
 * carry most of an in-use profile's bytes and whose thinning would cost
 * most precision. Each class has the rate bound, so twice it in all. */
struct alloc_window {
	__u64 start_ns;
	__u64 seen;
	__u32 shift;
	__u32 pad;
};

#define MAX_ALLOC_SHIFT 20
#define ALLOC_LARGE_WEIGHT (64 << 10)

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct alloc_window);
} alloc_windows SEC(".maps");

/* Set by the loader: live sampled allocations one process may hold (0: no
 * bound but the map's). */
volatile const __u32 live_per_process = 0;

/* Live sampled allocations per process (tgid → how many it holds in
 * live_allocs): no process takes more than its share of that map. The
 * agent deletes a process's entry when it exits. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u64);
} live_counts SEC(".maps");

/* Set by the loader: one recorded blocked switch-out per this many ns per
 * process, and this much credit at once (0: no bound). */
volatile const __u64 record_interval_ns = 0;
volatile const __u64 record_burst_ns = 0;

/* Per process: the time its next off-CPU record is due (a GCRA: a record
 * is refused while that time is more than the burst ahead of now). An LRU
 * map: a forgotten process starts afresh. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, __u64);
} record_due SEC(".maps");

/* Live sampled allocations (pid, pointer) → weight; bounded (resized by
 * the loader), allocated on insert. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, 65536);
	__type(key, struct live_key);
	__type(value, __u64);
} live_allocs SEC(".maps");

static __always_inline void count(__u32 which)
{
	__u64 *c = bpf_map_lookup_elem(&counters, &which);
	if (c)
		*c += 1; /* per-CPU: no other writer */
}

/* Whether process `tgid` is over its off-CPU record rate (then counted). */
static __always_inline int over_record_rate(__u32 tgid)
{
	if (!record_interval_ns)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	__u64 *due = bpf_map_lookup_elem(&record_due, &tgid);
	if (!due) {
		__u64 next = now + record_interval_ns;
		bpf_map_update_elem(&record_due, &tgid, &next, BPF_ANY);
		return 0;
	}
	__u64 t = *due < now ? now : *due;
	if (t - now > record_burst_ns) {
		count(COUNTER_OFF_CPU_THROTTLED);
		return 1;
	}
	*due = t + record_interval_ns; /* racy between CPUs: a record more or less */
	return 0;
}

/* Tracks a sampled allocation as live within its process's share; whether
 * it is tracked. */
static __always_inline int track_live(struct live_key *key, __u64 *weight)
{
	__u64 *held = bpf_map_lookup_elem(&live_counts, &key->pid);
	if (live_per_process && held && *held >= live_per_process) {
		count(COUNTER_LIVE_PROCESS_FULL);
		return 0;
	}
	if (bpf_map_update_elem(&live_allocs, key, weight, BPF_NOEXIST) == 0) {
		if (held) {
			__sync_fetch_and_add(held, 1);
		} else {
			__u64 one = 1;
			if (bpf_map_update_elem(&live_counts, &key->pid, &one, BPF_NOEXIST)) {
				held = bpf_map_lookup_elem(&live_counts, &key->pid);
				if (held)
					__sync_fetch_and_add(held, 1);
			}
		}
		return 1;
	}
	/* There already (a free the agent missed): the pointer is live again. */
	if (bpf_map_update_elem(&live_allocs, key, weight, BPF_EXIST) == 0)
		return 1;
	count(COUNTER_LIVE_FULL);
	return 0;
}

/* glibc's dynamic thread vector (x86-64): the thread control block holds
 * the DTV pointer at thread pointer + 8; dtv[-1] is its length in entries,
 * dtv[0] the generation it is up to date with, and dtv[m] (16 bytes each)
 * starts with the address of module m's TLS block for this thread — NULL
 * or -1 (TLS_DTV_UNALLOCATED) until the thread first touches it. */
#define DTV_ENTRY 16
#define MAX_TLS_MODULES 65536
#define TLS_STATIC_MAX (1LL << 30)

/* The address of the thread's `otel_thread_ctx_v1` slot, or 0. For a
 * library's slot the GOT entry is read at every sample, not once by the
 * agent: a library dlopen'ed after the agent read the process is found by
 * the agent as soon as ld.so reports it (on_dl_change), before its
 * relocations are done, and is read from the first sample after its
 * writer first publishes. */
static __always_inline __u64 ctx_slot(__u64 tp, const struct thread_ctx_loc *loc)
{
	if (loc->kind == CTX_TP_OFFSET)
		return tp + loc->tp_offset;
	__u64 got[2];
	if (bpf_probe_read_user(got, sizeof(got), (void *)loc->got))
		return 0;
	__u64 module, offset, generation = 0;
	if (loc->kind == CTX_TLSDESC) {
		if (!got[0])
			return 0; /* not relocated yet */
		__s64 arg = (__s64)got[1];
		if (arg < 0 && arg > -TLS_STATIC_MAX)
			return tp + arg; /* static TLS: the resolver returns its argument */
		__u64 dynamic[3]; /* glibc's struct tlsdesc_dynamic_arg */
		if (bpf_probe_read_user(dynamic, sizeof(dynamic), (void *)got[1]))
			return 0;
		module = dynamic[0];
		offset = dynamic[1];
		generation = dynamic[2];
	} else {
		module = got[0];
		offset = got[1];
	}
	if (!module || module >= MAX_TLS_MODULES || offset != loc->tls_offset)
		return 0; /* not relocated yet, or not what the ELF file says */
	__u64 dtv = 0, head[3];
	if (bpf_probe_read_user(&dtv, sizeof(dtv), (void *)(tp + 8)) || dtv < DTV_ENTRY)
		return 0;
	/* head[0]: dtv[-1]'s counter, the length; head[2]: dtv[0]'s, the
	 * generation. */
	if (bpf_probe_read_user(head, sizeof(head), (void *)(dtv - DTV_ENTRY)))
		return 0;
	if (module > head[0] || head[2] < generation)
		return 0; /* this thread has not caught up with the dlopen */
	__u64 block = 0;
	if (bpf_probe_read_user(&block, sizeof(block), (void *)(dtv + module * DTV_ENTRY)))
		return 0;
	if (!block || block == (__u64)-1)
		return 0; /* this thread never touched the library's TLS */
	return block + offset;
}

/* Copies the sampled thread's OTEP 4947 record: thread pointer (fsbase,
 * CO-RE) → the TLS slot (ctx_slot) → the record. Anything unreadable
 * leaves `valid` 0: a garbage pointer costs a failed probe read, nothing
 * more. A thread without a slot (one that never touched a library's TLS:
 * a runtime's helper threads) is not counted as unreadable. */
static __always_inline void read_trace_ctx(struct task_struct *task, __u32 tgid,
					   struct trace_ctx *out)
{
	struct thread_ctx_loc *loc = bpf_map_lookup_elem(&thread_ctx_offsets, &tgid);
	if (!loc)
		return;
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	__u64 slot = tp ? ctx_slot(tp, loc) : 0;
	__u64 record = 0;
	if (!slot)
		return;
	if (bpf_probe_read_user(&record, sizeof(record), (void *)slot)) {
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

/* The user registers saved at kernel entry (a syscall, a fault, an
 * interrupt) of the current thread. Returns 0 when there are none (a kernel
 * thread), -1 when they are not reachable on this kernel (bpf_task_pt_regs
 * needs 5.15). */
static __always_inline int saved_user_regs(__u64 *ip, __u64 *sp, __u64 *bp)
{
	if (!bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs))
		return -1;
	struct pt_regs *regs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
	*ip = BPF_CORE_READ(regs, ip);
	*sp = BPF_CORE_READ(regs, sp);
	*bp = BPF_CORE_READ(regs, bp);
	return *ip && *ip < USER_ADDRESS_LIMIT;
}

/* The user registers of the sampled thread: the interrupted ones when the
 * tick came in user mode, else those saved at kernel entry. */
static __always_inline int user_regs(struct bpf_perf_event_data *ctx, __u64 *ip, __u64 *sp,
				     __u64 *bp)
{
	if (ctx->regs.ip < USER_ADDRESS_LIMIT) {
		*ip = ctx->regs.ip;
		*sp = ctx->regs.sp;
		*bp = ctx->regs.bp;
		return 1;
	}
	return saved_user_regs(ip, sp, bp);
}

#include "unwind.bpf.h"

/* The user stack (`have` is what the register lookup answered: 1, 0: no
 * user registers, -1: fall back to bpf_get_stack on `ctx`), walked by
 * walk_user_stack; also copies USER_STACK_WINDOW bytes from %rsp, for
 * userspace's .eh_frame step out of a leaf whose file's table is not
 * loaded (yet). `proc`: the process's unwind ranges (proc_of), looked up
 * once per sample by the caller. */
static __always_inline void user_stack(void *ctx, int have, __u64 ip, __u64 sp, __u64 fp,
				       struct cpu_sample *s, struct unwind_proc *proc,
				       struct rule_memos *memo)
{
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
	walk_user_stack(s->pid, ip, sp, fp, s, proc, memo);
	if (s->user_end & USER_END_LEAF_CFI)
		return; /* stepped out of the leaf here: no window needed */
	if (!bpf_probe_read_user(s->window, USER_STACK_WINDOW, (void *)sp))
		s->window_bytes = USER_STACK_WINDOW;
	else if (!bpf_probe_read_user(s->window, 64, (void *)sp))
		s->window_bytes = 64; /* near the top of the stack mapping */
}

/* Set by the loader when unwind tables are on: a sample of a process whose
 * unwind ranges are not set yet comes with a copy of its user stack. */
volatile const __u32 stack_snapshots = 0;
/* ... while the ring buffer holds at most this many bytes not yet read
 * (set by the loader: a quarter of it). A copy is 64 times a sample's
 * size: on a host where new processes come faster than the agent reads
 * them (a build), copies would fill the buffer and samples be lost; with
 * a backlog, the copies stop first and the samples go on. */
volatile const __u64 snapshot_backlog = 0;

/* Writes the struct stack_snapshot of an on-CPU sample at `now`, called
 * when its process has no unwind ranges yet (its first moments,
 * before the agent read it: its frameless frames would cut the walk by
 * frame pointer). No flag in the sample says so (a value the verifier
 * would follow down both paths of all that comes after): the snapshot is
 * the one of the same CPU and time. As much of STACK_SNAPSHOT_BYTES as can
 * be read: the stack's top may be nearer, or a page not resident. A
 * global function: the verifier checks it once, on its own, and its
 * branches do not multiply the paths of the sample program after it. */
__attribute__((noinline)) int stack_snapshot(__u64 now, __u64 sp)
{
	if (!stack_snapshots)
		return 0;
	if (bpf_ringbuf_query(&records, BPF_RB_AVAIL_DATA) > snapshot_backlog) {
		count(COUNTER_SNAPSHOTS_SKIPPED);
		return 0;
	}
	struct stack_snapshot *snap = bpf_ringbuf_reserve(&records, sizeof(*snap), 0);
	if (!snap) {
		count(COUNTER_LOST);
		return 0;
	}
	snap->kind = RECORD_STACK_SNAPSHOT;
	snap->cpu = bpf_get_smp_processor_id();
	snap->boot_ns = now;
	snap->sp = sp;
	snap->pad = 0;
	void *at = (void *)sp;
	__u32 n = 0;
	/* The main thread's stack ends a little above the process's initial
	 * stack pointer (argv, the environment): when that is nearer than
	 * STACK_SNAPSHOT_BYTES, exactly up to it — every frame down to _start
	 * is below it, where halving the size would stop short of the
	 * outermost frames. Another thread's stack: the sizes below. */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	__u64 top = BPF_CORE_READ(task, mm, start_stack);
	if (top > sp && top - sp < STACK_SNAPSHOT_BYTES) {
		__u32 want = (top - sp) & (STACK_SNAPSHOT_BYTES - 1);
		if (want && !bpf_probe_read_user(snap->data, want, at))
			n = want;
	}
	if (!n) {
		if (!bpf_probe_read_user(snap->data, STACK_SNAPSHOT_BYTES, at))
			n = STACK_SNAPSHOT_BYTES;
		else if (!bpf_probe_read_user(snap->data, STACK_SNAPSHOT_BYTES / 2, at))
			n = STACK_SNAPSHOT_BYTES / 2;
		else if (!bpf_probe_read_user(snap->data, STACK_SNAPSHOT_BYTES / 4, at))
			n = STACK_SNAPSHOT_BYTES / 4;
		else if (!bpf_probe_read_user(snap->data, STACK_SNAPSHOT_BYTES / 8, at))
			n = STACK_SNAPSHOT_BYTES / 8;
		else if (!bpf_probe_read_user(snap->data, STACK_SNAPSHOT_BYTES / 32, at))
			n = STACK_SNAPSHOT_BYTES / 32;
	}
	if (!n) {
		bpf_ringbuf_discard(snap, BPF_RB_NO_WAKEUP);
		return 0;
	}
	snap->bytes = n;
	bpf_ringbuf_submit(snap, BPF_RB_NO_WAKEUP);
	count(COUNTER_SNAPSHOTS);
	return 1;
}

/* The common part of a sample record: who, when, the thread context. */
static __always_inline void sample_header(struct cpu_sample *s, __u32 kind, __u64 id,
					  struct task_struct *task, __u64 now)
{
	s->kind = kind;
	s->cpu = bpf_get_smp_processor_id();
	s->pid = id >> 32;
	s->tid = (__u32)id;
	s->boot_ns = now;
	bpf_get_current_comm(s->comm, sizeof(s->comm));
	__builtin_memset(&s->trace, 0, sizeof(s->trace));
	read_trace_ctx(task, s->pid, &s->trace);
	s->user_frames = 0;
	s->window_bytes = 0;
	s->user_sp = 0;
	s->user_bp = 0;
}

SEC("perf_event")
int on_cpu_sample(struct bpf_perf_event_data *ctx)
{
	count(COUNTER_TICKS); /* the agent's liveness: the events fire */
	__u64 id = bpf_get_current_pid_tgid();
	__u32 tid = (__u32)id;
	if (tid == 0)
		return 0; /* the idle task */
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	if (!record_kernel_threads && (BPF_CORE_READ(task, flags) & PF_KTHREAD)) {
		count(COUNTER_KERNEL_THREAD);
		return 0;
	}
	__u64 ip = 0, sp = 0, bp = 0;
	int have = user_regs(ctx, &ip, &sp, &bp);
	__u64 now = bpf_ktime_get_boot_ns();
	struct unwind_proc *proc = proc_of(id >> 32);
	if (have > 0 && !proc)
		stack_snapshot(now, sp);
	struct cpu_sample *s = bpf_ringbuf_reserve(&records, sizeof(*s), 0);
	if (!s) {
		count(COUNTER_LOST);
		return 0;
	}
	sample_header(s, RECORD_SAMPLE, id, task, now);
	__u32 zero = 0;
	/* The rule memo: only here (see struct rule_memo). */
	user_stack(ctx, have, ip, sp, bp, s, proc, bpf_map_lookup_elem(&rule_memos, &zero));
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
	/* Its mappings are new: the unwind ranges of the old image go now, not
	 * when userspace reads the event (a walk of the new image by the old
	 * ranges would step by the wrong rules). */
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	bpf_map_delete_elem(&unwind_procs, &tgid);
	bpf_map_delete_elem(&unwind_asked, &tgid); /* the new image asks anew */
	if (wake_on_exec) {
		__u32 *pid = bpf_ringbuf_reserve(&exec_wakeups, sizeof(*pid), 0);
		if (pid) {
			*pid = bpf_get_current_pid_tgid() >> 32;
			bpf_ringbuf_submit(pid, BPF_RB_FORCE_WAKEUP);
		}
	}
	return 0;
}

/* The processes the agent has read (an LRU set, filled by the agent):
 * only their link-map changes wake it. Every process start calls the hook
 * too, and a process the agent has not read yet is read whole at its
 * first sample anyway. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} dl_watch SEC(".maps");

/* ld.so's debugger hook, `_dl_debug_state`, called whenever the link map
 * changes (dlopen, dlclose): wakes the agent with the pid, bit 31 set, so
 * that a library mapped now is looked at within milliseconds — before its
 * constructors and its first use (attached per ld.so file). */
SEC("uprobe")
int on_dl_change(struct pt_regs *ctx)
{
	__u32 tgid = bpf_get_current_pid_tgid() >> 32;
	__u8 *state = bpf_map_lookup_elem(&dl_watch, &tgid);
	/* 2: a wakeup of this process is outstanding (the agent sets 1 again
	 * when it takes it): a process looping dlopen/dlclose wakes the agent
	 * once per read of its maps, not once per call. */
	if (!state || *state == 2)
		return 0;
	/* {pid | DL_CHANGE_BIT, 0, CLOCK_MONOTONIC ns}: when ld.so reported
	 * the change, so the agent can tell how late it found the library. */
	__u32 *pid = bpf_ringbuf_reserve(&exec_wakeups, 16, 0);
	if (pid) {
		*state = 2;
		pid[0] = tgid | DL_CHANGE_BIT;
		pid[1] = 0;
		*(__u64 *)&pid[2] = bpf_ktime_get_ns();
		bpf_ringbuf_submit(pid, BPF_RB_FORCE_WAKEUP);
	}
	return 0;
}

SEC("raw_tracepoint/sched_process_exit")
int on_exit(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 id = bpf_get_current_pid_tgid();
	if ((__u32)id != (__u32)(id >> 32))
		return 0; /* a thread, not the process */
	process_event(RECORD_EXIT);
	__u32 tgid = id >> 32;
	bpf_map_delete_elem(&unwind_asked, &tgid); /* the pid may come back */
	return 0;
}

/* `task_struct.__state` (5.14+), or `state` before. */
struct task_struct___old {
	long state;
} __attribute__((preserve_access_index));

static __always_inline long task_state(struct task_struct *t)
{
	if (bpf_core_field_exists(t->__state))
		return t->__state;
	return ((struct task_struct___old *)t)->state;
}

#define TASK_DEAD 0x80

/* Whether the current thread is in a span: a valid OpenTelemetry thread
 * context (the same reads as read_trace_ctx, the header's `valid` only). */
static __always_inline int in_span(struct task_struct *task, __u32 tgid)
{
	__u32 slot = tgid & (PUBLISHING_SLOTS - 1);
	__u32 *publishers = bpf_map_lookup_elem(&publishing, &slot);
	if (!publishers || !*publishers)
		return 0;
	struct thread_ctx_loc *loc = bpf_map_lookup_elem(&thread_ctx_offsets, &tgid);
	if (!loc)
		return 0;
	__u64 tp = BPF_CORE_READ(task, thread.fsbase);
	__u64 at = tp ? ctx_slot(tp, loc) : 0;
	__u64 record = 0;
	__u8 valid = 0;
	if (!at || bpf_probe_read_user(&record, sizeof(record), (void *)at) || !record)
		return 0;
	if (bpf_probe_read_user(&valid, 1, (void *)(record + __builtin_offsetof(struct trace_ctx, valid))))
		return 0;
	return valid == 1;
}

/* Every context switch (a BTF tracepoint: the tasks are read directly, the
 * cheapest hook the scheduler has): `next`'s wait ends if its switch-out
 * was recorded; `prev` (the current thread) is recorded, with the
 * probability of its kind, when it blocks. Runnable threads that were
 * preempted are counted, not recorded: they wait for a CPU, not for an
 * event. */
SEC("tp_btf/sched_switch")
int BPF_PROG(on_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	__u64 *start = bpf_task_storage_get(&off_cpu_start, next, 0, 0);
	if (start && *start) {
		struct off_cpu_end *e = bpf_ringbuf_reserve(&records, sizeof(*e), 0);
		if (e) {
			e->kind = RECORD_OFF_CPU_END;
			e->tid = next->pid;
			e->start_ns = *start;
			e->end_ns = bpf_ktime_get_boot_ns();
			bpf_ringbuf_submit(e, BPF_RB_NO_WAKEUP);
		} else {
			count(COUNTER_OFF_CPU_LOST);
		}
		*start = 0;
	}

	__u32 tid = prev->pid;
	if (tid == 0)
		return 0; /* the idle task */
	if (!record_kernel_threads && (prev->flags & PF_KTHREAD))
		return 0;
	long state = task_state(prev);
	if (state == 0) {
		count(COUNTER_PREEMPTED);
		return 0;
	}
	if (state & TASK_DEAD)
		return 0; /* its last switch-out */
	__u64 r = bpf_get_prandom_u32();
	if (r >= off_cpu_threshold && r >= off_cpu_span_threshold)
		return 0; /* recorded in no case: no need to know which */
	__u32 tgid = prev->tgid;
	if (r >= (in_span(prev, tgid) ? off_cpu_span_threshold : off_cpu_threshold))
		return 0;
	if (over_record_rate(tgid))
		return 0;
	start = bpf_task_storage_get(&off_cpu_start, prev, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
	if (!start) {
		count(COUNTER_OFF_CPU_FULL);
		return 0;
	}
	struct cpu_sample *s = bpf_ringbuf_reserve(&records, sizeof(*s), 0);
	if (!s) {
		count(COUNTER_OFF_CPU_LOST);
		return 0;
	}
	__u64 now = bpf_ktime_get_boot_ns();
	*start = now;
	sample_header(s, RECORD_OFF_CPU_START, ((__u64)tgid << 32) | tid, prev, now);
	__u64 ip = 0, sp = 0, bp = 0;
	int have = saved_user_regs(&ip, &sp, &bp);
	user_stack(ctx, have, ip, sp, bp, s, proc_of(tgid), 0);
	s->kernel_bytes = bpf_get_stack(ctx, s->kernel, sizeof(s->kernel), 0);
	bpf_ringbuf_submit(s, BPF_RB_NO_WAKEUP);
	count(COUNTER_OFF_CPU);
	return 0;
}

/* One USDT argument as its spec says (libbpf's usdt.bpf.h does the same):
 * the register, or the memory it points at plus the displacement, or the
 * constant; then cut to its size and sign- or zero-extended. */
static __always_inline int usdt_arg(struct pt_regs *ctx, const struct usdt_arg *a, __u64 *out)
{
	__u64 v = 0;
	switch (a->kind) {
	case USDT_ARG_CONST:
		*out = a->value;
		return 0;
	case USDT_ARG_REG:
	case USDT_ARG_MEM:
		if (a->reg_off > sizeof(struct pt_regs) - sizeof(__u64))
			return -1;
		if (bpf_probe_read_kernel(&v, sizeof(v), (void *)ctx + a->reg_off))
			return -1;
		if (a->kind == USDT_ARG_MEM &&
		    bpf_probe_read_user(&v, sizeof(v), (void *)(v + a->value)))
			return -1;
		break;
	default:
		return -1;
	}
	int bytes = a->size < 0 ? -a->size : a->size;
	if (bytes > 0 && bytes < 8) {
		int shift = 64 - 8 * bytes;
		if (a->size < 0)
			v = (__u64)(((__s64)(v << shift)) >> shift);
		else
			v = (v << shift) >> shift;
	}
	*out = v;
	return 0;
}

/* Every otel_memory probe site: the cookie says which probe it is and
 * where its arguments are. */
SEC("uprobe")
int on_usdt(struct pt_regs *ctx)
{
	__u32 index = (__u32)bpf_get_attach_cookie(ctx);
	struct usdt_spec *spec = bpf_map_lookup_elem(&usdt_specs, &index);
	if (!spec || !spec->probe)
		return 0;
	__u64 id = bpf_get_current_pid_tgid();
	struct live_key key = {.pid = id >> 32};
	if (usdt_arg(ctx, &spec->args[0], &key.ptr)) {
		count(COUNTER_USDT_UNREADABLE);
		return 0;
	}
	if (spec->probe == USDT_PROBE_FREE) {
		/* Reserved before the delete: a free follows its allocation in
		 * the ring buffer, and a free that cannot be reported leaves the
		 * allocation in both maps rather than in one. */
		struct alloc_free *f = bpf_ringbuf_reserve(&records, sizeof(*f), 0);
		if (!f) {
			if (bpf_map_lookup_elem(&live_allocs, &key))
				count(COUNTER_FREES_LOST);
			return 0;
		}
		if (bpf_map_delete_elem(&live_allocs, &key)) {
			bpf_ringbuf_discard(f, BPF_RB_NO_WAKEUP);
			return 0; /* not one we saw allocated */
		}
		__u64 *held = bpf_map_lookup_elem(&live_counts, &key.pid);
		if (held && *held)
			__sync_fetch_and_sub(held, 1);
		f->kind = RECORD_FREE;
		f->pid = key.pid;
		f->ptr = key.ptr;
		bpf_ringbuf_submit(f, BPF_RB_NO_WAKEUP);
		count(COUNTER_FREES);
		return 0;
	}
	if (spec->probe != USDT_PROBE_ALLOC)
		return 0;
	__u64 size = 0, weight = 0;
	usdt_arg(ctx, &spec->args[1], &size);
	usdt_arg(ctx, &spec->args[2], &weight);
	__u32 shift = 0;
	if (alloc_window_max) {
		__u32 class = weight >= ALLOC_LARGE_WEIGHT;
		struct alloc_window *w = bpf_map_lookup_elem(&alloc_windows, &class);
		if (!w)
			return 0;
		__u64 now = bpf_ktime_get_ns();
		if (now - w->start_ns >= ALLOC_WINDOW_NS) {
			/* The next window's thinning, from this one's rate — if it
			 * was the last one: after a window without allocations the
			 * rate was nothing, and a burst long ago must not thin the
			 * first allocations of a process started since. */
			__u32 k = 0;
			for (int i = 0; i < MAX_ALLOC_SHIFT; i++) {
				if (now - w->start_ns >= 2 * ALLOC_WINDOW_NS)
					break;
				if ((w->seen >> k) <= alloc_window_max)
					break;
				k++;
			}
			w->shift = k;
			w->seen = 0;
			w->start_ns = now;
		}
		w->seen += 1;
		/* A burst within the window thins further as it goes. */
		if ((w->seen >> w->shift) > 2 * (__u64)alloc_window_max && w->shift < MAX_ALLOC_SHIFT)
			w->shift += 1;
		shift = w->shift & 31;
		if (shift && (bpf_get_prandom_u32() & ((1u << shift) - 1))) {
			count(COUNTER_ALLOCS_THROTTLED);
			return 0;
		}
	}
	struct alloc_sample *a = bpf_ringbuf_reserve(&records, sizeof(*a), 0);
	if (!a) {
		count(COUNTER_ALLOCS_LOST);
		return 0;
	}
	if (shift) /* it stands for 2^shift allocations like it */
		weight = weight >> (64 - shift) ? ~0ULL : weight << shift;
	a->size = size;
	a->weight = weight;
	a->ptr = key.ptr;
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	sample_header(&a->sample, RECORD_ALLOC, id, task, bpf_ktime_get_boot_ns());
	/* The checked walk, as for CPU samples (bpf_get_stack's was slower
	 * here: 2.3 µs a run against 1.8 on the example service). */
	user_stack(ctx, 1, PT_REGS_IP(ctx), PT_REGS_SP(ctx), PT_REGS_FP(ctx), &a->sample,
		   proc_of(id >> 32), 0);
	a->sample.kernel_bytes = 0;
	/* After the reserve: the free's record comes after this one. */
	a->tracked = track_live(&key, &weight);
	a->pad = 0;
	bpf_ringbuf_submit(a, BPF_RB_NO_WAKEUP);
	count(COUNTER_ALLOCS);
	return 0;
}
