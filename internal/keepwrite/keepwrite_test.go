package keepwrite

import "testing"

type pair struct {
	name string
	n    int
}

func TestSet(t *testing.T) {
	x := pair{"a", 1}
	if Set(&x, pair{"a", 1}) {
		t.Fatal("Set stored a value equal to the one held")
	}
	if !Set(&x, pair{"a", 2}) || x != (pair{"a", 2}) {
		t.Fatalf("Set did not store a changed value: %v", x)
	}
}

func TestAppendReusesWhatTheBufferHeld(t *testing.T) {
	buf := []pair{{"a", 1}, {"b", 2}}
	s := Append(buf[:0], pair{"a", 1})
	s = Append(s, pair{"c", 3})
	s = Append(s, pair{"d", 4}) // beyond the capacity: a plain append
	want := []pair{{"a", 1}, {"c", 3}, {"d", 4}}
	if len(s) != len(want) {
		t.Fatalf("Append gave %v, want %v", s, want)
	}
	for i := range want {
		if s[i] != want[i] {
			t.Fatalf("Append gave %v, want %v", s, want)
		}
	}
	if buf[1] != (pair{"c", 3}) {
		t.Fatalf("Append within capacity did not write the shared array: %v", buf)
	}
}
