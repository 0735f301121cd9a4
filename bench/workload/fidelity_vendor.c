/* The "vendor" unit of bench/workload/fidelity.c: built with -O2
 * -fomit-frame-pointer, as vendor code often is; calls framed code back. */
static volatile unsigned long vendor_sink;
void framed_cb(void);

__attribute__((noinline)) void vendor_work(int rounds)
{
	for (int r = 0; r < rounds; r++) {
		for (int i = 0; i < 2000; i++)
			vendor_sink += (unsigned long)i ^ r;
		framed_cb();
	}
}
