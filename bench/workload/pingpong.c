/* A context-switch-heavy workload for bench/agent-overhead.sh: PAIRS pairs
 * of threads hand one byte back and forth over two pipes each, every thread
 * blocking in read() until its partner writes: two switch-outs of a blocked
 * thread per round trip.
 *
 *   ./pingpong SECONDS [PAIRS]      prints "round trips/s N" (all pairs) */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

struct pair {
	int there[2], back[2];
	double seconds;
	long trips;
};

static void *echo(void *arg)
{
	struct pair *p = arg;
	char c;
	while (read(p->there[0], &c, 1) == 1)
		if (write(p->back[1], &c, 1) != 1)
			break;
	return NULL;
}

static double since(const struct timespec *start)
{
	struct timespec now;
	clock_gettime(CLOCK_MONOTONIC, &now);
	return (now.tv_sec - start->tv_sec) + (now.tv_nsec - start->tv_nsec) / 1e9;
}

static void *serve(void *arg)
{
	struct pair *p = arg;
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	char c = 'x';
	for (;;) {
		if (write(p->there[1], &c, 1) != 1 || read(p->back[0], &c, 1) != 1)
			exit(1);
		if (++p->trips % 1024 == 0 && since(&start) >= p->seconds)
			break;
	}
	close(p->there[1]); /* the echo thread's read() sees the end */
	return NULL;
}

int main(int argc, char **argv)
{
	double seconds = argc > 1 ? atof(argv[1]) : 10;
	int pairs = argc > 2 ? atoi(argv[2]) : 1;
	if (pairs < 1 || pairs > 64)
		return 2;
	struct pair p[64];
	pthread_t threads[128];
	struct timespec start;
	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int i = 0; i < pairs; i++) {
		p[i].seconds = seconds;
		p[i].trips = 0;
		if (pipe(p[i].there) || pipe(p[i].back))
			return 1;
		pthread_create(&threads[2 * i], NULL, echo, &p[i]);
		pthread_create(&threads[2 * i + 1], NULL, serve, &p[i]);
	}
	long trips = 0;
	for (int i = 0; i < pairs; i++) {
		pthread_join(threads[2 * i + 1], NULL);
		pthread_join(threads[2 * i], NULL);
		trips += p[i].trips;
	}
	printf("round trips/s %.0f\n", trips / since(&start));
	return 0;
}
