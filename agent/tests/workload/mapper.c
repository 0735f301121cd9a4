/* Test workload for the agent's safe file opens (agent/tests/containers.rs):
 * maps FILE executable (unless FILE is "-"), says "ready", then burns
 * SECONDS of thread CPU time in spin_work.
 *   mapper FILE SECONDS */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

static volatile unsigned long sink;

static double thread_cpu_seconds(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) void spin_work(double seconds)
{
	double start = thread_cpu_seconds();
	while (thread_cpu_seconds() - start < seconds)
		for (int i = 0; i < 100000; i++)
			sink += i;
}

int main(int argc, char **argv)
{
	if (argc != 3) {
		fprintf(stderr, "usage: %s FILE|- SECONDS\n", argv[0]);
		return 2;
	}
	if (strcmp(argv[1], "-")) {
		int fd = open(argv[1], O_RDONLY);
		struct stat st;
		if (fd < 0 || fstat(fd, &st) || mmap(NULL, st.st_size, PROT_READ | PROT_EXEC,
						     MAP_PRIVATE, fd, 0) == MAP_FAILED) {
			perror(argv[1]);
			return 1;
		}
	}
	printf("ready\n");
	fflush(stdout);
	spin_work(atof(argv[2]));
	return 0;
}
