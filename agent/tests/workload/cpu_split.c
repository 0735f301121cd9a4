/* Test workload: two threads, each burning a given amount of its own CPU
 * time (CLOCK_THREAD_CPUTIME_ID, not wall time) in a function of its own,
 * alpha_work and beta_work; prints the thread CPU times it measured.
 * An optional third argument burns that much CPU time in warm_up first;
 * "-" burns in warm_up until a line arrives on stdin (for a profiler that
 * learns of a process some time after it starts: the test lets it go once
 * the profiler's samples of warm_up arrived).
 * Build: clang -O1 -g -fno-omit-frame-pointer -mno-omit-leaf-frame-pointer
 *        -fno-optimize-sibling-calls -pthread */
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static void spin(void)
{
	for (int i = 0; i < 100000; i++)
		sink += i;
}

__attribute__((noinline)) void alpha_work(double seconds, double *used)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		spin();
	*used = thread_cpu_seconds() - start;
}

__attribute__((noinline)) void beta_work(double seconds, double *used)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		spin();
	*used = thread_cpu_seconds() - start;
}

/* Burns `seconds` of this thread's CPU time before the measured work: a
 * profiler that learns of a process some time after it starts (the
 * OpenTelemetry eBPF profiler) sees the whole of the measured part. */
__attribute__((noinline)) void warm_up(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		spin();
}

/* Burns in warm_up until a line (or the end) arrives on stdin. */
static void warm_up_until_told(void)
{
	struct pollfd in = {.fd = 0, .events = POLLIN};
	while (poll(&in, 1, 0) == 0)
		warm_up(0.001);
	char line[16];
	if (!fgets(line, sizeof(line), stdin))
		line[0] = 0;
}

struct job {
	void (*work)(double, double *);
	double seconds, used;
};

static void *run(void *arg)
{
	struct job *j = arg;
	j->work(j->seconds, &j->used);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 3 && argc != 4) {
		fprintf(stderr, "usage: %s ALPHA_CPU_SECONDS BETA_CPU_SECONDS [WARM_UP_CPU_SECONDS]\n",
			argv[0]);
		return 2;
	}
	if (argc == 4 && strcmp(argv[3], "-") == 0)
		warm_up_until_told();
	else if (argc == 4)
		warm_up(atof(argv[3]));
	struct job jobs[2] = {{alpha_work, atof(argv[1]), 0}, {beta_work, atof(argv[2]), 0}};
	pthread_t threads[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&threads[i], NULL, run, &jobs[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(threads[i], NULL);
	printf("alpha_work %.6f\nbeta_work %.6f\n", jobs[0].used, jobs[1].used);
	return 0;
}
