/* The user-stack walk (included by profile.bpf.c): at each frame, the CFI
 * rule of the address when its file's unwind table is loaded (built by
 * userspace from .eh_frame, see sample.h), else a checked frame-pointer
 * step — the register state (%rip, %rsp, %rbp) carried from frame to
 * frame, so the walk goes from frameless code (a distribution's libc, a
 * vendor library) to framed or JIT code and back. One frame per bpf_loop
 * iteration: the verifier checks the step once, whatever the depth. */
#ifndef SYMTRACE_UNWIND_BPF_H
#define SYMTRACE_UNWIND_BPF_H

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, 1 << 20); /* resized by the loader (--unwind-table-bytes) */
	__type(key, __u32);
	__type(value, struct unwind_row);
} unwind_rows SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNWIND_RULES);
	__type(key, __u32);
	__type(value, struct unwind_rule);
} unwind_rules SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, UNWIND_FILES);
	__type(key, __u32);
	__type(value, struct unwind_file);
} unwind_files SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__uint(max_entries, UNWIND_PROCS);
	__type(key, __u32);
	__type(value, struct unwind_proc);
} unwind_procs SEC(".maps");

/* The processes whose walk found no ranges and asked the agent for them,
 * once each (until they exec or exit): a new process is read at its first
 * sample, not at the agent's next drain, so its stacks are walked by its
 * tables within milliseconds. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, UNWIND_ASKED);
	__type(key, __u32);
	__type(value, __u8);
} unwind_asked SEC(".maps");

/* Process `tgid`'s unwind ranges, or NULL (none set yet). */
static __always_inline struct unwind_proc *proc_of(__u32 tgid)
{
	return bpf_map_lookup_elem(&unwind_procs, &tgid);
}

static __always_inline void ask_for_ranges(__u32 tgid)
{
	__u8 one = 1;
	if (bpf_map_update_elem(&unwind_asked, &tgid, &one, BPF_NOEXIST))
		return; /* asked already */
	__u32 *pid = bpf_ringbuf_reserve(&exec_wakeups, sizeof(*pid), 0);
	if (pid) {
		*pid = tgid | UNWIND_MISS_BIT;
		bpf_ringbuf_submit(pid, BPF_RB_FORCE_WAKEUP);
	}
}

/* The walk's registers and how it ended: scalars only, so the global
 * function walk_one can take a pointer to them. */
struct walk_regs {
	__u64 ip, sp, bp;
	__u32 end;  /* enum user_stack_end, and USER_END_LEAF_CFI */
	__u32 last; /* the range of the previous lookup's hit + 1 (0: none) */
	__u32 tgid;
	__u32 pad;
};

/* Each CPU's memo of the rules its recent walks looked up, by process,
 * address and leaf-ness: a sampled service's stacks repeat (the same
 * return addresses in its loops, its thread entry, libc's start_thread
 * and clone3), and a lookup through the ranges, the page index and the
 * rows touches a dozen cache lines, each a miss at 97 Hz, where a memo
 * hit touches one. An entry holds only while its process's ranges are
 * those it was found with (unwind_proc.gen, which the agent changes at
 * each write of a process's ranges: a mapping changed, a table evicted
 * and its slot given to another file, a pid reused), so it never
 * outlives what it was computed from. Only the CPU sample program uses
 * it: that program does not nest in itself on a CPU, and no other
 * program touching the memo runs in it, so an entry is never seen half
 * written. RULE_UNKNOWN in a hit: step by frame pointer. */
#define RULE_MEMO_SLOTS 128 /* a power of two */
struct rule_memo {
	__u64 pc;   /* the looked-up address | RULE_MEMO_LEAF */
	__u32 tgid; /* 0: empty (the idle task is never walked) */
	__u32 gen;
	struct unwind_rule rule;
};
#define RULE_MEMO_LEAF (1ULL << 63)

struct rule_memos {
	struct rule_memo e[RULE_MEMO_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rule_memos);
} rule_memos SEC(".maps");

/* The walk's state, on the program's stack (bpf_loop hands the callback a
 * pointer to it); frames go straight into the record. */
struct walk_ctx {
	struct walk_regs w;
	struct cpu_sample *s;
	struct unwind_proc *proc; /* NULL: no table for this process */
	struct rule_memos *memo;  /* NULL: none (not the CPU sample program) */
};

/* 1 when a <= b, without a branch: the searches below must not fork the
 * verifier's paths at every step (two ways per step over 24 steps is 2^24
 * paths); the empty asm hides the value from the compiler, which would
 * turn the arithmetic back into a branch. */
static __always_inline __u64 at_most(__u64 a, __u64 b)
{
	__u64 le = ((b - a) >> 63) ^ 1; /* a, b < 2^63 */
	asm volatile("" : "+r"(le));
	return le;
}

/* The rule index (in unwind_rules) for offset `off` of the table in file
 * slot `slot`, or -1: no table; the file keeps frame pointers and this is
 * not the leaf; no row covers `off`. The rows searched are those of the
 * offset's page (struct unwind_file): a few cache lines, not the whole
 * table's. Both searches here find the last entry whose start is at most
 * the key: halve the candidates, move the base up by the lower half when
 * its last entry qualifies. */
static __always_inline int file_rule(__u32 slot, __u64 off, int leaf)
{
	struct unwind_file *f = bpf_map_lookup_elem(&unwind_files, &slot);
	if (!f || !f->count || !f->pages)
		return -1;
	if (!leaf && (f->flags & UNWIND_FILE_FRAMED))
		return -1;
	if (off >> 32)
		return -1;
	/* page = min(off >> shift, pages - 1), branchless. */
	__u32 pages = f->pages;
	__u64 page = off >> ((f->flags >> UNWIND_FILE_SHIFT_AT) & 63);
	__u64 past = at_most(pages, page);
	page = page * (1 - past) + (pages - 1) * past;
	__u32 count = f->count;
	__u32 key = f->first + count + (__u32)page;
	struct unwind_row *span = bpf_map_lookup_elem(&unwind_rows, &key);
	if (!span || span->rule < span->start || span->rule >= count)
		return -1;
	__u32 first = f->first + span->start;
	__u32 n = span->rule - span->start + 1;
	__u32 base = 0;
	for (int k = 0; k < UNWIND_SEARCH_STEPS + 1; k++) {
		if (n <= 1)
			break;
		__u32 half = n / 2;
		key = first + base + half;
		struct unwind_row *row = bpf_map_lookup_elem(&unwind_rows, &key);
		if (!row)
			return -1;
		base += half * at_most(row->start, off);
		n -= half;
	}
	key = first + base;
	struct unwind_row *row = bpf_map_lookup_elem(&unwind_rows, &key);
	if (!row || row->start > off || row->rule >= UNWIND_RULES)
		return -1;
	return row->rule;
}

/* The rule for `pc` in the process's tables, or NULL (no mapping with a
 * table covers it; see file_rule). */
static __always_inline const struct unwind_rule *rule_at(struct walk_regs *w,
							 struct unwind_proc *proc, __u64 pc,
							 int leaf)
{
	__u32 n = proc->count;
	if (n == 0 || n > UNWIND_PROC_RANGES)
		return 0;
	/* Callers are mostly in the file of their callee: the previous hit
	 * first. */
	struct unwind_range *r = &proc->ranges[(w->last - 1) & (UNWIND_PROC_RANGES - 1)];
	if (!w->last || pc < r->start || pc - r->start >= r->len) {
		__u32 base = 0;
		for (int k = 0; k < 8; k++) { /* log2(UNWIND_PROC_RANGES) + 1 */
			if (n <= 1)
				break;
			__u32 half = n / 2;
			__u32 mid = (base + half) & (UNWIND_PROC_RANGES - 1);
			base += half * at_most(proc->ranges[mid].start, pc);
			n -= half;
		}
		base &= UNWIND_PROC_RANGES - 1;
		r = &proc->ranges[base];
		if (pc < r->start || pc - r->start >= r->len)
			return 0;
		w->last = base + 1;
	}
	__u32 file = r->file;
	if (!leaf && (file & UNWIND_RANGE_FRAMED))
		return 0;
	int rule = file_rule(file & ~UNWIND_RANGE_FRAMED, pc - r->adjust, leaf);
	if (rule < 0)
		return 0;
	__u32 index = rule;
	return bpf_map_lookup_elem(&unwind_rules, &index);
}

/* rule_at through this CPU's memo (`memo` NULL: rule_at). */
static __always_inline const struct unwind_rule *memo_rule(struct walk_regs *w,
							   struct unwind_proc *proc,
							   struct rule_memos *memo, __u64 pc,
							   int leaf)
{
	if (!memo)
		return rule_at(w, proc, pc, leaf);
	__u64 key = pc | (leaf ? RULE_MEMO_LEAF : 0);
	__u32 slot = ((key ^ w->tgid) * 0x9E3779B97F4A7C15ULL) >> 32;
	struct rule_memo *e = &memo->e[slot & (RULE_MEMO_SLOTS - 1)];
	__u32 gen = proc->gen;
	if (e->pc == key && e->tgid == w->tgid && e->gen == gen) {
		count(COUNTER_RULE_MEMO_HITS);
		return &e->rule;
	}
	const struct unwind_rule *rule = rule_at(w, proc, pc, leaf);
	e->pc = key;
	e->tgid = w->tgid;
	e->gen = gen;
	if (rule)
		e->rule = *rule;
	else
		__builtin_memset(&e->rule, 0, sizeof(e->rule)); /* RULE_UNKNOWN */
	return rule;
}

/* One step of the walk: out of frame `i` (whose %rip, %rsp and %rbp are
 * in `w`) into its caller's, by the CFI rule of the address when `proc`
 * (the process's ranges; NULL: none yet) has its file's table, else by
 * frame pointer, checked. 0: go on from the caller; 1: the walk ended
 * (w->end says how). A global function: the verifier checks it once, on
 * its own, with any registers; the walk's loop then has nothing to tell
 * apart from one frame to the next (its states repeat at once), where
 * the step inlined made it follow each path through the searches again
 * for each combination of the registers' known values. */
__attribute__((noinline)) int walk_one(struct walk_regs *w, struct unwind_proc *proc,
					struct rule_memos *memo, __u32 i)
{
	if (!w)
		return 1;
	__u64 ip = w->ip, sp = w->sp, bp = w->bp;
	/* A caller's return address is the instruction after its call: the
	 * rule that holds at the call is the one before it. */
	__u64 pc = i ? ip - 1 : ip;
	const struct unwind_rule *rule = 0;
	if (proc)
		rule = memo_rule(w, proc, memo, pc, i == 0);
	if (rule && rule->kind == RULE_OUTERMOST) {
		w->end = (i == 0 ? USER_END_LEAF_CFI : (w->end & USER_END_LEAF_CFI)) |
			 USER_END_OUTERMOST;
		return 1;
	}
	if (rule && (rule->kind == RULE_RSP || rule->kind == RULE_RBP)) {
		__u64 cfa = (rule->kind == RULE_RSP ? sp : bp) + (__s64)rule->cfa;
		__u64 ra = 0;
		if (i == 0)
			w->end = USER_END_LEAF_CFI;
		/* The caller's frame is above this one: a rule from %rbp that
		 * points below %rsp is a clobbered %rbp, not a frame. */
		if (cfa <= sp || cfa >= USER_ADDRESS_LIMIT) {
			w->end |= USER_END_NOT_INCREASING;
			return 1;
		}
		/* The caller's %rbp is most often pushed just below the return
		 * address (push %rbp after the call): one read for both. */
		__u64 pair[2]; /* the saved %rbp, the return address */
		long failed;
		if (rule->rbp_saved && rule->rbp == rule->ra - 8) {
			failed = bpf_probe_read_user(pair, sizeof(pair),
						     (void *)(cfa + (__s64)rule->rbp));
			bp = pair[0];
			ra = pair[1];
		} else {
			failed = bpf_probe_read_user(&ra, sizeof(ra), (void *)(cfa + (__s64)rule->ra));
			if (!failed && rule->rbp_saved)
				failed = bpf_probe_read_user(&bp, sizeof(bp),
							     (void *)(cfa + (__s64)rule->rbp));
		}
		if (failed) {
			w->end |= USER_END_UNREADABLE;
			return 1;
		}
		count(COUNTER_STEPS_CFI);
		if (!ra || ra >= USER_ADDRESS_LIMIT) {
			w->end |= USER_END_ROOT;
			return 1;
		}
		w->ip = ra;
		w->sp = cfa;
		w->bp = bp;
		return 0;
	}
	/* By frame pointer, checked: the frame must be 8-aligned, readable and
	 * not below %rsp (each one above the last), so a garbage %rbp ends the
	 * walk instead of adding frames. */
	__u64 frame[2]; /* the saved %rbp, the return address */
	__u32 leaf = w->end & USER_END_LEAF_CFI;
	if (!bp) {
		w->end = leaf | USER_END_ROOT;
		return 1;
	}
	if ((bp & 7) || bp >= USER_ADDRESS_LIMIT ||
	    bpf_probe_read_user(frame, sizeof(frame), (void *)bp)) {
		w->end = leaf | USER_END_UNREADABLE;
		return 1;
	}
	if (bp < sp) {
		w->end = leaf | USER_END_NOT_INCREASING;
		return 1;
	}
	count(COUNTER_STEPS_FP);
	if (!frame[1]) {
		w->end = leaf | USER_END_ROOT;
		return 1;
	}
	w->ip = frame[1];
	w->sp = bp + 16;
	w->bp = frame[0];
	return 0;
}

static long walk_step(__u64 index, void *data)
{
	struct walk_ctx *c = data;
	/* The frame's number is the loop's index (unknown to the verifier,
	 * so it checks the step once). */
	if (index >= USER_STACK_DEPTH) {
		c->w.end = (c->w.end & USER_END_LEAF_CFI) | USER_END_DEPTH;
		return 1;
	}
	__u32 i = index;
	c->s->user[i] = c->w.ip;
	long ended = walk_one(&c->w, c->proc, c->memo, i);
	/* The verifier knows nothing of a global function's answer and a
	 * callback must return 0 or 1; clang knows it does (the barrier keeps
	 * the test it would drop). */
	asm volatile("" : "+r"(ended));
	return ended ? 1 : 0;
}

/* Walks the user stack from (ip, sp, bp) into s->user, by process
 * `tgid`'s unwind ranges `proc` (proc_of; NULL: none yet), through this
 * CPU's rule memo `memo` (NULL: none). */
static __always_inline void walk_user_stack(__u32 tgid, __u64 ip, __u64 sp, __u64 bp,
					    struct cpu_sample *s, struct unwind_proc *proc,
					    struct rule_memos *memo)
{
	struct walk_ctx c = {
		.w = {.ip = ip, .sp = sp, .bp = bp, .tgid = tgid},
		.s = s,
		.proc = proc,
		.memo = memo,
	};
	if (!c.proc) {
		ask_for_ranges(tgid);
		count(COUNTER_WALKS_EARLY);
	}
	long loops = bpf_loop(USER_STACK_DEPTH + 1, walk_step, &c, 0);
	if (loops <= 0) {
		s->user[0] = ip;
		s->user_frames = 1;
		s->user_end = USER_END_DEPTH;
		return;
	}
	/* Every step writes its frame, but for the one past the deepest. */
	__u32 n = loops > USER_STACK_DEPTH ? USER_STACK_DEPTH : loops;
	s->user_frames = n;
	s->user_end = c.w.end;
}

#endif
