// Test workload for JIT frames (issue #24): two hot methods, heavy burning
// three times as long as light. Burns until a line arrives on stdin (the
// test has written the perf map by then), then for the CPU seconds given
// (its own thread's CPU time, so a busy machine makes it run longer, not
// sample less); prints how much CPU each method used then (ns) and the
// whole. Run with -XX:+PreserveFramePointer.
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

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

    public static void main(String[] args) throws Exception {
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        long budget = (long) (Double.parseDouble(args[0]) * 1e9);
        double sink = 0;
        System.out.println("started");
        while (System.in.available() == 0) {
            sink += heavy(15_000_000);
            sink += light(5_000_000);
        }
        long start = threads.getCurrentThreadCpuTime();
        long heavyNs = 0, lightNs = 0, now = start;
        while (now - start < budget) {
            long t0 = now;
            sink += heavy(15_000_000);
            long t1 = threads.getCurrentThreadCpuTime();
            sink += light(5_000_000);
            now = threads.getCurrentThreadCpuTime();
            heavyNs += t1 - t0;
            lightNs += now - t1;
        }
        System.out.println("heavy " + heavyNs + " light " + lightNs + " cpu " + (now - start) + " sink " + (sink > 0));
    }
}
