// A Go service as `go build` makes it (no GNU build-ID, only Go's): burns
// CPU in heavyWork and lightWork, 3:1, for os.Args[1] seconds.
package main

import (
	"os"
	"strconv"
	"time"
)

var sink uint64

//go:noinline
func heavyWork(n int) {
	for i := 0; i < n; i++ {
		sink += uint64(i) * uint64(i)
	}
}

//go:noinline
func lightWork(n int) {
	for i := 0; i < n; i++ {
		sink ^= uint64(i)
	}
}

func main() {
	seconds := 8.0
	if len(os.Args) > 1 {
		if s, err := strconv.ParseFloat(os.Args[1], 64); err == nil {
			seconds = s
		}
	}
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	for time.Now().Before(deadline) {
		heavyWork(3000000)
		lightWork(1000000)
	}
}
