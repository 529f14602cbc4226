package promreg

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRegisterAllOrNothing(t *testing.T) {
	reg := prometheus.NewRegistry()
	a := prometheus.NewCounter(prometheus.CounterOpts{Name: "a_total", Help: "a"})
	b := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := Register(reg, b); err != nil {
		t.Fatal(err)
	}
	// a registers, then b's name collides: a must be unregistered again.
	b2 := prometheus.NewCounter(prometheus.CounterOpts{Name: "b_total", Help: "b"})
	if err := Register(reg, a, b2); err == nil {
		t.Fatal("a duplicate registered without an error")
	}
	if err := Register(reg, a); err != nil {
		t.Errorf("a was left registered after the failed call: %v", err)
	}
	if err := Register(nil, a, b); err != nil {
		t.Errorf("nil registerer: %v", err)
	}
}

func TestNewRuntime(t *testing.T) {
	reg, err := NewRuntime()
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, mf := range mfs {
		names[mf.GetName()] = true
	}
	if !names["go_goroutines"] {
		t.Errorf("no go_goroutines among %d families", len(mfs))
	}
}
