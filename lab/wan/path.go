package wan

import (
	"errors"
	"net"
	"time"
)

// pathBindAttempts bounds the retries of NewPath when the UDP port that
// matches a kernel-chosen TCP port is taken.
const pathBindAttempts = 10

// Path is a TCP Proxy and a UDPProxy of one path listening on one port and
// driven together: what memberlist needs, as it uses one port for both
// protocols. Its methods act on both; the fields give each one's own
// (metrics, OpenConns).
type Path struct {
	TCP *Proxy
	UDP *UDPProxy
}

// NewPath binds cfg.Listen for TCP and the same port for UDP. With port 0
// it retries with a new port when the UDP side of the kernel's choice is
// taken.
func NewPath(cfg Config, deps Deps) (*Path, error) {
	for attempt := 1; ; attempt++ {
		tp, err := New(cfg, deps)
		if err != nil {
			return nil, err
		}
		ucfg := cfg
		ucfg.Listen = tp.Addr()
		up, err := NewUDP(ucfg, deps)
		if err == nil {
			return &Path{TCP: tp, UDP: up}, nil
		}
		tp.Stop()
		if errors.Is(err, ErrInvalidConfig) || !anyPort(cfg.Listen) || attempt == pathBindAttempts {
			return nil, err
		}
	}
}

// anyPort reports whether addr asks for a kernel-chosen port.
func anyPort(addr string) bool {
	_, port, err := net.SplitHostPort(addr)
	return err == nil && (port == "0" || port == "")
}

// Addr is the port both protocols listen on, host:port.
func (p *Path) Addr() string { return p.TCP.Addr() }

// Start starts both proxies; on failure neither runs.
func (p *Path) Start() error {
	if err := p.TCP.Start(); err != nil {
		return err
	}
	if err := p.UDP.Start(); err != nil {
		p.TCP.Stop()
		return err
	}
	return nil
}

// Stop stops both proxies and joins their goroutines. Idempotent.
func (p *Path) Stop() {
	p.TCP.Stop()
	p.UDP.Stop()
}

// SetDelay sets the delay and jitter of both protocols, or of neither
// when the values are refused.
func (p *Path) SetDelay(delay, jitter time.Duration) error {
	if err := validDelay(delay, jitter); err != nil {
		return err
	}
	_ = p.TCP.SetDelay(delay, jitter)
	_ = p.UDP.SetDelay(delay, jitter)
	return nil
}

// Delay returns the current one-way delay and jitter.
func (p *Path) Delay() (delay, jitter time.Duration) { return p.TCP.Delay() }

// Partition cuts or heals both protocols.
func (p *Path) Partition(on bool) {
	p.TCP.Partition(on)
	p.UDP.Partition(on)
}

// Partitioned reports whether the path is cut.
func (p *Path) Partitioned() bool { return p.TCP.Partitioned() }

// Reset closes every TCP connection and UDP session of the path.
func (p *Path) Reset() {
	p.TCP.Reset()
	p.UDP.Reset()
}

// SetTarget changes the far end of both protocols for later connections
// and sessions.
func (p *Path) SetTarget(target string) error {
	if err := validTarget(target); err != nil {
		return err
	}
	_ = p.TCP.SetTarget(target)
	_ = p.UDP.SetTarget(target)
	return nil
}
