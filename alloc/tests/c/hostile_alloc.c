/* What a hostile process does to the agent's shared memory-profiling state
 * (issue #37):
 *
 *   hostile_alloc hold N SECONDS
 *       under the preload library sampling every allocation: prints
 *       "loaded", waits for a line on stdin (the agent attaches to the
 *       library's probes meanwhile), keeps N blocks live (allocated at a
 *       pace the agent records whole), prints "ready" and sleeps: it would
 *       take every slot of the agent's live-allocation map
 *   hostile_alloc libs N SECONDS COPY...
 *       dlopens the libraries COPY... (each with 64 otel_memory probe
 *       sites), then sleeps: it would take every probe slot of the host
 *
 * Prints "ready" once done, then sleeps SECONDS. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void *volatile *blocks;

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc >= 4 && !strcmp(argv[1], "hold")) {
		long n = atol(argv[2]);
		char line[16];
		printf("loaded\n");
		if (!fgets(line, sizeof line, stdin))
			return 1;
		blocks = calloc(n, sizeof *blocks);
		struct timespec pace = {0, 100 * 1000};
		for (long i = 0; i < n; i++) {
			blocks[i] = malloc(64);
			if (i % 64 == 63)
				nanosleep(&pace, NULL);
		}
		printf("ready\n");
		sleep(atoi(argv[3]));
		return 0;
	}
	if (argc >= 4 && !strcmp(argv[1], "libs")) {
		int loaded = 0;
		for (int i = 4; i < argc; i++)
			loaded += dlopen(argv[i], RTLD_NOW | RTLD_LOCAL) != NULL;
		printf("ready %d\n", loaded);
		sleep(atoi(argv[3]));
		return 0;
	}
	fprintf(stderr, "usage: hostile_alloc hold N SECONDS | libs N SECONDS COPY...\n");
	return 1;
}
