package reqclass

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/isobar-mesh/isobar/proto/isobarpb"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]struct {
		c  Criticality
		ok bool
	}{
		"": {Standard, true}, "critical": {Critical, true}, " Sheddable ": {Sheddable, true}, "STANDARD": {Standard, true},
		"urgent": {Standard, false}, "critical\x00": {Standard, false},
	} {
		c, ok := Parse(in)
		if c != want.c || ok != want.ok {
			t.Errorf("Parse(%q) = %v, %v: want %v, %v", in, c, ok, want.c, want.ok)
		}
	}
	for _, c := range All() {
		if got, ok := Parse(c.String()); !ok || got != c {
			t.Errorf("Parse(%q) = %v, %v", c, got, ok)
		}
		if FromProto(c.Proto()) != c {
			t.Errorf("%v does not survive the wire", c)
		}
	}
	if FromProto(isobarpb.Criticality_CRITICALITY_UNSPECIFIED) != Standard || FromProto(99) != Standard {
		t.Error("unspecified or unknown wire criticality is not standard")
	}
}

func TestFromPriorityAndLower(t *testing.T) {
	if FromPriority(-1) != Sheddable || FromPriority(0) != Standard || FromPriority(5) != Critical {
		t.Error("priority mapping: want <0 sheddable, 0 standard, >0 critical")
	}
	if Lower(Critical, Standard) != Standard || Lower(Sheddable, Standard) != Sheddable || Lower(Critical, Critical) != Critical {
		t.Error("Lower must pick the less important")
	}
}

func TestNormalizeTenant(t *testing.T) {
	long := strings.Repeat("é", MaxTenantLen) // 2 bytes each
	got, cut, bad := NormalizeTenant(long)
	if !cut || bad || len(got) > MaxTenantLen || !utf8.ValidString(got) {
		t.Errorf("long tenant: %q (%d bytes) cut %v bad %v", got, len(got), cut, bad)
	}
	if got, _, bad := NormalizeTenant("a\nb"); !bad || got != NoTenant {
		t.Errorf("control character: %q bad %v", got, bad)
	}
	if got, _, bad := NormalizeTenant("\xff"); !bad || got != NoTenant {
		t.Errorf("invalid UTF-8: %q bad %v", got, bad)
	}
	if got, cut, bad := NormalizeTenant("  acme-eu "); got != "acme-eu" || cut || bad {
		t.Errorf("plain tenant: %q %v %v", got, cut, bad)
	}
}

func TestTenantsBound(t *testing.T) {
	ts := NewTenants(2)
	for _, c := range []struct {
		in, want string
		pooled   bool
	}{{"a", "a", false}, {"b", "b", false}, {"c", OtherTenant, true}, {"a", "a", false}, {NoTenant, NoTenant, false}, {"d", OtherTenant, true}} {
		got, pooled := ts.Bucket(c.in)
		if got != c.want || pooled != c.pooled {
			t.Errorf("Bucket(%q) = %q, %v: want %q, %v", c.in, got, pooled, c.want, c.pooled)
		}
	}
}

func FuzzNormalizeTenant(f *testing.F) {
	f.Add("acme")
	f.Add(strings.Repeat("x", 100))
	f.Fuzz(func(t *testing.T, s string) {
		got, _, bad := NormalizeTenant(s)
		if len(got) > MaxTenantLen || !utf8.ValidString(got) || (bad && got != NoTenant) {
			t.Fatalf("NormalizeTenant(%q) = %q bad %v", s, got, bad)
		}
	})
}
