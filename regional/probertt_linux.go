//go:build linux

package regional

import (
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// kernelRTT is the round trip of conn's TCP handshake as the kernel
// measured it: Linux samples the RTT when the SYN-ACK acknowledges the SYN
// (tcp_input.c: tcp_clean_rtx_queue → tcp_ack_update_rtt) and reports
// the smoothed value, in microseconds, as tcpi_rtt of TCP_INFO
// (include/uapi/linux/tcp.h), the figure `ss -i` prints. Right after
// connect it is that one sample. It excludes the time the prober's
// goroutine waited to run after the kernel completed the connect, which on
// a busy controller is most of a LAN connect's wall time.
//
// ok is false when conn is not TCP, the kernel has no sample, or anything
// was retransmitted (a resent SYN: the handshake's wall time, loss
// included, is then the honest figure).
func kernelRTT(conn net.Conn) (rtt time.Duration, ok bool) {
	tc, isTCP := conn.(*net.TCPConn)
	if !isTCP {
		return 0, false
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || err != nil || info.Rtt == 0 || info.Total_retrans != 0 {
		return 0, false
	}
	return time.Duration(info.Rtt) * time.Microsecond, true
}
