package xdsclient

import (
	"strconv"
	"strings"
)

// HeaderView is the request as the route matcher sees it: lower-case header
// names to values (several values joined by ","), plus the pseudo-headers
// ":path", ":method", ":authority" and ":scheme".
type HeaderView interface {
	Header(name string) (value string, ok bool)
}

// matches reports whether the request matches the route's path and every
// header matcher, as Envoy evaluates them.
func (m *routeMatch) matches(path string, h HeaderView) bool {
	if !m.path.matches(path) {
		return false
	}
	for i := range m.headers {
		if !m.headers[i].matches(h) {
			return false
		}
	}
	return true
}

// matches checks the path: a prefix against the whole path (query
// included), an exact path or a regex against the path without its query,
// as Envoy does.
func (p *pathMatcher) matches(path string) bool {
	noQuery := path
	if i := strings.IndexByte(path, '?'); i >= 0 {
		noQuery = path[:i]
	}
	switch p.kind {
	case matchRegex:
		return p.re.MatchString(noQuery)
	case matchExact:
		if p.caseSensitive {
			return noQuery == p.value
		}
		return strings.ToLower(noQuery) == p.value
	default:
		target := path
		if p.sep {
			target = noQuery
		}
		if !p.caseSensitive {
			target = strings.ToLower(target)
		}
		if !strings.HasPrefix(target, p.value) {
			return false
		}
		if p.sep {
			rest := target[len(p.value):]
			return rest == "" || rest[0] == '/'
		}
		return true
	}
}

// matches evaluates one header matcher with Envoy's semantics: a present
// matcher compares presence with present_match (then invert); any other
// matcher fails on a missing header unless treat_missing_header_as_empty,
// and a failing match is inverted too (so an inverted matcher matches a
// missing header).
func (m *headerMatcher) matches(h HeaderView) bool {
	v, ok := h.Header(m.name)
	if m.kind == matchPresent {
		return (ok == m.present) != m.invert
	}
	if !ok {
		if !m.treatMissingAsEmpty {
			return m.invert
		}
		v = ""
	}
	return m.matchValue(v) != m.invert
}

func (m *headerMatcher) matchValue(v string) bool {
	if m.ignoreCase {
		v = strings.ToLower(v)
	}
	switch m.kind {
	case matchExact:
		return v == m.value
	case matchPrefix:
		return strings.HasPrefix(v, m.value)
	case matchSuffix:
		return strings.HasSuffix(v, m.value)
	case matchContains:
		return strings.Contains(v, m.value)
	case matchRegex:
		return m.re.MatchString(v)
	case matchRange:
		// The whole value must be a base-10 integer with an optional sign.
		n, err := strconv.ParseInt(v, 10, 64)
		return err == nil && n >= m.start && n < m.end
	}
	return false
}

// SelectVirtualHost picks the virtual host for host (the Host header, lower
// case, port included as Envoy leaves it by default) as Envoy does: an
// exact domain, then the longest suffix wildcard ("*.example.com"), then
// the longest prefix wildcard ("foo.*"), then "*".
func SelectVirtualHost(vhs []VirtualHost, host string) *VirtualHost {
	var suffix, prefix, any *VirtualHost
	suffixLen, prefixLen := -1, -1
	for i := range vhs {
		for _, d := range vhs[i].Domains {
			switch {
			case d == host:
				return &vhs[i]
			case d == "*":
				if any == nil {
					any = &vhs[i]
				}
			case strings.HasPrefix(d, "*"):
				if s := d[1:]; len(s) < len(host) && strings.HasSuffix(host, s) && len(s) > suffixLen {
					suffix, suffixLen = &vhs[i], len(s)
				}
			case strings.HasSuffix(d, "*"):
				if p := d[:len(d)-1]; len(p) < len(host) && strings.HasPrefix(host, p) && len(p) > prefixLen {
					prefix, prefixLen = &vhs[i], len(p)
				}
			}
		}
	}
	switch {
	case suffix != nil:
		return suffix
	case prefix != nil:
		return prefix
	}
	return any
}

// MatchRoute returns the first route of vh matching the request, or nil.
func MatchRoute(vh *VirtualHost, path string, h HeaderView) *Route {
	for i := range vh.Routes {
		if vh.Routes[i].match.matches(path, h) {
			return &vh.Routes[i]
		}
	}
	return nil
}
