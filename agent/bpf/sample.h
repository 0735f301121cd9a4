/* The records the BPF program hands to userspace through the ring buffer.
 * Mirrored by agent/src/record.rs (#[repr(C)]): its constants are generated
 * from the #defines below by build.rs. The layout is also written out as
 * numbers (the LAYOUT_ block after the structs): the C compiler checks these
 * structs against them and the Rust compiler checks record.rs against the
 * same numbers, so a change to either side alone fails the build
 * (agent/tests/layout.rs proves both). At run time a record whose size is
 * not exactly the Rust struct's is refused and counted as malformed. */
#ifndef SYMTRACE_SAMPLE_H
#define SYMTRACE_SAMPLE_H

#define USER_STACK_DEPTH 127   /* the kernel's default perf_event_max_stack */
#define KERNEL_STACK_DEPTH 64
/* Bytes of the user stack copied from %rsp at the sample: where a frameless
 * leaf (or a function in its prologue or epilogue) keeps its return address.
 * Userspace finds it with the leaf's .eh_frame CFI. */
#define USER_STACK_WINDOW 256
/* Bytes of user stack copied from %rsp for a sample of a process whose
 * unwind ranges are not set yet (its first moments: the agent has not read
 * it): userspace walks it by CFI once the process's files are read, so a
 * new process's first stacks are whole too. A power of two. */
#define STACK_SNAPSHOT_BYTES 16384
/* Slots of the scheduler program's filter of publishing processes (a power
 * of two). */
#define PUBLISHING_SLOTS 65536
/* Set in an exec_wakeups entry sent by on_dl_change (a pid has fewer bits). */
#define DL_CHANGE_BIT 2147483648u
/* Set in an exec_wakeups entry sent by a walk that found no unwind ranges
 * for its process (the agent reads it now, not at its next drain). */
#define UNWIND_MISS_BIT 1073741824u
/* Processes whose walk asked for their unwind ranges (an LRU set). */
#define UNWIND_ASKED 8192

/* Why the frame-pointer walk of the user stack ended. */
enum user_stack_end {
	USER_END_ROOT = 0,           /* a zero frame pointer or return address */
	USER_END_DEPTH = 1,          /* USER_STACK_DEPTH frames */
	USER_END_UNREADABLE = 2,     /* a frame pointer pointed at unreadable memory */
	USER_END_NOT_INCREASING = 3, /* the next frame pointer was not above this one */
	USER_END_NO_USER = 4,        /* no user registers (a kernel thread) */
	USER_END_HELPER = 5,         /* walked by bpf_get_stack (kernel < 5.15, in a syscall) */
	USER_END_OUTERMOST = 6,      /* CFI marked the return address undefined (_start, a thread's entry) */
};
/* Or'ed into user_end: the walk stepped out of the leaf by its CFI (the
 * file's table was loaded), so userspace must not step out of it again. */
#define USER_END_LEAF_CFI 256
#define USER_END_MASK 255

/* Unwinding by CFI (issue #40). Userspace builds one table per file from
 * its .eh_frame: sorted rows {start, rule}, the rules deduplicated across
 * all files into unwind_rules. A file's rows sit at [first, first + count)
 * of the shared unwind_rows pool; a process's executable mappings whose
 * file has a table are its unwind_proc ranges, sorted by start. */
#define UNWIND_PROC_RANGES 128     /* mappings with a table, per process */
#define UNWIND_FILES 4096          /* files with a table at once */
#define UNWIND_RULES 16384         /* distinct rules, all files together */
#define UNWIND_SEARCH_STEPS 24     /* binary-search steps: rows per file < 2^24 */
#define UNWIND_PROCS 2048          /* processes with ranges at once */

enum unwind_rule_kind {
	RULE_UNKNOWN = 0,   /* no CFI here, or one the walk does not evaluate: step by frame pointer */
	RULE_RSP = 1,       /* CFA = %rsp + cfa */
	RULE_RBP = 2,       /* CFA = %rbp + cfa */
	RULE_OUTERMOST = 3, /* the return address is undefined: the stack ends here */
};

struct unwind_rule {
	__s32 cfa;           /* CFA offset from its register */
	__s32 ra;            /* the return address is at CFA + ra */
	__s32 rbp;           /* the caller's %rbp is at CFA + rbp (when rbp_saved) */
	__u8 kind;           /* enum unwind_rule_kind */
	__u8 rbp_saved;
	__u16 pad;
};

struct unwind_row {
	__u32 start;         /* offset from the file table's base */
	__u32 rule;          /* index in unwind_rules */
};

/* A file's table; count 0: no table in this slot. Its page index follows
 * its rows in the pool, at [first + count, first + count + pages): entry p
 * is the rows that may hold an offset in [p << shift, (p + 1) << shift)
 * as a struct unwind_row {lowest, highest} (row numbers in the table), so
 * a lookup searches a page's few rows, in a few cache lines, instead of
 * the whole table (a walk in a busy VM pays for each line it touches).
 * The shift, UNWIND_PAGE_SHIFT or more (no more pages than rows), is in
 * flags' bits UNWIND_FILE_SHIFT_AT.. ; an offset past the last page is
 * looked up in the last. */
#define UNWIND_FILE_FRAMED 1 /* the file keeps frame pointers: its non-leaf frames step by them */
#define UNWIND_FILE_SHIFT_AT 8
#define UNWIND_PAGE_SHIFT 12
struct unwind_file {
	__u32 first;
	__u32 count;
	__u32 flags;
	__u32 pages;         /* at least 1 when count is not 0 */
};

/* An executable mapping of a file with a table: the table's offset of
 * address A is A - adjust. */
struct unwind_range {
	__u64 start;
	__u64 adjust;
	__u32 len;
	__u32 file;          /* slot in unwind_files, | UNWIND_RANGE_FRAMED */
};
/* Or'ed into unwind_range.file: the file keeps frame pointers (its slot's
 * UNWIND_FILE_FRAMED), so the walk steps its non-leaf frames by them
 * without reading its slot. */
#define UNWIND_RANGE_FRAMED 0x80000000

struct unwind_proc {
	__u32 count;
	__u32 gen;           /* changed by the agent at each write (the walk's rule memo holds while it stays) */
	struct unwind_range ranges[UNWIND_PROC_RANGES];
};

enum record_kind {
	RECORD_SAMPLE = 1,
	RECORD_EXEC = 2,   /* a process called execve: its mappings are new */
	RECORD_EXIT = 3,   /* a process (its last thread) exited */
	RECORD_OFF_CPU_START = 4, /* a thread blocked: a cpu_sample of its
				     stacks and context, boot_ns = switch-out */
	RECORD_OFF_CPU_END = 5,   /* it ran again: struct off_cpu_end */
	RECORD_ALLOC = 6,  /* a sampled allocation: struct alloc_sample */
	RECORD_FREE = 7,   /* a tracked sampled allocation was freed: struct alloc_free */
	RECORD_STACK_SNAPSHOT = 8, /* the user stack of the on-CPU sample of the same cpu and boot_ns, written next: struct stack_snapshot */
};


#define TRACE_CTX_HEADER 28      /* OTEP 4947 record header */
#define TRACE_CTX_ATTRS 100      /* attribute bytes copied per sample */

/* The thread's trace context at sample time: the OpenTelemetry thread
 * context record (OTEP 4947) the thread's `otel_thread_ctx_v1` TLS slot
 * points to, its header and the first TRACE_CTX_ATTRS attribute bytes.
 * `valid` is 1 only when a record was read and its writer marked it
 * consistent. */
struct trace_ctx {
	__u8 trace_id[16];
	__u8 span_id[8];
	__u8 valid;
	__u8 trace_flags;
	__u16 attrs_size;        /* as the writer set it (may exceed the copy) */
	__u8 attrs[TRACE_CTX_ATTRS];
};

/* How a process's threads reach their OTEP 4947 slot (map
 * thread_ctx_offsets, by tgid). */
enum thread_ctx_kind {
	/* The slot is at thread pointer + tp_offset (an executable's slot). */
	CTX_TP_OFFSET = 0,
	/* A library's slot, through its R_X86_64_TLSDESC GOT entry at `got`
	 * {resolver, argument}: the argument is the slot's offset from the
	 * thread pointer (static TLS) or points to glibc's {module ID, offset,
	 * generation} (dynamic TLS: a dlopen'ed library). */
	CTX_TLSDESC = 1,
	/* A library's slot, through its general-dynamic GOT entry at `got`
	 * {module ID, offset} (R_X86_64_DTPMOD64 + DTPOFF64). */
	CTX_GD = 2,
};

struct thread_ctx_loc {
	__s64 tp_offset;     /* CTX_TP_OFFSET */
	__u64 got;           /* the GOT entry's address in the process */
	__u64 tls_offset;    /* the slot's offset in its module's TLS block */
	__u32 kind;          /* enum thread_ctx_kind */
	__u32 pad;
};

struct cpu_sample {
	__u32 kind;          /* RECORD_SAMPLE */
	__u32 cpu;
	__u32 pid;           /* tgid */
	__u32 tid;
	__u64 boot_ns;       /* bpf_ktime_get_boot_ns() */
	__u32 user_frames;   /* entries of user[] */
	__u32 user_end;      /* enum user_stack_end */
	__s32 kernel_bytes;  /* bpf_get_stack's answer: bytes, or -errno */
	__u32 window_bytes;  /* bytes of window[] read */
	char comm[16];       /* the thread's name */
	__u64 user_sp;       /* the user registers at the sample (or at */
	__u64 user_bp;       /* kernel entry, when sampled in the kernel) */
	struct trace_ctx trace;
	__u8 window[USER_STACK_WINDOW];   /* user stack from user_sp up */
	/* user[0] is the user %rip, then the return addresses of the
	 * frame-pointer chain, leaf first */
	__u64 user[USER_STACK_DEPTH];
	__u64 kernel[KERNEL_STACK_DEPTH];
};

/* The user stack from %rsp of an on-CPU sample walked before its process's
 * unwind ranges were set (the sample of the same cpu and boot_ns). */
struct stack_snapshot {
	__u32 kind;          /* RECORD_STACK_SNAPSHOT */
	__u32 cpu;
	__u64 boot_ns;       /* the sample's */
	__u64 sp;            /* the address of data[0] */
	__u32 bytes;         /* of data[] read */
	__u32 pad;
	__u8 data[STACK_SNAPSHOT_BYTES];
};

struct process_event_record {
	__u32 kind;          /* RECORD_EXEC or RECORD_EXIT */
	__u32 pid;
};

/* A thread whose switch-out was recorded (RECORD_OFF_CPU_START, same tid
 * and boot_ns = start_ns) ran again: it waited end_ns - start_ns. */
struct off_cpu_end {
	__u32 kind;          /* RECORD_OFF_CPU_END */
	__u32 tid;
	__u64 start_ns;      /* bpf_ktime_get_boot_ns() at the switch-out */
	__u64 end_ns;        /* and at the switch-in */
};

/* The otel_memory USDT probes (memory allocation profiling). Userspace
 * attaches one uprobe per probe site and file, its BPF cookie the index of
 * the site's struct usdt_spec in `usdt_specs`: which probe it is and where
 * its arguments are (the note's argument spec, decoded). */
#define USDT_ARGS 3
#define USDT_SPECS 4096
/* The allocation records' rate bound is kept per CPU over windows of
 * this many nanoseconds (a tenth of a second). */
#define ALLOC_WINDOW_NS 100000000

enum usdt_arg_kind {
	USDT_ARG_NONE = 0,
	USDT_ARG_CONST = 1,  /* value */
	USDT_ARG_REG = 2,    /* the register at reg_off in struct pt_regs */
	USDT_ARG_MEM = 3,    /* memory at that register + value */
};

enum usdt_probe {
	USDT_PROBE_ALLOC = 1,  /* otel_memory:alloc(ptr, size, weight) */
	USDT_PROBE_FREE = 2,   /* otel_memory:free(ptr) */
};

struct usdt_arg {
	__s64 value;         /* the constant, or the memory displacement */
	__u32 kind;          /* enum usdt_arg_kind */
	__u16 reg_off;       /* byte offset in struct pt_regs */
	__s8 size;           /* 1, 2, 4, 8 bytes; negative: signed */
	__u8 pad;
};

struct usdt_spec {
	struct usdt_arg args[USDT_ARGS];
	__u32 probe;         /* enum usdt_probe; 0: a free slot */
	__u32 pad;
};

/* A sampled allocation: the thread's stacks and context as a cpu_sample
 * (kind RECORD_ALLOC, no kernel stack), and the probe's arguments.
 * `tracked` is 1 when it was added to the map of live allocations (its
 * free will be reported), 0 when the map was full. */
struct alloc_sample {
	struct cpu_sample sample;
	__u64 ptr;
	__u64 size;
	__u64 weight;        /* bytes it stands for */
	__u32 tracked;
	__u32 pad;
};

/* A tracked allocation was freed. */
struct alloc_free {
	__u32 kind;          /* RECORD_FREE */
	__u32 pid;
	__u64 ptr;
};

/* The key of the map of live sampled allocations. */
struct live_key {
	__u32 pid;
	__u32 pad;
	__u64 ptr;
};

/* The layout, byte for byte: the size and every field's offset. Changing a
 * struct above means changing these numbers, and record.rs with them (both
 * compilers check). */
#define LAYOUT_TRACE_CTX_SIZE 128
#define LAYOUT_TRACE_CTX_TRACE_ID 0
#define LAYOUT_TRACE_CTX_SPAN_ID 16
#define LAYOUT_TRACE_CTX_VALID 24
#define LAYOUT_TRACE_CTX_TRACE_FLAGS 25
#define LAYOUT_TRACE_CTX_ATTRS_SIZE 26
#define LAYOUT_TRACE_CTX_ATTRS 28
#define LAYOUT_CPU_SAMPLE_SIZE 1984
#define LAYOUT_CPU_SAMPLE_KIND 0
#define LAYOUT_CPU_SAMPLE_CPU 4
#define LAYOUT_CPU_SAMPLE_PID 8
#define LAYOUT_CPU_SAMPLE_TID 12
#define LAYOUT_CPU_SAMPLE_BOOT_NS 16
#define LAYOUT_CPU_SAMPLE_USER_FRAMES 24
#define LAYOUT_CPU_SAMPLE_USER_END 28
#define LAYOUT_CPU_SAMPLE_KERNEL_BYTES 32
#define LAYOUT_CPU_SAMPLE_WINDOW_BYTES 36
#define LAYOUT_CPU_SAMPLE_COMM 40
#define LAYOUT_CPU_SAMPLE_USER_SP 56
#define LAYOUT_CPU_SAMPLE_USER_BP 64
#define LAYOUT_CPU_SAMPLE_TRACE 72
#define LAYOUT_CPU_SAMPLE_WINDOW 200
#define LAYOUT_CPU_SAMPLE_USER 456
#define LAYOUT_CPU_SAMPLE_KERNEL 1472
#define LAYOUT_STACK_SNAPSHOT_SIZE 16416
#define LAYOUT_STACK_SNAPSHOT_BOOT_NS 8
#define LAYOUT_STACK_SNAPSHOT_SP 16
#define LAYOUT_STACK_SNAPSHOT_BYTES 24
#define LAYOUT_STACK_SNAPSHOT_DATA 32
#define LAYOUT_PROCESS_EVENT_SIZE 8
#define LAYOUT_PROCESS_EVENT_KIND 0
#define LAYOUT_PROCESS_EVENT_PID 4
#define LAYOUT_OFF_CPU_END_SIZE 24
#define LAYOUT_OFF_CPU_END_KIND 0
#define LAYOUT_OFF_CPU_END_TID 4
#define LAYOUT_OFF_CPU_END_START_NS 8
#define LAYOUT_OFF_CPU_END_END_NS 16
#define LAYOUT_USDT_ARG_SIZE 16
#define LAYOUT_USDT_ARG_VALUE 0
#define LAYOUT_USDT_ARG_KIND 8
#define LAYOUT_USDT_ARG_REG_OFF 12
#define LAYOUT_USDT_ARG_SIZE_FIELD 14
#define LAYOUT_USDT_SPEC_SIZE 56
#define LAYOUT_USDT_SPEC_PROBE 48
#define LAYOUT_ALLOC_SAMPLE_SIZE 2016
#define LAYOUT_ALLOC_SAMPLE_PTR 1984
#define LAYOUT_ALLOC_SAMPLE_SIZE_FIELD 1992
#define LAYOUT_ALLOC_SAMPLE_WEIGHT 2000
#define LAYOUT_ALLOC_SAMPLE_TRACKED 2008
#define LAYOUT_ALLOC_FREE_SIZE 16
#define LAYOUT_ALLOC_FREE_KIND 0
#define LAYOUT_ALLOC_FREE_PID 4
#define LAYOUT_ALLOC_FREE_PTR 8
#define LAYOUT_LIVE_KEY_SIZE 16
#define LAYOUT_UNWIND_RULE_SIZE 16
#define LAYOUT_UNWIND_RULE_KIND 12
#define LAYOUT_UNWIND_ROW_SIZE 8
#define LAYOUT_UNWIND_FILE_SIZE 16
#define LAYOUT_UNWIND_RANGE_SIZE 24
#define LAYOUT_UNWIND_RANGE_FILE 20
#define LAYOUT_UNWIND_PROC_SIZE 3080
#define LAYOUT_UNWIND_PROC_GEN 4
#define LAYOUT_UNWIND_PROC_RANGES 8
#define LAYOUT_THREAD_CTX_LOC_SIZE 32
#define LAYOUT_THREAD_CTX_LOC_GOT 8
#define LAYOUT_THREAD_CTX_LOC_TLS_OFFSET 16
#define LAYOUT_THREAD_CTX_LOC_KIND 24

#define LAYOUT_CHECK(what, value, expected) \
	_Static_assert((value) == (expected), \
		       "bpf/sample.h: " what " does not match its LAYOUT_ number; " \
		       "change the number and agent/src/record.rs with it")
LAYOUT_CHECK("sizeof(struct thread_ctx_loc)", sizeof(struct thread_ctx_loc), LAYOUT_THREAD_CTX_LOC_SIZE);
LAYOUT_CHECK("thread_ctx_loc.got", __builtin_offsetof(struct thread_ctx_loc, got), LAYOUT_THREAD_CTX_LOC_GOT);
LAYOUT_CHECK("thread_ctx_loc.tls_offset", __builtin_offsetof(struct thread_ctx_loc, tls_offset), LAYOUT_THREAD_CTX_LOC_TLS_OFFSET);
LAYOUT_CHECK("thread_ctx_loc.kind", __builtin_offsetof(struct thread_ctx_loc, kind), LAYOUT_THREAD_CTX_LOC_KIND);
LAYOUT_CHECK("sizeof(struct trace_ctx)", sizeof(struct trace_ctx), LAYOUT_TRACE_CTX_SIZE);
LAYOUT_CHECK("trace_ctx.trace_id", __builtin_offsetof(struct trace_ctx, trace_id), LAYOUT_TRACE_CTX_TRACE_ID);
LAYOUT_CHECK("trace_ctx.span_id", __builtin_offsetof(struct trace_ctx, span_id), LAYOUT_TRACE_CTX_SPAN_ID);
LAYOUT_CHECK("trace_ctx.valid", __builtin_offsetof(struct trace_ctx, valid), LAYOUT_TRACE_CTX_VALID);
LAYOUT_CHECK("trace_ctx.trace_flags", __builtin_offsetof(struct trace_ctx, trace_flags), LAYOUT_TRACE_CTX_TRACE_FLAGS);
LAYOUT_CHECK("trace_ctx.attrs_size", __builtin_offsetof(struct trace_ctx, attrs_size), LAYOUT_TRACE_CTX_ATTRS_SIZE);
LAYOUT_CHECK("trace_ctx.attrs", __builtin_offsetof(struct trace_ctx, attrs), LAYOUT_TRACE_CTX_ATTRS);
LAYOUT_CHECK("sizeof(struct cpu_sample)", sizeof(struct cpu_sample), LAYOUT_CPU_SAMPLE_SIZE);
LAYOUT_CHECK("cpu_sample.kind", __builtin_offsetof(struct cpu_sample, kind), LAYOUT_CPU_SAMPLE_KIND);
LAYOUT_CHECK("cpu_sample.cpu", __builtin_offsetof(struct cpu_sample, cpu), LAYOUT_CPU_SAMPLE_CPU);
LAYOUT_CHECK("cpu_sample.pid", __builtin_offsetof(struct cpu_sample, pid), LAYOUT_CPU_SAMPLE_PID);
LAYOUT_CHECK("cpu_sample.tid", __builtin_offsetof(struct cpu_sample, tid), LAYOUT_CPU_SAMPLE_TID);
LAYOUT_CHECK("cpu_sample.boot_ns", __builtin_offsetof(struct cpu_sample, boot_ns), LAYOUT_CPU_SAMPLE_BOOT_NS);
LAYOUT_CHECK("cpu_sample.user_frames", __builtin_offsetof(struct cpu_sample, user_frames), LAYOUT_CPU_SAMPLE_USER_FRAMES);
LAYOUT_CHECK("cpu_sample.user_end", __builtin_offsetof(struct cpu_sample, user_end), LAYOUT_CPU_SAMPLE_USER_END);
LAYOUT_CHECK("cpu_sample.kernel_bytes", __builtin_offsetof(struct cpu_sample, kernel_bytes), LAYOUT_CPU_SAMPLE_KERNEL_BYTES);
LAYOUT_CHECK("cpu_sample.window_bytes", __builtin_offsetof(struct cpu_sample, window_bytes), LAYOUT_CPU_SAMPLE_WINDOW_BYTES);
LAYOUT_CHECK("cpu_sample.comm", __builtin_offsetof(struct cpu_sample, comm), LAYOUT_CPU_SAMPLE_COMM);
LAYOUT_CHECK("cpu_sample.user_sp", __builtin_offsetof(struct cpu_sample, user_sp), LAYOUT_CPU_SAMPLE_USER_SP);
LAYOUT_CHECK("cpu_sample.user_bp", __builtin_offsetof(struct cpu_sample, user_bp), LAYOUT_CPU_SAMPLE_USER_BP);
LAYOUT_CHECK("cpu_sample.trace", __builtin_offsetof(struct cpu_sample, trace), LAYOUT_CPU_SAMPLE_TRACE);
LAYOUT_CHECK("cpu_sample.window", __builtin_offsetof(struct cpu_sample, window), LAYOUT_CPU_SAMPLE_WINDOW);
LAYOUT_CHECK("cpu_sample.user", __builtin_offsetof(struct cpu_sample, user), LAYOUT_CPU_SAMPLE_USER);
LAYOUT_CHECK("cpu_sample.kernel", __builtin_offsetof(struct cpu_sample, kernel), LAYOUT_CPU_SAMPLE_KERNEL);
LAYOUT_CHECK("sizeof(struct stack_snapshot)", sizeof(struct stack_snapshot), LAYOUT_STACK_SNAPSHOT_SIZE);
LAYOUT_CHECK("stack_snapshot.boot_ns", __builtin_offsetof(struct stack_snapshot, boot_ns), LAYOUT_STACK_SNAPSHOT_BOOT_NS);
LAYOUT_CHECK("stack_snapshot.sp", __builtin_offsetof(struct stack_snapshot, sp), LAYOUT_STACK_SNAPSHOT_SP);
LAYOUT_CHECK("stack_snapshot.bytes", __builtin_offsetof(struct stack_snapshot, bytes), LAYOUT_STACK_SNAPSHOT_BYTES);
LAYOUT_CHECK("stack_snapshot.data", __builtin_offsetof(struct stack_snapshot, data), LAYOUT_STACK_SNAPSHOT_DATA);
LAYOUT_CHECK("sizeof(struct process_event_record)", sizeof(struct process_event_record), LAYOUT_PROCESS_EVENT_SIZE);
LAYOUT_CHECK("process_event_record.kind", __builtin_offsetof(struct process_event_record, kind), LAYOUT_PROCESS_EVENT_KIND);
LAYOUT_CHECK("process_event_record.pid", __builtin_offsetof(struct process_event_record, pid), LAYOUT_PROCESS_EVENT_PID);
LAYOUT_CHECK("sizeof(struct off_cpu_end)", sizeof(struct off_cpu_end), LAYOUT_OFF_CPU_END_SIZE);
LAYOUT_CHECK("off_cpu_end.kind", __builtin_offsetof(struct off_cpu_end, kind), LAYOUT_OFF_CPU_END_KIND);
LAYOUT_CHECK("off_cpu_end.tid", __builtin_offsetof(struct off_cpu_end, tid), LAYOUT_OFF_CPU_END_TID);
LAYOUT_CHECK("off_cpu_end.start_ns", __builtin_offsetof(struct off_cpu_end, start_ns), LAYOUT_OFF_CPU_END_START_NS);
LAYOUT_CHECK("off_cpu_end.end_ns", __builtin_offsetof(struct off_cpu_end, end_ns), LAYOUT_OFF_CPU_END_END_NS);
LAYOUT_CHECK("sizeof(struct usdt_arg)", sizeof(struct usdt_arg), LAYOUT_USDT_ARG_SIZE);
LAYOUT_CHECK("usdt_arg.value", __builtin_offsetof(struct usdt_arg, value), LAYOUT_USDT_ARG_VALUE);
LAYOUT_CHECK("usdt_arg.kind", __builtin_offsetof(struct usdt_arg, kind), LAYOUT_USDT_ARG_KIND);
LAYOUT_CHECK("usdt_arg.reg_off", __builtin_offsetof(struct usdt_arg, reg_off), LAYOUT_USDT_ARG_REG_OFF);
LAYOUT_CHECK("usdt_arg.size", __builtin_offsetof(struct usdt_arg, size), LAYOUT_USDT_ARG_SIZE_FIELD);
LAYOUT_CHECK("sizeof(struct usdt_spec)", sizeof(struct usdt_spec), LAYOUT_USDT_SPEC_SIZE);
LAYOUT_CHECK("usdt_spec.probe", __builtin_offsetof(struct usdt_spec, probe), LAYOUT_USDT_SPEC_PROBE);
LAYOUT_CHECK("sizeof(struct alloc_sample)", sizeof(struct alloc_sample), LAYOUT_ALLOC_SAMPLE_SIZE);
LAYOUT_CHECK("alloc_sample.ptr", __builtin_offsetof(struct alloc_sample, ptr), LAYOUT_ALLOC_SAMPLE_PTR);
LAYOUT_CHECK("alloc_sample.size", __builtin_offsetof(struct alloc_sample, size), LAYOUT_ALLOC_SAMPLE_SIZE_FIELD);
LAYOUT_CHECK("alloc_sample.weight", __builtin_offsetof(struct alloc_sample, weight), LAYOUT_ALLOC_SAMPLE_WEIGHT);
LAYOUT_CHECK("alloc_sample.tracked", __builtin_offsetof(struct alloc_sample, tracked), LAYOUT_ALLOC_SAMPLE_TRACKED);
LAYOUT_CHECK("sizeof(struct alloc_free)", sizeof(struct alloc_free), LAYOUT_ALLOC_FREE_SIZE);
LAYOUT_CHECK("alloc_free.kind", __builtin_offsetof(struct alloc_free, kind), LAYOUT_ALLOC_FREE_KIND);
LAYOUT_CHECK("alloc_free.pid", __builtin_offsetof(struct alloc_free, pid), LAYOUT_ALLOC_FREE_PID);
LAYOUT_CHECK("alloc_free.ptr", __builtin_offsetof(struct alloc_free, ptr), LAYOUT_ALLOC_FREE_PTR);
LAYOUT_CHECK("sizeof(struct live_key)", sizeof(struct live_key), LAYOUT_LIVE_KEY_SIZE);
LAYOUT_CHECK("sizeof(struct unwind_rule)", sizeof(struct unwind_rule), LAYOUT_UNWIND_RULE_SIZE);
LAYOUT_CHECK("unwind_rule.kind", __builtin_offsetof(struct unwind_rule, kind), LAYOUT_UNWIND_RULE_KIND);
LAYOUT_CHECK("sizeof(struct unwind_row)", sizeof(struct unwind_row), LAYOUT_UNWIND_ROW_SIZE);
LAYOUT_CHECK("sizeof(struct unwind_file)", sizeof(struct unwind_file), LAYOUT_UNWIND_FILE_SIZE);
LAYOUT_CHECK("sizeof(struct unwind_range)", sizeof(struct unwind_range), LAYOUT_UNWIND_RANGE_SIZE);
LAYOUT_CHECK("unwind_range.file", __builtin_offsetof(struct unwind_range, file), LAYOUT_UNWIND_RANGE_FILE);
LAYOUT_CHECK("sizeof(struct unwind_proc)", sizeof(struct unwind_proc), LAYOUT_UNWIND_PROC_SIZE);
LAYOUT_CHECK("unwind_proc.gen", __builtin_offsetof(struct unwind_proc, gen), LAYOUT_UNWIND_PROC_GEN);
LAYOUT_CHECK("unwind_proc.ranges", __builtin_offsetof(struct unwind_proc, ranges), LAYOUT_UNWIND_PROC_RANGES);

/* Indices of the per-CPU `counters` array. */
enum counter {
	COUNTER_SAMPLES = 0,       /* samples written to the ring buffer */
	COUNTER_LOST = 1,          /* samples dropped: the ring buffer was full */
	COUNTER_KERNEL_THREAD = 2, /* samples of kernel threads, not recorded */
	COUNTER_EVENTS_LOST = 3,   /* exec/exit events dropped: ring buffer full */
	COUNTER_CTX_READ = 4,      /* samples with a valid trace context */
	COUNTER_CTX_UNREADABLE = 5,/* TLS slot or record not readable (garbage) */
	COUNTER_OFF_CPU = 6,       /* blocked switch-outs recorded */
	COUNTER_OFF_CPU_LOST = 7,  /* ... dropped: the ring buffer was full */
	COUNTER_OFF_CPU_FULL = 8,  /* ... dropped: no memory for the thread's start time */
	COUNTER_PREEMPTED = 9,     /* switch-outs of runnable threads (not recorded) */
	COUNTER_ALLOCS = 10,       /* sampled allocations recorded */
	COUNTER_ALLOCS_LOST = 11,  /* ... dropped: the ring buffer was full */
	COUNTER_LIVE_FULL = 12,    /* ... not tracked: the live map was full */
	COUNTER_FREES = 13,        /* frees of tracked allocations recorded */
	COUNTER_FREES_LOST = 14,   /* ... dropped: the ring buffer was full */
	COUNTER_USDT_UNREADABLE = 15, /* a probe's pointer argument unreadable */
	COUNTER_ALLOCS_THROTTLED = 16, /* sampled allocations thinned out over the rate bound */
	COUNTER_LIVE_PROCESS_FULL = 17, /* sampled allocations not tracked: their process holds its share of the live map */
	COUNTER_OFF_CPU_THROTTLED = 18, /* blocked switch-outs not recorded: their process is over its record rate */
	COUNTER_TICKS = 19,        /* runs of the CPU sampler, the idle CPUs' included */
	COUNTER_STEPS_FP = 20,     /* user frames stepped out of by frame pointer */
	COUNTER_STEPS_CFI = 21,    /* ... by a CFI rule */
	COUNTER_WALKS_EARLY = 22,  /* user stacks walked before their process's unwind ranges were set (by frame pointer alone) */
	COUNTER_SNAPSHOTS = 23,    /* ... of them, with their stack copied for userspace (struct stack_snapshot) */
	COUNTER_SNAPSHOTS_SKIPPED = 24, /* ... of them, not copied: the ring buffer held a backlog (the agent behind) */
	COUNTER_RULE_MEMO_HITS = 25, /* rule lookups of CPU samples' walks answered by the CPU's memo */
	COUNTER_COUNT = 26,
};

#endif
