//go:build !linux

package regional

import (
	"net"
	"time"
)

// kernelRTT has no kernel figure off Linux: the prober times the connect.
func kernelRTT(net.Conn) (time.Duration, bool) { return 0, false }
