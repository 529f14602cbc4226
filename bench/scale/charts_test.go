package scale

import (
	"os"
	"path/filepath"
	"testing"
)

// A run of one fleet size (and a figure measured once) still charts: a
// logarithmic axis whose points share one value gets a range around it
// (a 10,000-cell-only run panicked writing its charts).
func TestChartsOfOnePoint(t *testing.T) {
	dir := t.TempDir()
	rep := &Report{Points: []Point{
		{Cells: 10000, Regions: 10, Topology: Hierarchical, Figures: &Figures{CycleP50Ms: 0.5, GlobalInboundBytesPerS: 4711, CPUSPerSPer1kCells: 0.088}},
		{Cells: 10000, Regions: 100, Topology: Hierarchical, Error: "start timeout"},
	}}
	if err := writeCharts(dir, rep); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"cycle.png", "inbound.png", "cpu.png", "death.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}
