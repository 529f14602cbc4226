package gateway

import "github.com/isobar-mesh/isobar/gateway/xdsclient"

// retriesStatus reports whether status is retried under p.
func retriesStatus(p *xdsclient.RetryPolicy, status int) bool {
	switch {
	case p.Any5xx && status >= 500 && status <= 599:
		return true
	case p.GatewayError && (status == 502 || status == 503 || status == 504):
		return true
	}
	for _, c := range p.StatusCodes {
		if int(c) == status {
			return true
		}
	}
	return false
}

// retriesLocal reports whether a local-origin failure (connect failure,
// reset, refused stream) of the given kind is retried.
func retriesLocal(p *xdsclient.RetryPolicy, kind failureKind) bool {
	switch kind {
	case failConnect:
		return p.ConnectFailure || p.Any5xx || p.GatewayError
	case failReset:
		return p.Reset || p.Any5xx || p.GatewayError
	}
	return false
}
