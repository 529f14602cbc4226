package statusview

import (
	"strings"
	"testing"
)

func TestParseSource(t *testing.T) {
	for _, tc := range []struct {
		addr, base string
	}{
		{"127.0.0.1:9090", "http://127.0.0.1:9090"},
		{"localhost:1", "http://localhost:1"},
		{"[::1]:9090", "http://[::1]:9090"},
		{"http://127.0.0.1:9090", "http://127.0.0.1:9090"},
		{"https://ctl.example:8443/", "https://ctl.example:8443"},
	} {
		s, err := ParseSource(tc.addr)
		if err != nil || s.Base != tc.base || s.Addr != tc.addr {
			t.Errorf("ParseSource(%q) = %+v, %v; want base %q", tc.addr, s, err, tc.base)
		}
	}
	for _, tc := range []struct {
		addr, want string
	}{
		{"localhost", "want host:port"},
		{"", "want host:port"},
		{":9090", "want host:port"},
		{"127.0.0.1:99999", `port "99999"`},
		{"127.0.0.1:0", `port "0"`},
		{"127.0.0.1:http", `port "http"`},
		{"ftp://127.0.0.1:21", `scheme "ftp"`},
		{"http://127.0.0.1:9090/debug/cells", "without path"},
		{"http://127.0.0.1:9090?x=1", "without path"},
		{"http://u:p@127.0.0.1:9090", "without path"},
		{"http://127.0.0.1", "no host:port"},
		{"http://%zz", "not a URL"},
	} {
		if _, err := ParseSource(tc.addr); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseSource(%q): error %v, want one containing %q", tc.addr, err, tc.want)
		}
	}
}
