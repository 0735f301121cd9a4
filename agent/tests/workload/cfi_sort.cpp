// std::sort with a comparator (issue #40), for agent/tests/cfi.rs: built
// with plain g++ -O2 (no frame-pointer flags at all), so the program's own
// code, std::sort's instantiation included, is frameless; the comparator
// is called from libstdc++'s introsort templates.
//   cfi_sort SECONDS     main -> sort_work -> std::sort... -> by_key
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <vector>

static volatile unsigned long sink;

static double cpu_now()
{
	timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) bool by_key(int a, int b)
{
	for (int i = 0; i < 20; i++)
		sink += i;
	return a < b;
}

__attribute__((noinline)) double sort_work(double seconds)
{
	std::vector<int> v(4096);
	double start = cpu_now();
	while (cpu_now() - start < seconds) {
		for (int i = 0; i < 4096; i++)
			v[i] = (i * 7919) % 4096;
		std::sort(v.begin(), v.end(), by_key);
	}
	return cpu_now() - start;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		std::fprintf(stderr, "usage: %s SECONDS\n", argv[0]);
		return 2;
	}
	std::printf("sort %.6f\n", sort_work(std::atof(argv[1])));
	return 0;
}
