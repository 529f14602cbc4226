package cellagent

import (
	"testing"
	"time"
)

func BenchmarkParseVLLM(b *testing.B) {
	page := readFixture(b, "vllm_v1_dp2.prom")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseVLLM(page, VLLMOptions{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseDCGM(b *testing.B) {
	page := readFixture(b, "dcgm_2gpu.prom")
	b.SetBytes(int64(len(page)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := ParseDCGM(page, "1"); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWindowDerive: one scrape's window update and derivation.
func BenchmarkWindowDerive(b *testing.B) {
	s, err := ParseVLLM(readFixture(b, "vllm_v1_dp2.prom"), VLLMOptions{})
	if err != nil {
		b.Fatal(err)
	}
	w := window{span: 10 * time.Second}
	t0 := time.Unix(1_700_000_000, 0)
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		w.add(t0.Add(time.Duration(i)*500*time.Millisecond), s)
		_ = w.derive()
	}
}
