/* What a hostile process on an agent's host does (issue #37), and the
 * service that must keep its profile beside it:
 *
 *   hostile burn SECONDS
 *       burns CPU in `burn_here`; prints "cpu S" (its CPU time) at the end
 *   hostile jit SECONDS DIR [FIFO]
 *       runs generated code (anonymous executable memory), writes a jitdump
 *       file DIR/jit-PID.dump (mapped executable, as perf finds them) with
 *       thousands of loads and then 4 MiB of moves each over the whole
 *       range; with FIFO, /tmp/perf-PID.map is a symlink to it (a reader
 *       that opens it wakes the writer blocked on it)
 *   hostile maps SECONDS FILE N
 *       maps FILE N times (each its own mapping: N lines of maps with its
 *       long path), then loops dlopen/dlclose of libz while burning CPU,
 *       in libz's crc32 (through dlsym) and its own code
 *
 * Built with frame pointers (clang -O1 -g -fno-omit-frame-pointer). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now(clockid_t clock)
{
	struct timespec ts;
	clock_gettime(clock, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) long burn_here(long n)
{
	long s = 0;
	for (long i = 0; i < n; i++) {
		s += i ^ (s >> 3);
		__asm__ volatile("" : "+r"(s)); /* no closed form, no hoisting */
	}
	return s;
}

static int burn(double seconds)
{
	double end = now(CLOCK_MONOTONIC) + seconds;
	long s = 0;
	while (now(CLOCK_MONOTONIC) < end)
		s += burn_here(200000 + (s & 1));
	printf("cpu %.3f %ld\n", now(CLOCK_PROCESS_CPUTIME_ID), s & 1);
	return 0;
}

/* mov rax, rdi; 1: dec rax; jnz 1b; ret */
static const unsigned char LOOP[] = {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3};

struct record_header {
	uint32_t id;
	uint32_t total_size;
	uint64_t timestamp;
};

static void put(FILE *f, const void *p, size_t n)
{
	if (fwrite(p, 1, n, f) != n)
		exit(3);
}

static int jit(double seconds, const char *dir, const char *fifo)
{
	size_t size = 1 << 20;
	unsigned char *code = mmap(NULL, size, PROT_READ | PROT_WRITE | PROT_EXEC,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (code == MAP_FAILED)
		return 2;
	for (size_t at = 0; at + sizeof(LOOP) <= size; at += 64)
		memcpy(code + at, LOOP, sizeof(LOOP));
	char path[4096];
	snprintf(path, sizeof path, "%s/jit-%d.dump", dir, getpid());
	FILE *f = fopen(path, "w+");
	if (!f)
		return 2;
	uint32_t header[10] = {0x4A695444, 1, 40, 62, 0, (uint32_t)getpid(), 0, 0, 0, 0};
	put(f, header, sizeof header);
	/* Loads: a symbol every 64 bytes of the code. */
	for (size_t at = 0; at < size; at += 64) {
		char name[64];
		int len = snprintf(name, sizeof name, "jitted_%zu", at / 64) + 1;
		struct record_header h = {0, (uint32_t)(16 + 40 + len + sizeof(LOOP)), 0};
		uint64_t body[5] = {(uint64_t)getpid(), (uint64_t)(uintptr_t)(code + at),
				    (uint64_t)(uintptr_t)(code + at), sizeof(LOOP), at / 64};
		put(f, &h, sizeof h);
		put(f, body, sizeof body);
		put(f, name, len);
		put(f, LOOP, sizeof(LOOP));
	}
	/* Moves: 4 MiB of them, each over the whole range and back. */
	for (int i = 0; i < (4 << 20) / 64; i++) {
		struct record_header h = {1, 64, 0};
		uint64_t from = (uint64_t)(uintptr_t)code, to = from + (1ull << 40);
		if (i & 1) {
			uint64_t t = from;
			from = to;
			to = t;
		}
		uint64_t body[6] = {(uint64_t)getpid(), from, from, to, 1ull << 39, i};
		put(f, &h, sizeof h);
		put(f, body, sizeof body);
	}
	fflush(f);
	long len = ftell(f);
	void *mapped = mmap(NULL, len, PROT_READ | PROT_EXEC, MAP_PRIVATE, fileno(f), 0);
	if (mapped == MAP_FAILED)
		return 2;
	if (fifo) {
		char link[64];
		snprintf(link, sizeof link, "/tmp/perf-%d.map", getpid());
		unlink(link);
		if (symlink(fifo, link))
			return 2;
	}
	printf("ready %d\n", getpid());
	fflush(stdout);
	long (*run)(long) = (long (*)(long))code;
	double end = now(CLOCK_MONOTONIC) + seconds;
	size_t at = 0;
	while (now(CLOCK_MONOTONIC) < end) {
		run(1 << 16);
		((long (*)(long))(code + at))(1 << 10);
		at = (at + 64) % size;
	}
	(void)run;
	if (fifo) {
		char link[64];
		snprintf(link, sizeof link, "/tmp/perf-%d.map", getpid());
		unlink(link);
	}
	printf("cpu %.3f\n", now(CLOCK_PROCESS_CPUTIME_ID));
	return 0;
}

static unsigned char crc_buf[64 << 10];
static volatile unsigned long crc_sum;

static int maps(double seconds, const char *file, long n)
{
	int fd = open(file, O_RDONLY);
	if (fd < 0)
		return 2;
	/* Every other page of a reserved range: no two mappings touch, so the
	 * kernel merges none. */
	long page = sysconf(_SC_PAGESIZE);
	char *base = n > 0 ? mmap(NULL, 2 * n * page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0)
			   : NULL;
	if (base == MAP_FAILED)
		return 2;
	long mapped = 0;
	for (long i = 0; i < n; i++) {
		if (mmap(base + 2 * i * page, page, PROT_READ | PROT_EXEC, MAP_PRIVATE | MAP_FIXED,
			 fd, 0) != MAP_FAILED)
			mapped++;
	}
	printf("ready %ld\n", mapped);
	fflush(stdout);
	double end = now(CLOCK_MONOTONIC) + seconds;
	long loads = 0;
	while (now(CLOCK_MONOTONIC) < end) {
		void *h = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
		if (h) {
			/* Its code runs, so its samples name it (not only the
			 * loader's frames that map it). */
			unsigned long (*crc)(unsigned long, const unsigned char *, unsigned) =
				(unsigned long (*)(unsigned long, const unsigned char *, unsigned))dlsym(h, "crc32");
			if (crc)
				crc_sum += crc(0, crc_buf, sizeof(crc_buf));
			dlclose(h);
			loads++;
		}
		burn_here(2000);
	}
	printf("cpu %.3f loads %ld\n", now(CLOCK_PROCESS_CPUTIME_ID), loads);
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 3 && !strcmp(argv[1], "burn"))
		return burn(atof(argv[2]));
	if (argc >= 4 && !strcmp(argv[1], "jit"))
		return jit(atof(argv[2]), argv[3], argc > 4 ? argv[4] : NULL);
	if (argc >= 5 && !strcmp(argv[1], "maps"))
		return maps(atof(argv[2]), argv[3], atol(argv[4]));
	fprintf(stderr, "usage: hostile burn|jit|maps ...\n");
	return 1;
}
