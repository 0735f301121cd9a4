/* Stack-fidelity workload of bench/peer-agents.sh: burns CPU until killed
 * in one of four shapes (argv[1]), each reached from main through
 * main_loop:
 *   leaf    main_loop -> framed_leaf                 (a leaf function)
 *   vendor  main_loop -> vendor_work -> framed_cb    (vendor_work is in
 *           fidelity_vendor.c, built with -O2 -fomit-frame-pointer)
 *   qsort   main_loop -> glibc qsort -> cmp_ints     (a libc callback)
 *   zlib    main_loop -> zwork -> zlib's crc32       (time in libz)
 * Built once with clang and frame pointers everywhere, and once with gcc
 * -O2 -momit-leaf-frame-pointer (frameless leaves); see the script. */
#include <stdlib.h>
#include <string.h>

static volatile unsigned long sink;

/* zlib's crc32, declared here so that no zlib headers are needed (the
 * script links libz.so.1 itself). */
unsigned long crc32(unsigned long crc, const unsigned char *buf, unsigned len);
void vendor_work(int rounds);

__attribute__((noinline)) void framed_leaf(void)
{
	for (int i = 0; i < 200000; i++)
		sink += (unsigned long)i * i;
}

__attribute__((noinline)) void framed_cb(void)
{
	for (int i = 0; i < 2000; i++)
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

__attribute__((noinline)) void main_loop(const char *mode)
{
	static int values[4096];
	static unsigned char bytes[1 << 16];
	memset(bytes, 7, sizeof bytes);
	for (;;) {
		if (!strcmp(mode, "leaf")) {
			framed_leaf();
		} else if (!strcmp(mode, "vendor")) {
			vendor_work(100);
		} else if (!strcmp(mode, "qsort")) {
			for (int i = 0; i < 4096; i++)
				values[i] = (i * 7919) % 4096;
			qsort(values, 4096, sizeof values[0], cmp_ints);
		} else {
			zwork(bytes, sizeof bytes);
		}
	}
}

int main(int argc, char **argv)
{
	main_loop(argc > 1 ? argv[1] : "leaf");
	return 0;
}
