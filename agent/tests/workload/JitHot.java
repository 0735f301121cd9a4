// Test workload for JIT frames (issue #24): two hot methods, heavy burning
// three times as long as light, for the seconds given; prints how long
// each ran (ns). Run with -XX:+PreserveFramePointer.
public class JitHot {
    static double heavy(long nanos) {
        long end = System.nanoTime() + nanos;
        double s = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 2000; i++) s += Math.sqrt(i) * (i % 7);
        }
        return s;
    }

    static double light(long nanos) {
        long end = System.nanoTime() + nanos;
        double s = 0;
        while (System.nanoTime() < end) {
            for (int i = 0; i < 2000; i++) s += Math.sqrt(i) * (i % 5);
        }
        return s;
    }

    public static void main(String[] args) {
        long end = System.nanoTime() + (long) (Double.parseDouble(args[0]) * 1e9);
        long heavyNs = 0, lightNs = 0;
        double sink = 0;
        System.out.println("started");
        while (System.nanoTime() < end) {
            long t0 = System.nanoTime();
            sink += heavy(15_000_000);
            long t1 = System.nanoTime();
            sink += light(5_000_000);
            long t2 = System.nanoTime();
            heavyNs += t1 - t0;
            lightNs += t2 - t1;
        }
        System.out.println("heavy " + heavyNs + " light " + lightNs + " sink " + (sink > 0));
    }
}
