package bench

import (
	"bufio"
	"bytes"
	"os"
	"runtime"
	"strconv"
)

// rssSourceProc and rssSourceRuntime name where RSS figures come from.
const (
	rssSourceProc    = "/proc/self/status VmRSS"
	rssSourceRuntime = "runtime (Sys - HeapReleased)"
)

// processStats is one reading of the process.
type processStats struct {
	rss, heapInuse uint64
	goroutines     int
	rssSource      string
}

// readProcessStats reads RSS from /proc/self/status (Linux) or, where that
// is missing, the Go runtime's estimate, and the heap and goroutine counts.
func readProcessStats() processStats {
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := processStats{heapInuse: ms.HeapInuse, goroutines: runtime.NumGoroutine()}
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		if rss, ok := parseVmRSS(b); ok {
			st.rss, st.rssSource = rss, rssSourceProc
			return st
		}
	}
	st.rss, st.rssSource = ms.Sys-ms.HeapReleased, rssSourceRuntime
	return st
}

// parseVmRSS extracts VmRSS (bytes) from the text of /proc/<pid>/status.
func parseVmRSS(status []byte) (uint64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(status))
	for sc.Scan() {
		rest, ok := bytes.CutPrefix(sc.Bytes(), []byte("VmRSS:"))
		if !ok {
			continue
		}
		f := bytes.Fields(rest)
		if len(f) != 2 || string(f[1]) != "kB" {
			return 0, false
		}
		kb, err := strconv.ParseUint(string(f[0]), 10, 64)
		if err != nil || kb > 1<<40 {
			return 0, false
		}
		return kb << 10, true
	}
	return 0, false
}
