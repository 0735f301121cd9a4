/* Loads empty_switch.bpf.o, attaches it to sched_switch for SECONDS and
 * prints its runs and run time as the kernel's BPF run-time statistics count
 * them: "empty program: N runs, T ns, X ns per run".
 *
 *   ./empty_switch OBJECT SECONDS */
#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s OBJECT SECONDS\n", argv[0]);
		return 2;
	}
	int stats = bpf_enable_stats(BPF_STATS_RUN_TIME); /* on while open */
	if (stats < 0) {
		fprintf(stderr, "enabling BPF run-time statistics failed\n");
		return 1;
	}
	struct bpf_object *obj = bpf_object__open_file(argv[1], NULL);
	if (!obj || bpf_object__load(obj)) {
		fprintf(stderr, "loading %s failed\n", argv[1]);
		return 1;
	}
	struct bpf_program *prog = bpf_object__find_program_by_name(obj, "empty_switch");
	struct bpf_link *link = prog ? bpf_program__attach(prog) : NULL;
	if (!link) {
		fprintf(stderr, "attaching to sched_switch failed\n");
		return 1;
	}
	struct bpf_prog_info before = {0}, after = {0};
	__u32 len = sizeof(before);
	bpf_obj_get_info_by_fd(bpf_program__fd(prog), &before, &len);
	sleep((unsigned)atoi(argv[2]));
	len = sizeof(after);
	bpf_obj_get_info_by_fd(bpf_program__fd(prog), &after, &len);
	unsigned long long runs = after.run_cnt - before.run_cnt;
	unsigned long long ns = after.run_time_ns - before.run_time_ns;
	printf("empty program: %llu runs, %llu ns, %.1f ns per run\n", runs, ns,
	       runs ? (double)ns / runs : 0.0);
	bpf_link__destroy(link);
	bpf_object__close(obj);
	close(stats);
	return 0;
}
