/* Test workload for JIT frames (issue #24): generated code in anonymous
 * executable memory, named the two ways runtimes name it.
 *
 *   jitgen jitdump DIR SECONDS
 *     writes DIR/jit-PID.dump and maps it executable (as perf's readers
 *     expect), loads spin_a (with JIT_CODE_DEBUG_INFO: gen.js lines 10 and
 *     11), spin_b, and spin_moved (loaded at one address, then copied and
 *     JIT_CODE_MOVEd), and runs them 3:1:1 for SECONDS.
 *   jitgen perfmap SECONDS ENTRIES
 *     writes /tmp/perf-PID.map: the hot code first as "stale_hot", then
 *     over the same range as "hot_named" (the later line wins), then, in
 *     20 slices over SECONDS, ENTRIES more lines of code never run, with a
 *     malformed line every 1,000 (and one 10 KB line), and after each
 *     slice's lines a new piece of code, "fresh_K", that it runs a quarter
 *     of the slice (its first samples miss: the reader reads on). Prints
 *     "garbage N".
 *
 * Prints "ran A B M" (seconds of CPU in each generated function).
 * Build: clang -O1 -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

/* push %rbp; mov %rsp,%rbp; 1: dec %rdi; jnz 1b; pop %rbp; ret */
static const unsigned char SPIN[] = {0x55, 0x48, 0x89, 0xe5, 0x48, 0xff, 0xcf, 0x75, 0xfb, 0x5d, 0xc3};
typedef void (*spin_fn)(uint64_t);

static double cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1000000000ull + ts.tv_nsec;
}

static FILE *dump;

static void record(uint32_t id, const void *body, size_t len, const void *tail, size_t tail_len)
{
	uint32_t head[2] = {id, (uint32_t)(16 + len + tail_len)};
	uint64_t ts = now_ns();
	fwrite(head, sizeof head, 1, dump);
	fwrite(&ts, sizeof ts, 1, dump);
	fwrite(body, len, 1, dump);
	if (tail_len)
		fwrite(tail, tail_len, 1, dump);
	fflush(dump);
}

static void load(unsigned char *code, const char *name)
{
	unsigned char body[40 + 64] = {0};
	uint32_t ids[2] = {getpid(), getpid()};
	uint64_t fields[4] = {(uint64_t)code, (uint64_t)code, sizeof SPIN, 0};
	memcpy(body, ids, 8);
	memcpy(body + 8, fields, 32);
	size_t n = strlen(name) + 1;
	memcpy(body + 40, name, n);
	record(0, body, 40 + n, code, sizeof SPIN);
}

static void debug_info(unsigned char *code)
{
	unsigned char body[256];
	size_t at = 0;
	uint64_t head[2] = {(uint64_t)code, 2};
	memcpy(body, head, 16);
	at = 16;
	const char *file = "/srv/gen.js";
	uint64_t addrs[2] = {(uint64_t)code, (uint64_t)code + 4};
	uint32_t lines[2] = {10, 11};
	for (int i = 0; i < 2; i++) {
		uint32_t ld[2] = {lines[i], 0};
		memcpy(body + at, &addrs[i], 8);
		memcpy(body + at + 8, ld, 8);
		at += 16;
		if (i == 0) {
			memcpy(body + at, file, strlen(file) + 1);
			at += strlen(file) + 1;
		} else {
			body[at++] = 0xff; /* the previous entry's file */
			body[at++] = 0;
		}
	}
	record(2, body, at, NULL, 0);
}

static void move(unsigned char *from, unsigned char *to)
{
	unsigned char body[48];
	uint32_t ids[2] = {getpid(), getpid()};
	uint64_t fields[5] = {(uint64_t)to, (uint64_t)from, (uint64_t)to, sizeof SPIN, 0};
	memcpy(body, ids, 8);
	memcpy(body + 8, fields, 40);
	record(1, body, sizeof body, NULL, 0);
}

/* Runs fn in slices of `weight` until `seconds` of CPU passed in all. */
static void run(spin_fn fns[], const int weights[], int n, double seconds, double used[])
{
	double start = cpu_seconds();
	while (cpu_seconds() - start < seconds) {
		for (int i = 0; i < n; i++) {
			double t = cpu_seconds();
			for (int k = 0; k < weights[i]; k++)
				fns[i](2000000);
			used[i] += cpu_seconds() - t;
		}
	}
}

int main(int argc, char **argv)
{
	if (argc < 4) {
		fprintf(stderr, "usage: jitgen jitdump DIR SECONDS | jitgen perfmap SECONDS ENTRIES\n");
		return 2;
	}
	unsigned char *code = mmap(NULL, 1 << 16, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (code == MAP_FAILED)
		return 1;
	for (int i = 0; i < 64; i++)
		memcpy(code + 0x100 * i, SPIN, sizeof SPIN);
	double used[3] = {0};
	if (!strcmp(argv[1], "jitdump")) {
		char path[4096];
		snprintf(path, sizeof path, "%s/jit-%d.dump", argv[2], getpid());
		dump = fopen(path, "w+");
		if (!dump)
			return 1;
		uint32_t header[6] = {0x4A695444, 1, 40, 62, 0, getpid()};
		uint64_t header_tail[2] = {now_ns(), 0};
		fwrite(header, sizeof header, 1, dump);
		fwrite(header_tail, sizeof header_tail, 1, dump);
		fflush(dump);
		/* How perf finds the file: an executable mapping of it. */
		if (mmap(NULL, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fileno(dump), 0) == MAP_FAILED)
			return 1;
		debug_info(code);
		load(code, "spin_a");
		load(code + 0x100, "spin_b");
		load(code + 0x200, "spin_moved");
		move(code + 0x200, code + 0x300);
		spin_fn fns[3] = {(spin_fn)code, (spin_fn)(code + 0x100), (spin_fn)(code + 0x300)};
		int weights[3] = {3, 1, 1};
		run(fns, weights, 3, atof(argv[3]), used);
	} else if (!strcmp(argv[1], "perfmap")) {
		char path[64];
		snprintf(path, sizeof path, "/tmp/perf-%d.map", getpid());
		FILE *map = fopen(path, "w");
		if (!map)
			return 1;
		fprintf(map, "%lx %zx stale_hot\n", (unsigned long)code, sizeof SPIN);
		fprintf(map, "0x%lx 0x%zx hot_named\n", (unsigned long)code, sizeof SPIN);
		fflush(map);
		double seconds = atof(argv[2]);
		long entries = atol(argv[3]), written = 0, garbage = 0;
		int slices = 20;
		spin_fn fns[2] = {(spin_fn)code, NULL};
		int weights[2] = {3, 1};
		for (int s = 0; s < slices; s++) {
			for (long i = 0; i < entries / slices; i++, written++) {
				if (written % 1000 == 0) {
					fprintf(map, written % 2000 ? "not a perf map line\n" : "zz 10 bad_start\n");
					garbage++;
				}
				fprintf(map, "%lx 40 JS:*generated_%ld /srv/never_run.js:%ld:1\n",
					0x500000000000ul + written * 0x40, written, written % 5000 + 1);
			}
			if (s == slices / 2) {
				for (int k = 0; k < 10000; k++)
					fputc('x', map);
				fputc('\n', map);
				garbage++;
			}
			unsigned char *fresh = code + 0x100 * (1 + s);
			fprintf(map, "%lx %zx fresh_%d\n", (unsigned long)fresh, sizeof SPIN, s);
			fflush(map);
			fns[1] = (spin_fn)fresh;
			run(fns, weights, 2, seconds / slices, used);
		}
		fclose(map);
		printf("garbage %ld\n", garbage);
	} else {
		return 2;
	}
	printf("ran %.3f %.3f %.3f\n", used[0], used[1], used[2]);
	return 0;
}
