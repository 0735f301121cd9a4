// SPDX-License-Identifier: GPL-2.0
/* An empty program on the tracepoint the agent's off-CPU sampler uses, for
 * bench/agent-overhead.sh: with kernel.bpf_stats_enabled, what the kernel
 * counts as a BPF program's run time includes two clock reads of its own;
 * this program's run time per run is that floor. */
#include "../../agent/bpf/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

SEC("tp_btf/sched_switch")
int BPF_PROG(empty_switch, bool preempt, struct task_struct *prev, struct task_struct *next)
{
	return 0;
}

char LICENSE[] SEC("license") = "GPL";
