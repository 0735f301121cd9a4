/* A service as a vendor ships it: a symbol table, no debug info, never
 * uploaded by any CI (the publish test strips its DWARF before running it).
 * Burns CPU in publish_heavy and publish_light, 3:1, for argv[1] seconds. */
#include <stdlib.h>
#include <time.h>

static volatile unsigned long sink;

#ifdef PAD_BYTES
/* Read-only data that makes the file large (its code stays small). */
const unsigned char publish_pad[PAD_BYTES] = {1};
#endif

__attribute__((noinline)) void publish_heavy(long n)
{
  for (long i = 0; i < n; i++)
    sink += (unsigned long)i * (unsigned long)i;
}

__attribute__((noinline)) void publish_light(long n)
{
  for (long i = 0; i < n; i++)
    sink ^= (unsigned long)i;
}

static double now(void)
{
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
  double seconds = argc > 1 ? atof(argv[1]) : 8.0;
  double start = now();
  while (now() - start < seconds) {
    publish_heavy(3000000);
    publish_light(1000000);
  }
  return 0;
}
