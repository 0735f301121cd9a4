/* The "vendor" unit of cfi_cases.c: built with -O2 -fomit-frame-pointer,
 * as vendor code often is — two frameless levels, the inner one using
 * %rbp as a general register — calling framed code back. */
static volatile unsigned long vendor_sink;
void framed_cb(void);

__attribute__((noinline)) void vendor_inner(int r)
{
	/* Enough live values that the compiler takes %rbp too. */
	unsigned long a = r, b = r * 3, c = r * 5, d = r * 7, e = r * 11, f = r * 13, g = r * 17;
	for (int i = 0; i < 1000; i++) {
		a += b ^ i;
		b += c ^ a;
		c += d ^ b;
		d += e ^ c;
		e += f ^ d;
		f += g ^ e;
		g += a ^ f;
	}
	vendor_sink += a + b + c + d + e + f + g;
	framed_cb();
	vendor_sink += a * b + c * d + e * f + g;
}

__attribute__((noinline)) void vendor_outer(int rounds)
{
	for (int r = 0; r < rounds; r++) {
		vendor_sink += r;
		vendor_inner(r);
	}
}
