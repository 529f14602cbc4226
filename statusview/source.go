package statusview

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
)

// Source is one debug API to read: a regional controller's or a global
// member's --metrics-listen address.
type Source struct {
	// Addr is the address as given, the name the report uses.
	Addr string
	// Base is scheme://host:port.
	Base string
}

// ParseSource turns host:port or http(s)://host:port into a Source. The
// error says what is wrong and what is wanted.
func ParseSource(addr string) (Source, error) {
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		switch {
		case err != nil:
			return Source{}, errors.New("not a URL; want host:port or http://host:port")
		case u.Scheme != "http" && u.Scheme != "https":
			return Source{}, fmt.Errorf("scheme %q: want http or https", u.Scheme)
		case u.Host == "" || u.Port() == "":
			return Source{}, errors.New("no host:port; want e.g. http://127.0.0.1:9090")
		case (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.User != nil:
			return Source{}, errors.New("give the address only, without path, query or user")
		}
		return Source{Addr: addr, Base: u.Scheme + "://" + u.Host}, nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" || port == "" {
		return Source{}, errors.New("want host:port, e.g. 127.0.0.1:9090")
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n == 0 {
		return Source{}, fmt.Errorf("port %q: want 1 to 65535", port)
	}
	return Source{Addr: addr, Base: "http://" + net.JoinHostPort(host, port)}, nil
}
