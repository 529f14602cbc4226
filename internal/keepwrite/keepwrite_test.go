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

func TestResizeKeepsTheElements(t *testing.T) {
	s := []pair{{"a", 1}, {"b", 2}, {"c", 3}}
	short := Resize(s, 2)
	if len(short) != 2 || short[1] != (pair{"b", 2}) {
		t.Fatalf("Resize to 2 = %v", short)
	}
	long := Resize(s[:2:2], 5) // no room: grown
	if len(long) != 5 || long[0] != (pair{"a", 1}) || long[1] != (pair{"b", 2}) || long[2] != (pair{}) {
		t.Fatalf("Resize of a full slice to 5 = %v, want its two elements then zeros", long)
	}
	if back := Resize(short, 3); back[2] != (pair{"c", 3}) {
		t.Fatalf("Resize within the capacity = %v, want what the array held", back)
	}
}
