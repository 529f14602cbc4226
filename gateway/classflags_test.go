package gateway

import (
	"testing"
	"time"

	"github.com/isobar-mesh/isobar/reqclass"
)

func TestParseObjectivePriority(t *testing.T) {
	got, err := ParseObjectivePriority(" chat=10, batch=-1,default=0")
	if err != nil || len(got) != 3 || got["chat"] != 10 || got["batch"] != -1 || got["default"] != 0 {
		t.Fatalf("%v %v", got, err)
	}
	for _, bad := range []string{"chat", "=1", "chat=x", "a=1,a=2", "a b=1", "x=99999999999"} {
		if _, err := ParseObjectivePriority(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestParseQueueFlags(t *testing.T) {
	l := [reqclass.Count]int{1, 2, 3}
	if err := ParseQueueLengths("sheddable=0, critical=9", &l); err != nil || l != [reqclass.Count]int{9, 2, 0} {
		t.Fatalf("%v %v", l, err)
	}
	a := [reqclass.Count]time.Duration{}
	if err := ParseQueueAges("standard=1.5s", &a); err != nil || a[reqclass.Standard] != 1500*time.Millisecond {
		t.Fatalf("%v %v", a, err)
	}
	for _, bad := range []string{"urgent=1", "critical=-1", "critical", "critical=1,critical=2", "=3"} {
		if err := ParseQueueLengths(bad, &l); err == nil {
			t.Errorf("lengths %q accepted", bad)
		}
	}
	set := [reqclass.Count]bool{true, false, true}
	if err := ParseQueueClasses("", &set); err != nil || set != [reqclass.Count]bool{true, false, true} {
		t.Fatalf("empty list changed the set: %v %v", set, err)
	}
	if err := ParseQueueClasses(" Standard ,sheddable", &set); err != nil || set != [reqclass.Count]bool{false, true, true} {
		t.Fatalf("%v %v", set, err)
	}
	if err := ParseQueueClasses("none", &set); err != nil || set != [reqclass.Count]bool{} {
		t.Fatalf("none: %v %v", set, err)
	}
	for _, bad := range []string{"urgent", "standard,standard", "standard,", "none,critical"} {
		if err := ParseQueueClasses(bad, &set); err == nil {
			t.Errorf("classes %q accepted", bad)
		}
	}
	for _, bad := range []string{"critical=0s", "standard=soon"} {
		if err := ParseQueueAges(bad, &a); err == nil {
			t.Errorf("ages %q accepted", bad)
		}
	}
}

// FuzzClassFlags: the class flags' parsers never panic and what they
// accept is in range.
func FuzzClassFlags(f *testing.F) {
	for _, s := range []string{"chat=1,batch=-1", "critical=10,standard=0", "sheddable=2s", "", ",,", "a==b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if m, err := ParseObjectivePriority(s); err == nil && len(m) > 1024 {
			t.Fatalf("%d objectives", len(m))
		}
		var l [reqclass.Count]int
		if err := ParseQueueLengths(s, &l); err == nil {
			for _, n := range l {
				if n < 0 {
					t.Fatalf("negative length %v", l)
				}
			}
		}
		var set [reqclass.Count]bool
		_ = ParseQueueClasses(s, &set) // never panics
		var a [reqclass.Count]time.Duration
		if err := ParseQueueAges(s, &a); err == nil {
			for _, d := range a {
				if d < 0 {
					t.Fatalf("negative age %v", a)
				}
			}
		}
	})
}
