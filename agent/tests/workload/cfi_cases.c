/* Stacks through code without frame pointers (issue #40), for
 * agent/tests/cfi.rs. This file is built with frame pointers (or, for the
 * "plain" build, with nothing but -O2); cfi_vendor.c always with -O2
 * -fomit-frame-pointer. Each mode burns CPU for SECONDS of thread CPU time
 * and prints "MODE SECONDS-USED":
 *   qsort    main -> run -> glibc's qsort -> cmp_ints          (Debian's libc)
 *   vendor   main -> run -> vendor_outer -> vendor_inner -> framed_cb
 *                                           (two frameless levels)
 *   zlib     main -> run -> zwork -> zlib's crc32              (Debian's zlib)
 *   corrupt  main -> run -> corrupt_spin, which overwrote its own saved
 *            %rbp and return address: its stack cannot be walked
 *   deep-qsort main -> deep -> run -> qsort -> cmp_ints, deep holding 8 KiB
 *            of locals: at the comparator the main thread's stack is 8.3 to
 *            10 KiB deep (qsort's merge sort recurses) — more than a copy of
 *            8 KiB holds, less than 16 KiB; run with an empty environment,
 *            the stack's mapping ends 0.5 to 8.5 KiB above the initial
 *            stack pointer (the kernel's random padding), so a copy of 16
 *            KiB from the comparator's stack pointer most often runs past
 *            it */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned len);
void vendor_outer(int rounds);

static double cpu_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void framed_cb(void)
{
	for (int i = 0; i < 3000; i++)
		sink += i;
}

__attribute__((noinline)) int cmp_ints(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	for (int i = 0; i < 20; i++)
		sink += i;
	return (x > y) - (x < y);
}

__attribute__((noinline)) void zwork(const unsigned char *buf, unsigned len)
{
	sink += crc32(0, buf, len);
}

/* Overwrites its frame (the saved %rbp and the return address) with
 * garbage and spins: it never returns. */
__attribute__((noinline)) void corrupt_spin(double until)
{
	volatile unsigned long *frame = __builtin_frame_address(0);
	frame[0] = 0x10000000000bULL; /* unaligned and unmapped */
	frame[1] = 0x20000000000cULL; /* no code there */
	while (cpu_now() < until)
		for (int i = 0; i < 100000; i++)
			sink += i;
	exit(0); /* the frame is gone: no return */
}

__attribute__((noinline)) double run(const char *mode, double seconds)
{
	static int values[4096];
	static unsigned char bytes[1 << 16];
	memset(bytes, 7, sizeof bytes);
	double start = cpu_now();
	if (!strcmp(mode, "corrupt")) {
		printf("corrupt %.6f\n", seconds);
		fflush(stdout);
		corrupt_spin(start + seconds);
	}
	while (cpu_now() - start < seconds) {
		if (!strcmp(mode, "vendor")) {
			vendor_outer(20);
		} else if (!strcmp(mode, "qsort")) {
			for (int i = 0; i < 4096; i++)
				values[i] = (i * 7919) % 4096;
			qsort(values, 4096, sizeof values[0], cmp_ints);
		} else if (!strcmp(mode, "zlib")) {
			zwork(bytes, sizeof bytes);
		} else {
			fprintf(stderr, "unknown mode %s\n", mode);
			exit(2);
		}
	}
	return cpu_now() - start;
}

__attribute__((noinline)) double deep(const char *mode, double seconds)
{
	volatile char pad[8 << 10];
	pad[0] = 1;
	pad[sizeof pad - 1] = 1;
	double used = run(mode, seconds);
	sink += pad[0] + pad[sizeof pad - 1];
	return used;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s qsort|vendor|zlib|corrupt|deep-qsort SECONDS\n",
			argv[0]);
		return 2;
	}
	double used = !strcmp(argv[1], "deep-qsort") ? deep("qsort", atof(argv[2]))
						     : run(argv[1], atof(argv[2]));
	printf("%s %.6f\n", argv[1], used);
	return 0;
}
