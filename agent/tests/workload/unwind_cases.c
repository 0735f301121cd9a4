/* Test workload for the agent's unwinding (agent/tests/unwind.rs), built by
 * gcc and clang with exactly the mission's flags:
 *   -O1|-O2 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 * gcc 12 gives `leaf_spin` and `tiny` no frame (it ignores
 * -mno-omit-leaf-frame-pointer at -O1/-O2), so the frame-pointer chain
 * skips their callers unless the agent steps out of the leaf by CFI.
 *
 *   unwind_cases split GAMMA DELTA   dispatch → gamma_work / delta_work →
 *                                    leaf_spin, for GAMMA and DELTA thread
 *                                    CPU seconds; prints what each used
 *   unwind_cases tiny SECONDS        tiny_loop calls tiny() in a tight loop
 *                                    (samples land in its prologue/epilogue)
 *   unwind_cases qsort SECONDS       sort_work → libc qsort → cmp_ints
 *   unwind_cases vdso SECONDS        clock_work → clock_gettime (the vDSO)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static volatile unsigned long sink;

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) unsigned long leaf_spin(unsigned long n)
{
	unsigned long s = 0;
	for (unsigned long i = 0; i < n; i++) {
		s += (i * i) ^ (s >> 3);
		__asm__ volatile("" : "+r"(s)); /* not pure: not hoisted, not vectorized */
	}
	return s;
}

__attribute__((noinline)) double gamma_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		sink += leaf_spin(200000);
	return thread_cpu_seconds() - start;
}

__attribute__((noinline)) double delta_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		sink += leaf_spin(200000);
	return thread_cpu_seconds() - start;
}

__attribute__((noinline)) void dispatch(double gamma, double delta, double used[2])
{
	used[0] = gamma_work(gamma);
	used[1] = delta_work(delta);
	sink += (unsigned long)used[0]; /* no tail call */
}

/* One dependent step of tiny's body; the empty asm keeps the compiler
 * from folding the steps into fewer. */
#define STEP(x, m, a) \
	do { \
		x = x * (m) + (a); \
		x ^= x >> 7; \
		__asm__ volatile("" : "+r"(x)); \
	} while (0)

__attribute__((noinline)) int tiny(int x)
{
	/* Sixteen dependent steps (~70 cycles), not one: where a timer
	 * interrupt is attributed depends on the processor — Intel's land on
	 * the instruction executing, AMD EPYC's on the instruction after it,
	 * which for a one-instruction function is the caller's, after the
	 * `call`, nearly always. With a body this long most samples land in
	 * tiny on any CPU, some in its prologue and epilogue (clang's frame
	 * setup). Still a leaf without a frame for gcc. */
	STEP(x, 3, 1);
	STEP(x, 5, 3);
	STEP(x, 7, 5);
	STEP(x, 9, 7);
	STEP(x, 11, 9);
	STEP(x, 13, 11);
	STEP(x, 15, 13);
	STEP(x, 17, 15);
	STEP(x, 3, 17);
	STEP(x, 5, 19);
	STEP(x, 7, 21);
	STEP(x, 9, 23);
	STEP(x, 11, 25);
	STEP(x, 13, 27);
	STEP(x, 15, 29);
	STEP(x, 17, 31);
	return x ^ (x >> 11);
}

__attribute__((noinline)) double tiny_loop(double seconds)
{
	double start = thread_cpu_seconds();
	int x = 1;
	while (thread_cpu_seconds() - start < seconds)
		for (int i = 0; i < 100000; i++)
			x = tiny(x);
	sink += x;
	return thread_cpu_seconds() - start;
}

__attribute__((noinline)) int cmp_ints(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

#define SORTED 4096

__attribute__((noinline)) double sort_work(double seconds)
{
	static int values[SORTED];
	unsigned seed = 1;
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds) {
		for (int i = 0; i < SORTED; i++)
			values[i] = (int)(seed = seed * 1103515245 + 12345);
		qsort(values, SORTED, sizeof(int), cmp_ints);
	}
	sink += values[0];
	return thread_cpu_seconds() - start;
}

__attribute__((noinline)) double clock_work(double seconds)
{
	double start = thread_cpu_seconds();
	struct timespec ts;
	while (thread_cpu_seconds() - start < seconds)
		for (int i = 0; i < 1000; i++) {
			clock_gettime(CLOCK_MONOTONIC, &ts); /* the vDSO, no syscall */
			sink += ts.tv_nsec;
		}
	return thread_cpu_seconds() - start;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "split")) {
		double used[2];
		dispatch(atof(argv[2]), atof(argv[3]), used);
		printf("gamma_work %.6f\ndelta_work %.6f\n", used[0], used[1]);
		return 0;
	}
	if (argc >= 3) {
		double seconds = atof(argv[2]), used;
		if (!strcmp(argv[1], "tiny"))
			used = tiny_loop(seconds);
		else if (!strcmp(argv[1], "qsort"))
			used = sort_work(seconds);
		else if (!strcmp(argv[1], "vdso"))
			used = clock_work(seconds);
		else
			goto usage;
		printf("%s %.6f\n", argv[1], used);
		return 0;
	}
usage:
	fprintf(stderr, "usage: %s split GAMMA DELTA | tiny|qsort|vdso SECONDS\n", argv[0]);
	return 2;
}
