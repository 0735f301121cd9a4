/* Loads libraw_ctx.so (raw_lib.c) with dlopen after DELAY seconds — long
 * after the agent read the process — so its slot is in dynamic TLS,
 * reached through each thread's DTV. A thread started before the dlopen
 * publishes SPAN_B and burns SECONDS in lib_thread_work (its DTV is the
 * one glibc must grow); the main thread publishes SPAN_A and burns SECONDS
 * in lib_user_work.
 *
 *   raw_dlopen_main LIB TRACE SPAN_A SPAN_B SECONDS DELAY */
#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "otep4947_test.h"

typedef void (*enter_fn)(const uint8_t trace_id[16], const uint8_t span_id[8]);

static enter_fn lib_enter;
static uint8_t trace[16], span_a[8], span_b[8];
static double seconds;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t loaded = PTHREAD_COND_INITIALIZER;

__attribute__((noinline)) void lib_user_work(double s)
{
	burn_cpu(s);
}

__attribute__((noinline)) void lib_thread_work(double s)
{
	burn_cpu(s);
}

static void *thread_main(void *arg)
{
	(void)arg;
	pthread_mutex_lock(&lock);
	while (!lib_enter)
		pthread_cond_wait(&loaded, &lock);
	pthread_mutex_unlock(&lock);
	lib_enter(trace, span_b);
	lib_thread_work(seconds);
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc != 7)
		return 2;
	from_hex(argv[2], trace, 16);
	from_hex(argv[3], span_a, 8);
	from_hex(argv[4], span_b, 8);
	seconds = atof(argv[5]);
	pthread_t thread;
	pthread_create(&thread, NULL, thread_main, NULL);
	usleep((useconds_t)(atof(argv[6]) * 1e6));
	void *lib = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!lib) {
		fprintf(stderr, "%s\n", dlerror());
		return 1;
	}
	pthread_mutex_lock(&lock);
	lib_enter = (enter_fn)dlsym(lib, "raw_lib_enter");
	pthread_cond_broadcast(&loaded);
	pthread_mutex_unlock(&lock);
	if (!lib_enter)
		return 1;
	lib_enter(trace, span_a);
	lib_user_work(seconds);
	pthread_join(thread, NULL);
	printf("done\n");
	return 0;
}
