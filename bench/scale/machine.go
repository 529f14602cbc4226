package scale

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"
)

// Machine describes where a run ran.
type Machine struct {
	GOOS        string `json:"goos"`
	GOARCH      string `json:"goarch"`
	NumCPU      int    `json:"num_cpu"`
	GOMAXPROCS  int    `json:"gomaxprocs"`
	CPUModel    string `json:"cpu_model"`
	MemoryBytes uint64 `json:"memory_bytes"`
	GoVersion   string `json:"go_version"`
	Kernel      string `json:"kernel,omitempty"`
}

// describeMachine reads what it can; fields it cannot read stay empty.
func describeMachine() Machine {
	m := Machine{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, NumCPU: runtime.NumCPU(),
		GOMAXPROCS: runtime.GOMAXPROCS(0), GoVersion: runtime.Version()}
	m.CPUModel = procField("/proc/cpuinfo", "model name")
	if kb := procField("/proc/meminfo", "MemTotal"); kb != "" {
		if v, err := strconv.ParseUint(strings.Fields(kb)[0], 10, 64); err == nil {
			m.MemoryBytes = v << 10
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	return m
}

// procField is the value of the first "key: value" line of a /proc file.
func procField(path, key string) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// rssBytes is the process's resident set (VmRSS), or the Go runtime's
// estimate where /proc is missing.
func rssBytes() uint64 {
	if kb := procField("/proc/self/status", "VmRSS"); kb != "" {
		if v, err := strconv.ParseUint(strings.Fields(kb)[0], 10, 64); err == nil {
			return v << 10
		}
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.Sys - ms.HeapReleased
}
